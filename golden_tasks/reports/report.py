"""The end-of-run summary: one row per case, as a table and as the run's files.

The files of a run (write_files), beside the runtime dirs runs/<case>/: runs/report.json, the
record (docs/reports.md); runs/report.xml, the same as JUnit XML for CI systems (golden_tasks.reports.junit);
runs/traces/, the FlashInfer-Trace cases' results as the format's Trace records (golden_tasks.reports.traces);
runs/<case>.log, every failure message of a case that failed in the run (the table's reason line is
the first line of the first one); and runs/report.html (write_html: golden_tasks.reports.html_report).
"""
import json
from pathlib import Path

from ..model.origin import shown
from ..model.records import CaseRow, RunRecord
from ..model.verdicts import StageState, Verdict
from ..pipeline.stage_table import STAGES
from ..pipeline.summary import origin, resized, sweeps_of
from ..project import reaper
from ..storage.store import atomic_write


def outcome_line(rows: list) -> str:
    """The run's last line: how many cases have each status, and plainly when nothing was verified
    because every case was skipped."""
    tally = RunRecord(cases=rows).counts
    if tally == {Verdict.SKIPPED: len(rows)}:
        return (f"all {len(rows)} selected case{'s' * (len(rows) > 1)} SKIPPED: nothing was verified on this "
                "machine (the reasons are above)")
    return f"{len(rows)} case{'s' * (len(rows) > 1)}: " + ", ".join(f"{n} {s}" for s, n in tally.items())


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


def _speedup(row: CaseRow) -> str:
    """The speedup over the case's baseline, with its uncertainty (one standard error) when both timings have one,
    and the baseline's name: "1.23x ±0.01 over torch"."""
    if row.speedup is None:
        return "-"
    return f"{row.speedup:.2f}x" + ("" if row.speedup_err is None else f" ±{row.speedup_err:.2f}") \
        + f" over {row.speedup_over}"


def _sol(row: CaseRow) -> str:
    """The fraction of the machine's speed of light the kernel reached, with its uncertainty where it has one."""
    speed = row.speed
    if speed is None or speed.sol is None:
        return "-"
    return f"{speed.sol:.2f}" + ("" if speed.sol_err is None else f" ±{speed.sol_err:.2f}")


def format_table(rows: list) -> str:
    columns = [s for s in STAGES if s.per_case]
    header = ["case", "status", *[s.name for s in columns], "max err", "kernel median us", "GB/s", "TFLOP/s", "SOL",
              "speedup"]
    body = [[r.case, r.status, *(r.stages.get(s.name, StageState.NOT_RUN) for s in columns), r.max_error(),
             _num(r.kernel_us, ".1f"), _num(r.speed and r.speed.gbps, ".3g"), _num(r.speed and r.speed.tflops, ".3g"),
             _sol(r), _speedup(r)] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [_sweep_line(sweep, points) for sweep, points in sweeps_of(rows).items()]
    lines += [f"{r.case}: SKIPPED: {r.skipped}" for r in rows if r.skipped]
    lines += [f"{r.case}: WARNING: {w}" for r in rows for w in r.warnings]
    lines += [f"{r.case}: per rank, median us: " + ", ".join(f"{i}: {us:.1f}" for i, us in enumerate(r.rank_us))
              + (f"; LOAD IMBALANCE: {r.imbalance}" if r.imbalance else "") for r in rows if r.rank_us]
    lines += [f"{r.case}: {resized(r.dataset)}" for r in rows if r.dataset.get("declared")]
    lines += [f"{r.case}: FAIL at {r.reason}" + f" [{origin(r.dataset)}]" * bool(r.dataset)
              + (f"  (all messages: {shown(r.log)})" if r.log else "") for r in rows if r.status == Verdict.FAIL]
    return "\n".join(lines)


def _sweep_line(sweep: str, rows: list) -> str:
    """A sweep's points in one line: how many, their statuses, and the range of the kernel's medians."""
    points = [r for r in rows if not r.baseline_of]
    counts = ", ".join(f"{n} {v}" for v in Verdict if (n := sum(r.status == v for r in points)))
    timed = [r.kernel_us for r in points if r.kernel_us is not None]
    medians = f"; kernel median {min(timed):.1f} to {max(timed):.1f} us" if timed else ""
    return f"{sweep}: a sweep of {len(points)} points: {counts}{medians}"


def log_path(runs_root: Path, case: str) -> Path:
    return Path(runs_root) / f"{case}.log"


def write_files(runs_root: Path, record: RunRecord) -> None:
    """Write the run's files under `runs_root` (see the module): the record as runs/report.json, the
    log of each case whose row names one (row.log), and remove the old log of every other case
    of the run."""
    for row in record.cases:
        path = log_path(runs_root, row.case)
        if row.log:
            _write_text(path, "".join(f"== {stage}:{row.case}\n{message.rstrip()}\n\n"
                                      for stage, message in row.errors.items()))
        else:
            path.unlink(missing_ok=True)
    from . import junit, traces  # noqa: PLC0415 -- only where a run's files are written

    # compact: json's C encoder (an indented record is encoded in Python, ten times slower); `python -m
    # json.tool runs/report.json` shows it indented
    _write_text(Path(runs_root) / "report.json", json.dumps(record.to_json(), sort_keys=True))
    junit.write(Path(runs_root) / "report.xml", record)
    traces.write(runs_root, record)


def write_html(project: Path, say=lambda line: None) -> str:
    """Render runs/report.html from the record just written: here when every case's figures are in the
    cache, else in its own process (plotting imports torch, matplotlib and the kernel modules, which the
    doit parent must not), after `say`ing so (it takes seconds): None, or why it failed."""
    from . import html_report  # noqa: PLC0415 -- only where a page is written

    if html_report.write_page_if_drawn(project):
        return None
    say("drawing the figures of runs/report.html ...")
    done = reaper.python_module("golden_tasks.html_report", "--project", str(project))
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no message"])[-1]


def _write_text(path: Path, text: str) -> None:
    data = text.encode()
    atomic_write(path, lambda f: f.write(data))
