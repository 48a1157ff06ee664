"""Where users run: torch reached through a `--system-site-packages` venv over a preinstalled torch, a
.pth-linked site tree and PYTHONPATH plans and verifies a case with the same keys as this interpreter's
own environment (every stage cached, no entry added); an edit to a kernel's helper in an
editable-installed user package re-runs its stages. Real interpreters, real doit, in a checkout copy.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from project import ROOT, Project, base_install, fresh_venv, package_view

from golden_tasks.model.origin import PROJECT_ENV
from golden_tasks.pipeline import stage_table

pytestmark = pytest.mark.e2e
STAGES = tuple(s.name for s in stage_table.STAGES if s.per_case)  # the table's columns
# torch is a library wherever it is found; the kernel module, its project's, is user code
WHOSE = ("import torch, kernels.hello_world; from golden_tasks.model.origin import is_user_module; "
         "print(is_user_module('torch'), is_user_module('numpy'), is_user_module('kernels.hello_world'))")


def _without_projects(env: dict) -> dict:
    """`env` without the projects this test process registered (golden_tasks.model.origin): a run in
    another project knows its own."""
    return {k: v for k, v in env.items() if k != PROJECT_ENV}


def _run(python, project: Project, *args, env=None):
    return subprocess.run([str(python), *args], cwd=project.path, capture_output=True, text=True, timeout=900,
                          env=_without_projects({**project.env, **(env or {})}))


def _row(stdout: str, case: str) -> list:
    """The summary table's row of `case`: status, then one word per stage."""
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [case]]
    assert rows, stdout
    return rows[-1][1:2 + len(STAGES)]


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """A checkout-like project (dodo.py, golden_tasks, hello_world) whose case this interpreter verified
    once (eager: no code generation, the kernel pickled by value), and the entries that made."""
    project = Project(tmp_path_factory.mktemp("environments") / "checkout", modules=["hello_world"])
    shutil.copytree(ROOT / "golden_tasks", project.path / "golden_tasks",
                    ignore=shutil.ignore_patterns("__pycache__"))  # found first on sys.path, as in a checkout
    run = _run(sys.executable, project, "-m", "doit", "verify:hello_world", "backend=eager")
    assert run.returncode == 0 and _row(run.stdout, "hello_world") == ["PASS", *["ran"] * len(STAGES)], \
        run.stdout + run.stderr
    return project, sorted(project.cache.glob("entries/*/*/*.json"))


def _system_site_packages(tmp_path: Path):
    return fresh_venv(tmp_path / "venv", system_site_packages=True, python=base_install(tmp_path / "base")), {}


def _pth_linked(tmp_path: Path):
    return fresh_venv(tmp_path / "venv"), {}


def _pythonpath(tmp_path: Path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    return tmp_path / "venv" / "bin" / "python", {"PYTHONPATH": str(package_view(tmp_path / "packages"))}


@pytest.mark.parametrize("environment", [_system_site_packages, _pth_linked, _pythonpath],
                         ids=["system-site-packages", "pth-linked", "pythonpath"])
def test_torch_found_elsewhere_verifies_with_the_same_keys(verified, environment, tmp_path):
    project, entries = verified
    python, env = environment(tmp_path)
    whose = _run(python, project, "-c", WHOSE, env=env)
    assert whose.stdout.split() == ["False", "False", "True"], whose.stdout + whose.stderr
    run = _run(python, project, "-m", "doit", "verify:hello_world", "backend=eager", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    # planned again (another interpreter's packages), to the same plan: every stage's key is one this
    # interpreter's environment made
    assert _row(run.stdout, "hello_world") == ["PASS", *["cached"] * len(STAGES)], run.stdout + run.stderr
    assert sorted(project.cache.glob("entries/*/*/*.json")) == entries


USER_PACKAGE = {
    "pyproject.toml": """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "mykernels"
version = "0.1.0"

[tool.golden-tasks]
kernels = ["src/mykernels"]
""",
    "dodo.py": (ROOT / "dodo.py").read_text(),
    "src/mykernels/__init__.py": "",
    "src/mykernels/_ops.py": "def scale(x):\n    return x * 2\n",
    "src/mykernels/double.py": """\
import torch

from golden_tasks import Case, In, Out, TensorSpec, jit
from mykernels._ops import scale


@jit
def double(x: In, out: Out):
    out.copy_(scale(x))


def golden(t):
    t["out"].copy_(t["x"] + t["x"])


CASES = [Case("double", specs=[TensorSpec("x", (8, 8), torch.float32, torch.randn),
                               TensorSpec("out", (8, 8), torch.float32)], golden=golden, rtol=0.0, atol=0.0)]
""",
}


def test_an_edit_in_an_editable_installed_user_package_reruns_its_stages(tmp_path):
    """The package's source is on sys.path through the .pth file of its editable install, as a linked
    package tree is: it is still the user's code, so the helper's edit re-runs what calls it."""
    root = tmp_path / "mykernels"
    for name, text in USER_PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    shutil.copytree(ROOT / "golden_tasks", root / "golden_tasks", ignore=shutil.ignore_patterns("__pycache__"))
    python = fresh_venv(tmp_path / "venv")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--no-build-isolation", "-e", str(root)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {**_without_projects(os.environ), "GOLDEN_TASKS_CACHE": str(tmp_path / "cache"), "GOLDEN_TASKS_RUNS": str(tmp_path / "runs")}
    found = subprocess.run([python, "-c", "import mykernels._ops as m; print(m.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert found.stdout.strip() == str(root / "src" / "mykernels" / "_ops.py"), found.stdout + found.stderr

    def verify():
        return subprocess.run([python, "-m", "doit", "verify:double", "backend=eager"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=900)

    first = verify()
    assert first.returncode == 0 and _row(first.stdout, "double")[0] == "PASS", first.stdout + first.stderr
    (root / "src" / "mykernels" / "_ops.py").write_text("def scale(x):\n    return x * 3\n")
    edited = verify()
    row = _row(edited.stdout, "double")
    assert edited.returncode != 0 and row[0] == "FAIL", edited.stdout + edited.stderr
    # the kernel's stages ran again and its verdict changed; the golden's did not
    assert dict(zip(STAGES, row[1:]))["compile"] == "ran" and dict(zip(STAGES, row[1:]))["golden"] == "cached", \
        edited.stdout
    assert re.search(r"double: FAIL at validate", edited.stdout), edited.stdout
