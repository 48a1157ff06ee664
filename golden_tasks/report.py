"""The end-of-run summary: one row per case, as a table and as the run's files.

The files of a run (write_files), beside the runtime dirs runs/<case>/: runs/report.json, the
record (docs/reports.md); runs/report.xml, the same as JUnit XML for CI systems (golden_tasks.junit);
runs/<case>.log, every failure message of a case that failed in the run (the table's reason line is
the first line of the first one); and runs/report.html (write_html: golden_tasks.html_report).
"""
import json
import math
from pathlib import Path

from . import reaper
from .graph import STAGES, snapshot
from .origin import shown
from .outputs import SAMPLES_FILE, BenchMeta, Stats, ValidateMeta
from .plan import FailedPlan, Plan
from .records import CaseRow, RunRecord, Timing
from .store import atomic_write
from .verdicts import StageState, Verdict


def case_row(plan: Plan | FailedPlan, states: dict, errors: dict, store, found: dict = None,
             failed_max_abs: float = None) -> CaseRow:
    """The summary of one case from its stage states and its cached entries; `found`: entries already
    looked up (graph.resolve); `failed_max_abs`: the largest error of a validation that failed in this run
    (errors.StageFailed.max_abs)."""
    stages = {s.name: states.get(s.name, StageState.NOT_RUN) for s in STAGES}
    if plan.error:
        return CaseRow(case=plan.case, status=Verdict.FAIL, stages=dict.fromkeys(stages, StageState.NOT_RUN),
                       errors={"plan": plan.error}, reason=_first_failure({"plan": plan.error}))
    entries = snapshot(plan, store, found)
    row = CaseRow(case=plan.case, status=Verdict.INCOMPLETE, stages=stages, errors=errors,
                  golden_protected=plan.golden_protected,
                  keys={name: entry and entry.key for name, entry in entries.items()},
                  fingerprints={field: getattr(plan, field) for field in ("kernel", "golden", "policy")},
                  seconds=sum(Stats.of(entries[name]).seconds or 0.0 for name, state in stages.items()
                              if state == StageState.RAN and entries[name]))
    for name, state in stages.items():
        if state.reached and entries[name] and entries[name].meta.get("skipped"):
            stages[name] = StageState.SKIPPED
    validate, bench, timed_golden = entries["validate"], entries["bench"], entries["golden_bench"]
    verdict = validate and ValidateMeta.of(validate)
    if verdict:
        row.max_abs, row.outputs, row.warnings = verdict.max_abs, verdict.outputs, list(verdict.warnings)
    elif failed_max_abs is not None and math.isfinite(failed_max_abs):  # JSON has no NaN
        row.max_abs = failed_max_abs
    if bench and (second := BenchMeta.of(bench).second_set) and second != "checked":
        row.warnings.append(f"the benchmark's second input set was {second}")
    row.golden_timing = timed_golden and _timing(timed_golden, "golden_us")
    row.kernel_timing = bench and _timing(bench, "kernel_us")  # several ranks: of each round's slowest rank
    row.golden_us = row.golden_timing and row.golden_timing.median
    row.kernel_us = row.kernel_timing and row.kernel_timing.median  # a skipped bench has none
    if row.kernel_timing and row.kernel_timing.ranks:
        row.rank_us = [rank.median for rank in row.kernel_timing.ranks]
        row.imbalance = row.kernel_timing.imbalance
    if row.kernel_us and row.golden_us:
        row.speedup = row.golden_us / row.kernel_us
        noise = [row.kernel_timing.median_rse, row.golden_timing.median_rse]
        if None not in noise:  # relative standard errors add in quadrature
            row.speedup_err = row.speedup * (noise[0] ** 2 + noise[1] ** 2) ** 0.5
    if errors or StageState.FAILED in stages.values():
        row.status, row.reason = Verdict.FAIL, _first_failure(errors)
    elif verdict and verdict.skipped:
        row.status, row.skipped = Verdict.SKIPPED, verdict.skipped
    elif validate and bench:
        row.status = Verdict.PASS
    return row


def outcome_line(rows: list) -> str:
    """The run's last line: how many cases have each status, and plainly when nothing was verified
    because every case was skipped."""
    tally = RunRecord(cases=rows).counts
    if tally == {Verdict.SKIPPED: len(rows)}:
        return (f"all {len(rows)} selected case{'s' * (len(rows) > 1)} SKIPPED: nothing was verified on this "
                "machine (the reasons are above)")
    return f"{len(rows)} case{'s' * (len(rows) > 1)}: " + ", ".join(f"{n} {s}" for s, n in tally.items())


def _timing(entry, field: str) -> Timing | None:
    """The entry's timing summary, with the digest of the object that holds its round times ("samples")."""
    timing = getattr(Stats.of(entry), field)
    record = entry.objects.get(SAMPLES_FILE)
    return timing and Timing.from_json({**timing, "samples": record and record["digest"]}, field)


def first_line(text) -> str:
    """The first line of `text` that is not blank, stripped."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _first_failure(errors: dict) -> str:
    """The message that matters: the first line of the first failure (plan, then graph order), with
    the next one when it only announces them ("validation FAILED for x:")."""
    order = ["plan", *(s.name for s in STAGES)]
    for stage in sorted(errors, key=lambda s: order.index(s) if s in order else len(order)):
        lines = [line.strip() for line in errors[stage].splitlines() if line.strip()]
        if lines:
            return f"{stage}: " + " ".join(lines[:2] if lines[0].endswith(":") else lines[:1])
    return "a stage failed without a message"


class Tally:
    """Cache hits and misses per stage over one run, for `golden-tasks stats`."""

    def __init__(self):
        self.hits, self.misses, self.cases = {}, {}, set()

    def add(self, stage: str, case: str, hit: bool) -> None:
        bucket = self.hits if hit else self.misses
        bucket[stage] = bucket.get(stage, 0) + 1
        self.cases.add(case)

    def to_json(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "cases": len(self.cases)}


def _num(value, fmt):
    return "-" if value is None else format(value, fmt)


def _speedup(row: CaseRow) -> str:
    """The speedup with its uncertainty (one standard error), when both timings have one."""
    if row.speedup is None:
        return "-"
    return f"{row.speedup:.2f}x" + ("" if row.speedup_err is None else f" ±{row.speedup_err:.2f}")


def format_table(rows: list) -> str:
    header = ["case", "status", *[s.name for s in STAGES], "max err", "kernel median us", "golden median us",
              "speedup"]
    body = [[r.case, r.status, *r.stages.values(), _num(r.max_abs, ".2e"), _num(r.kernel_us, ".1f"),
             _num(r.golden_us, ".1f"), _speedup(r)] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{r.case}: SKIPPED: {r.skipped}" for r in rows if r.skipped]
    lines += [f"{r.case}: WARNING: {w}" for r in rows for w in r.warnings]
    lines += [f"{r.case}: per rank, median us: " + ", ".join(f"{i}: {us:.1f}" for i, us in enumerate(r.rank_us))
              + (f"; LOAD IMBALANCE: {r.imbalance}" if r.imbalance else "") for r in rows if r.rank_us]
    lines += [f"{r.case}: FAIL at {r.reason}" + (f"  (all messages: {shown(r.log)})" if r.log else "")
              for r in rows if r.status == Verdict.FAIL]
    return "\n".join(lines)


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
    from . import junit  # noqa: PLC0415 -- only where a run's files are written

    # compact: json's C encoder (an indented record is encoded in Python, ten times slower); `python -m
    # json.tool runs/report.json` shows it indented
    _write_text(Path(runs_root) / "report.json", json.dumps(record.to_json(), sort_keys=True))
    junit.write(Path(runs_root) / "report.xml", record)


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
