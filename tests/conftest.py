"""Shared fixtures: every test gets its own cache and runs directory."""
import pytest


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(tmp_path / "runs"))
    return tmp_path
