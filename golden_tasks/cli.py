"""`golden-tasks ...` and `python -m golden_tasks.cli ...`: the command line (golden_tasks.frontends.cli)."""
import sys

from .frontends.cli import main

if __name__ == "__main__":
    sys.exit(main())
