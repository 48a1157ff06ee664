"""golden-tasks as a library a kernel repository installs: `python -m build` makes a wheel and an sdist,
the wheel installs into a fresh virtual environment, and a project outside this repository, configured
only by its pyproject.toml, verifies with doit (no dodo.py) and with pytest, also under pytest-xdist."""
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from project import copy_checkout, fresh_venv
from test_pytest_plugin import CASES, PYPROJECT

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]


def run(cmd, cwd, env=None, timeout=900):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_wheel_in_a_fresh_venv_verifies_a_project_outside_the_repository(tmp_path):
    # the source tree as a fresh clone has it (no cache, runs or build leftovers of this checkout)
    source = copy_checkout(tmp_path / "source")
    dist = tmp_path / "dist"
    # no isolation: the build backend (setuptools) is already here, and no index is needed
    run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", dist], source)
    (wheel,) = dist.glob("golden_tasks-*.whl")
    (sdist,) = dist.glob("golden_tasks-*.tar.gz")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "golden_tasks/frontends/pytest_plugin.py" in names and not any(n.startswith(("kernels/", "tests/")) for n in names)
    assert "Requires-Dist: torch>=2.11" in metadata  # a range: it installs beside the user's own torch
    assert "[pytest11]" in entry_points and "[doit.LOADER]" in entry_points
    with tarfile.open(sdist) as archive:
        assert any(n.endswith("golden_tasks/project/layout.py") for n in archive.getnames())

    venv = tmp_path / "venv"
    python = fresh_venv(venv)
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", wheel], tmp_path)
    where = run([python, "-c", "import golden_tasks, torch; print(golden_tasks.__file__, torch.__file__, "
                 "torch.__version__)"], tmp_path).stdout.split()
    assert where[0].startswith(str(venv)), where  # the wheel, not this checkout
    # the torch that was there is kept: pip installed none into the venv's site-packages (nor could it: --no-index)
    assert not where[1].startswith(str(venv / "lib")) and where[2] == torch.__version__, where

    project = tmp_path / "elsewhere" / "mine"
    (project / "src/mykernels").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT + '\n[tool.doit]\nloader = "golden-tasks"\n')
    (project / "src/mykernels/ops.py").write_text(CASES)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GOLDEN_TASKS_", "PYTHONPATH"))},
           "PYTHONWARNINGS": "ignore", "GOLDEN_TASKS_HTML": "0"}
    doit = subprocess.run([python, "-m", "doit", "--continue", "verify"], cwd=project, capture_output=True,
                          text=True, env=env, timeout=900)
    assert doit.returncode == 1, doit.stdout + doit.stderr  # twice_off fails
    for case, status in (("twice", "PASS"), ("twice_off", "FAIL"), ("twice_unchecked", "SKIPPED")):
        assert re.search(rf"^{case} +{status} ", doit.stdout, re.M), doit.stdout
    tests = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2"], cwd=project,
                           capture_output=True, text=True, env=env, timeout=900)
    assert tests.returncode == 1 and "1 failed, 1 passed, 1 skipped" in tests.stdout, tests.stdout + tests.stderr
    assert "plugins:" in tests.stdout and "golden-tasks" in tests.stdout


def test_the_optional_extras_pull_no_torch():
    """`pip install golden-tasks[ray]` or `[triton]` never brings a torch (a CUDA build, multi-GB, over the
    user's own): none of what they require, at any depth, as installed here, is torch."""
    from packaging.requirements import Requirement

    names = {"ray", "triton"}
    seen = set()
    while names - seen:
        name = (names - seen).pop()
        seen.add(name)
        for requirement in map(Requirement, importlib.metadata.requires(name) or []):
            # the package's own extras and what applies to no Python like this one are not installed with it
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                names.add(requirement.name.lower().replace("_", "-"))
    assert "torch" not in seen and {"ray", "triton"} <= seen, sorted(seen)
