"""Shared fixtures: every test gets its own cache and runs directory, and the default profile; a run context a
test enters (golden_tasks.project.config.RunContext) is left with it. Third-party warnings are filtered as a run
filters them (golden_tasks.project.config.THIRD_PARTY_WARNINGS)."""
import os
import re

import pytest

from golden_tasks.project.config import THIRD_PARTY_WARNINGS, RunContext


def pytest_configure(config):
    for message, category in THIRD_PARTY_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{re.escape(message)}:{category.__name__}")


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
