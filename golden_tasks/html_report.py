"""`python -m golden_tasks.html_report [--project DIR]`: runs/report.html from runs/report.json
(golden_tasks.reports.html_report)."""
import sys

from .reports.html_report import main

if __name__ == "__main__":
    sys.exit(main())
