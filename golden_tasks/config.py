"""Where things live, overridable by environment variables."""
import os
from pathlib import Path

CACHE_ENV = "GOLDEN_TASKS_CACHE"
RUNS_ENV = "GOLDEN_TASKS_RUNS"
THREADS_ENV = "GOLDEN_TASKS_THREADS"
WORKERS_ENV = "GOLDEN_TASKS_WORKERS"


def cache_root(project: Path = None) -> Path:
    """The content-addressed store: $GOLDEN_TASKS_CACHE, else <project>/cache."""
    return Path(os.environ.get(CACHE_ENV) or (project or Path.cwd()) / "cache").resolve()


def runs_root(project: Path = None) -> Path:
    """Per-run reports: $GOLDEN_TASKS_RUNS, else <project>/runs."""
    return Path(os.environ.get(RUNS_ENV) or (project or Path.cwd()) / "runs").resolve()


def torch_threads() -> int:
    """Threads per worker: $GOLDEN_TASKS_THREADS, else the cores shared among doit's workers."""
    if os.environ.get(THREADS_ENV):
        return max(1, int(os.environ[THREADS_ENV]))
    workers = max(1, int(os.environ.get(WORKERS_ENV) or 1))
    return max(1, (os.cpu_count() or 1) // workers)
