"""Shared fixtures: every test gets its own cache and runs directory, and the default profile; a run context a
test enters (golden_tasks.project.config.RunContext) is left with it. Third-party warnings are filtered as a run
filters them (golden_tasks.project.config.THIRD_PARTY_WARNINGS). Every Project's cache (tests/project.py) starts
with this machine's calibration, measured once per session, as a user's cache holds it after its first run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock
from project import CALIBRATION, seed_calibration

from golden_tasks.project.config import THIRD_PARTY_WARNINGS, RunContext

# The files that take longest start first: with --dist loadfile a file runs on one worker, and the one that starts
# last ends last (the docs' file verifies the library cold and runs every document: half the suite's time)
FIRST = ("tests/test_docs.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(FIRST))  # stable: the rest keep their order


def pytest_configure(config):
    for message, category in THIRD_PARTY_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{re.escape(message)}:{category.__name__}")


@pytest.fixture(scope="session", autouse=True)
def calibration(tmp_path_factory) -> Path:
    """A cache holding this machine's calibration (the calibrate stage's entry), measured by the session's first
    worker while the others wait: `golden-tasks machine --measure`, as a user would."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "calibration"
    with FileLock(f"{root}.lock"):
        if not (root / "entries").is_dir():
            root.mkdir(exist_ok=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")}
            subprocess.run([sys.executable, "-m", "golden_tasks.cli", "--cache", str(root), "machine", "--measure"],
                           env=env, check=True, capture_output=True, timeout=600)
    os.environ[CALIBRATION] = str(root)
    return root


@pytest.fixture
def calibrated(isolated_dirs):
    """The test's cache ($GOLDEN_TASKS_CACHE) starts with the session's calibration, as a user's holds it after
    its first run: an in-process golden_tasks.run measures no machine. A module of such runs uses it for every
    test (`pytestmark = pytest.mark.usefixtures("calibrated")`)."""
    seed_calibration(isolated_dirs / "cache")


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(tmp_path / "runs"))
    for name in RunContext().environment():  # as they are, so that what a test's code sets is undone
        given = os.environ.get(name)
        monkeypatch.setenv(name, given or "")  # recorded as it was, even absent (delenv of none records nothing)
        if given is None:
            monkeypatch.delenv(name)
    monkeypatch.setenv("GOLDEN_TASKS_PROFILE", "default")
    return tmp_path
