"""A dodo.py's import: `from golden_tasks.doit_tasks import DOIT_CONFIG, tasks_for`, then
`globals().update(tasks_for(Path(__file__).parent))` (golden_tasks.frontends.doit_tasks)."""
from .frontends.doit_tasks import DOIT_CONFIG, ProjectLoader, tasks_for

__all__ = ["DOIT_CONFIG", "ProjectLoader", "tasks_for"]
