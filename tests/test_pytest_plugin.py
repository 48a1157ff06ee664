"""The pytest plugin, run as a kernel engineer runs it: real pytest (and pytest-xdist) in a project of
its own, configured only by its pyproject.toml, with its kernels under src/mykernels."""
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
PYPROJECT = '[project]\nname = "mine"\n\n[tool.golden-tasks]\nkernels = ["src/mykernels"]\nbackend = "eager"\n'

CASES = textwrap.dedent('''
    import torch
    from golden_tasks import Case, In, Out, TensorSpec, jit

    @jit
    def twice(x: In, out: Out):
        torch.mul(x, 2.0, out=out)

    def golden_twice(t):
        t["out"].copy_(t["x"] * 2.0)

    def golden_off(t):
        t["out"].copy_(t["x"] * 2.0)
        t["out"][-1] += 1.0  # the golden disagrees in the last row

    def specs():
        return [TensorSpec("x", (8, 16), torch.float32, torch.randn), TensorSpec("out", (8, 16), torch.float32)]

    CASES = [Case("twice", specs, kernel=twice, golden=golden_twice, rounds=2),
             Case("twice_off", specs, kernel=twice, golden=golden_off, rounds=2),
             Case("twice_unchecked", specs, kernel=twice, rounds=2)]
''')


def project(tmp_path: Path) -> Path:
    root = tmp_path / "mine"
    (root / "src/mykernels").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "src/mykernels/ops.py").write_text(CASES)
    return root


def clean_env() -> dict:
    """This process's environment without the suite's GOLDEN_TASKS_ settings: the project's own layout rules."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")}, "PYTHONWARNINGS": "ignore"}


def pytest_in(root: Path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args], cwd=root,
                          capture_output=True, text=True, env={**clean_env(), **(env or {})}, timeout=600)


def test_each_case_is_an_item_that_passes_fails_with_its_mismatch_report_or_skips(tmp_path):
    root = project(tmp_path)
    listed = pytest_in(root, "--collect-only", "-q")
    assert listed.stdout.splitlines()[:3] == [f"src/mykernels/ops.py::{c}" for c in
                                              ("twice", "twice_off", "twice_unchecked")], listed.stdout
    run = pytest_in(root, "-v")
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert re.search(r"ops.py::twice PASSED", out) and re.search(r"ops.py::twice_off FAILED", out)
    assert re.search(r"ops.py::twice_unchecked SKIPPED", out)
    assert "SKIPPED [1] src/mykernels/ops.py:1: no golden: validation skipped" in out
    # the failure is the mismatch report, not a traceback into the plugin
    assert "validate: validation FAILED for twice_off:\noutput 'out': 16/128 elements mismatched" in out
    assert "pytest_plugin.py" not in out and "Traceback" not in out
    assert (root / "cache" / "entries" / "validate").is_dir()  # the project's cache: doit's too


def test_a_cached_case_computes_nothing_and_doit_reuses_what_pytest_computed(tmp_path):
    """A cached case is fast because it recomputes no stage; benchmarks/pytest_plugin.py measures how fast."""
    root = project(tmp_path)
    assert pytest_in(root, "-k", "twice and not off and not unchecked").returncode == 0
    again = pytest_in(root, "-k", "twice and not off and not unchecked")
    assert again.returncode == 0, again.stdout
    cold, cached = [json.loads(line) for line in (root / "cache" / "log" / "runs.jsonl").read_text().splitlines()]
    assert {"compile", "golden", "dispatch", "validate"} <= cold["misses"].keys() and not cold["hits"], cold
    assert cached["hits"] == cold["misses"] and not cached["misses"], cached
    (root / "dodo.py").write_text("from pathlib import Path\nfrom golden_tasks.doit_tasks import DOIT_CONFIG, "
                                  "tasks_for  # noqa: F401\nglobals().update(tasks_for(Path(__file__).parent))\n")
    doit = subprocess.run([sys.executable, "-m", "doit", "verify:twice"], cwd=root, capture_output=True, text=True,
                          env={**clean_env(), "GOLDEN_TASKS_HTML": "0"}, timeout=600)
    assert doit.returncode == 0 and re.search(r"^twice +PASS +cached +cached", doit.stdout, re.M), doit.stdout


def test_two_xdist_workers_share_the_cache_and_compute_a_shared_entry_once(tmp_path):
    root = project(tmp_path)
    run = pytest_in(root, "-n", "2", "-k", "twice and not unchecked")
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout + run.stderr
    assert "2 workers [2 items]" in run.stdout  # really two workers, one case each
    # both cases dispatch the same compiled kernel on the same inputs: each worker logs its hits and misses,
    # and the shared entries were computed once between them, whichever worker got there first
    runs = [json.loads(line) for line in (root / "cache" / "log" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2
    for stage in ("abi", "compile", "inputs", "dispatch"):
        assert sum(r["misses"].get(stage, 0) for r in runs) == 1, (stage, runs)
        assert sum(r["hits"].get(stage, 0) for r in runs) == 1, (stage, runs)
    assert len(list((root / "cache" / "entries" / "dispatch").glob("*/*.json"))) == 1
