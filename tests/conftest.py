"""Shared fixtures: every test gets its own cache and runs directory, and the default profile. Third-party
warnings are filtered as a run filters them (golden_tasks.project.config.THIRD_PARTY_WARNINGS)."""
import re

import pytest

from golden_tasks.project.config import THIRD_PARTY_WARNINGS


def pytest_configure(config):
    for message, category in THIRD_PARTY_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{re.escape(message)}:{category.__name__}")


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("GOLDEN_TASKS_PROFILE", "default")  # set, so that one a test's code sets is undone
    return tmp_path
