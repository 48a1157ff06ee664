"""Shared fixtures: every test gets its own cache and runs directory, and the default profile."""
import pytest


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("GOLDEN_TASKS_PROFILE", "default")  # set, so that one a test's code sets is undone
    return tmp_path
