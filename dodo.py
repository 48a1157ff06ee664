"""doit entry point: `doit verify`, `doit verify:<case>`, `doit -n 4 verify`, `doit list`.

Variables (after the task names): backend=eager|aoti, options='{"inductor config": value}',
warmup=N, rounds=N override every case's settings; profile=NAME picks the size profile of
kernel modules that have them ($GOLDEN_TASKS_PROFILE, default "default"); ranks=N the world
size of multi-rank cases. `doit help verify` lists them.

Output: on a terminal a live progress view, then the summary table with one reason line per
failing case; every run that verifies writes runs/report.json and runs/<case>.log (all messages
of a failing case), whatever the reporter. `doit --failure-verbosity=2 verify` adds doit's own
failure output.
"""
from pathlib import Path

from golden_tasks.doit_tasks import DOIT_CONFIG, tasks_for  # noqa: F401

globals().update(tasks_for(Path(__file__).parent))
