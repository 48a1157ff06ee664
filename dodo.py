"""doit entry point: `doit verify`, `doit verify:<case>`, `doit -n 4 verify`, `doit list`.

Variables: `backend=eager|aoti` overrides every case's compile backend.
"""
from pathlib import Path

from golden_tasks.doit_tasks import DOIT_CONFIG, tasks_for  # noqa: F401

globals().update(tasks_for(Path(__file__).parent))
