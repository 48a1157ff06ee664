"""A project's layout ([tool.golden-tasks] in its pyproject.toml): kernel folders anywhere, its cache and
runs where it says, its default profile and backend; a malformed table is one message naming the key."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_pytest_plugin import CASES

from golden_tasks.frontends.scaffold import InitRefused, scaffold
from golden_tasks.project.layout import LayoutError, layout

ROOT = Path(__file__).resolve().parents[1]



def write(root: Path, table: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "mine"\n\n[tool.golden-tasks]\n{table}')
    return root


def test_without_a_table_the_layout_is_kernels_cache_and_runs_beside_it(tmp_path):
    found = layout(tmp_path)
    assert found.kernels == (tmp_path / "kernels",) and found.cache is None and found.runs is None
    assert found.profile is None and found.backend is None


def test_a_table_names_folders_cache_runs_profile_and_backend(tmp_path):
    root = write(tmp_path / "p", 'kernels = ["src/mykernels", "more"]\ncache = ".gt-cache"\nruns = "build/runs"\n'
                                 'profile = "small"\nbackend = "eager"\n')
    for folder in ("src/mykernels", "more"):
        (root / folder).mkdir(parents=True)
    (root / "src/mykernels/attn.py").write_text("")
    (root / "src/mykernels/_helpers.py").write_text("")
    (root / "more/norm.py").write_text("")
    found = layout(root)
    assert [(m.name, m.import_root) for m in found.modules()] == [("mykernels.attn", root / "src"),
                                                                    ("more.norm", root)]
    assert found.cache == root / ".gt-cache" and found.runs == root / "build/runs"
    assert (found.profile, found.backend) == ("small", "eager") and found.machine == {}


def test_a_table_declares_the_machines_figures(tmp_path):
    root = write(tmp_path / "p", "[tool.golden-tasks.machine.cpu]\ngbps = 40\ntflops = {float32 = 1.5}\n"
                                 "[tool.golden-tasks.machine.cuda]\ngbps = 3000.0\n")
    assert layout(root).machine == {"cpu": {"gbps": 40.0, "tflops": {"float32": 1.5}}, "cuda": {"gbps": 3000.0}}


@pytest.mark.parametrize("table, message", [
    ('kernel = ["src"]\n', "unknown key 'kernel' (known: backend, cache, datasets, kernels, machine, profile, runs)"),
    ("[tool.golden-tasks.machine.tpu]\ngbps = 1\n", "machine.tpu: 'tpu' is not a device (cpu, cuda)"),
    ("[tool.golden-tasks.machine.cpu]\ngbps = -1\n", "machine.cpu.gbps must be a number > 0, not -1"),
    ("[tool.golden-tasks.machine.cpu]\nbandwidth = 1\n", "machine.cpu must be a table of gbps"),
    ("[tool.golden-tasks.machine.cpu]\ntflops = {fp32 = 1}\n", "machine.cpu.tflops: 'fp32' is not a floating dtype"),
    ('kernels = "src"\n', "kernels must be a non-empty list of folders, not 'src'"),
    ('kernels = ["nowhere"]\n', "kernels folder 'nowhere' does not exist"),
    ('kernels = ["a/k", "b/k"]\n', "two kernel folders are named 'k'"),
    ("cache = 3\n", "cache must be a non-empty string, not 3"),
    ('backend = "eagr"\n', "backend 'eagr' is not a backend (aoti, eager)"),
    ("kernels = [\n", "cannot be read"),
])
def test_a_malformed_table_names_the_file_and_the_key(tmp_path, table, message):
    root = write(tmp_path / "p", table)
    for folder in ("a/k", "b/k"):
        (root / folder).mkdir(parents=True)
    with pytest.raises(LayoutError) as raised:
        layout(root)
    assert str(root / "pyproject.toml") in str(raised.value) and message in str(raised.value)


def doit(root: Path, *args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")}
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, capture_output=True, text=True,
                          env={**clean, "PYTHONWARNINGS": "ignore", "GOLDEN_TASKS_HTML": "0", **(env or {})},
                          timeout=600)


@pytest.mark.e2e
def test_a_project_configured_only_in_pyproject_verifies_with_doit_and_no_dodo_file(tmp_path):
    root = write(tmp_path / "mine", 'kernels = ["src/mykernels"]\ncache = ".gt-cache"\nruns = "build/runs"\n'
                                    'backend = "eager"\n\n[tool.doit]\nloader = "golden-tasks"\n')
    (root / "src/mykernels").mkdir(parents=True)
    (root / "src/mykernels/ops.py").write_text(CASES)
    first = doit(root, "verify:twice")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "twice" in first.stdout and "PASS" in first.stdout
    assert (root / ".gt-cache" / "entries").is_dir() and not (root / "cache").exists()
    record = json.loads((root / "build/runs/report.json").read_text())
    assert [r["status"] for r in record["cases"]] == ["PASS"]
    compiled = json.loads(next((root / ".gt-cache/entries/compile").glob("*/*.json")).read_text())
    assert compiled["meta"]["backend"] == "eager"  # the project's backend (the default is aoti), no backend= given
    again = doit(root, "verify:twice")
    assert again.returncode == 0 and "twice" in again.stdout and "ran" not in again.stdout


@pytest.mark.e2e
def test_a_malformed_table_stops_doit_with_one_line(tmp_path):
    root = write(tmp_path / "mine", 'kernels = ["src/missing"]\n')
    (root / "dodo.py").write_text((ROOT / "dodo.py").read_text())
    proc = doit(root, "verify")
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    assert "kernels folder 'src/missing' does not exist" in proc.stdout + proc.stderr


@pytest.mark.e2e
def test_init_writes_a_project_that_verifies_and_then_refuses_to_overwrite_it(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    cli = [sys.executable, "-m", "golden_tasks.cli", "--project", str(root), "init", "--kernels", "src/mykernels"]
    made = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines()[0] == ("wrote dodo.py, src/mykernels/example.py, src/mykernels/untrusted/__init__.py, "
                                           "src/mykernels/untrusted/scale_add.py, src/mykernels/__init__.py, "
                                           ".gitignore, pyproject.toml")
    assert (root / ".gitignore").read_text() == "/cache/\n/runs/\n/.doit.db*\n"
    assert layout.__wrapped__(root).kernels == (root / "src/mykernels",)
    verified = subprocess.run([sys.executable, "-m", "doit", "verify", "backend=eager"], cwd=root, capture_output=True,
                              text=True, env={**{k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")},
                                              "PYTHONWARNINGS": "ignore", "GOLDEN_TASKS_HTML": "0"},
                              preexec_fn=lambda: os.umask(0o022), timeout=600)
    assert verified.returncode == 0 and re.search(r"^scale_add +PASS ", verified.stdout, re.M), verified.stdout
    # what it wrote is as readable as the umask allows (a team shares a cache), not the temporary files' 0600
    written = [p for p in [*(root / "cache").rglob("*"), *(root / "runs").rglob("*")] if p.is_file()]
    assert written and {oct(p.stat().st_mode & 0o044) for p in written} == {oct(0o044)}
    # git ignores every file the tool wrote
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shown = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                           capture_output=True, text=True, check=True).stdout
    assert not [line for line in shown.splitlines() if "cache/" in line or "runs/" in line or ".doit.db" in line], shown
    report = json.loads((root / "runs" / "report.json").read_text())
    assert report["cases"][0]["golden_protected"] is True  # the kernel is named by import path
    (root / "src/mykernels/example.py").write_text("# mine now\n")
    again = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and again.stderr == (f"golden-tasks init: init writes nothing over existing files: "
                                                      f"{root / 'dodo.py'}, {root / 'src/mykernels/example.py'}, "
                                                      f"{root / 'src/mykernels/untrusted/__init__.py'}, "
                                                      f"{root / 'src/mykernels/untrusted/scale_add.py'}\n")
    assert (root / "src/mykernels/example.py").read_text() == "# mine now\n"


def test_init_will_not_contradict_a_table_that_names_other_folders(tmp_path):
    root = write(tmp_path / "mine", 'kernels = ["lib/k"]\n')
    (root / "lib/k").mkdir(parents=True)
    with pytest.raises(InitRefused, match="already has a \\[tool.golden-tasks\\] table"):
        scaffold(root, "src/other")
    assert set(scaffold(root).files) == {root / "dodo.py", root / "lib/k/example.py", root / "lib/k/__init__.py",
                                         root / "lib/k/untrusted/__init__.py", root / "lib/k/untrusted/scale_add.py"}


@pytest.mark.e2e
def test_init_after_the_table_makes_the_folders_it_names(tmp_path):
    """A user who writes the table first, then runs init, gets the folders the table names."""
    root = write(tmp_path / "mine", 'kernels = ["src/mykernels", "src/more"]\n')
    with pytest.raises(LayoutError, match="kernels folder 'src/mykernels' does not exist"):
        layout(root)
    cli = [sys.executable, "-m", "golden_tasks.cli", "--project", str(root), "init", "--kernels", "src/mykernels"]
    made = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert (root / "src/mykernels/example.py").is_file() and (root / "src/more").is_dir()
    assert "[tool.golden-tasks]" not in (root / "pyproject.toml").read_text().split("[tool.golden-tasks]", 1)[1]
    assert layout.__wrapped__(root).kernels == (root / "src/mykernels", root / "src/more")  # the table is unchanged


def test_init_without_a_table_makes_no_default_folder(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    assert scaffold(root, "src/k").folders == ()  # init names src/k in a new table: no kernels/ beside it
