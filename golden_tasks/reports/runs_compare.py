"""`golden-tasks compare A.json B.json`: two run records (runs/report.json), case by case.

First every status change: a case whose status differs (PASS -> FAIL, FAIL -> PASS, -> SKIPPED, ...),
a case new in B, a case only in A. Then one line per case present in both runs: the kernel's median round
time in A and in B, each with its relative standard error (records.Timing.median_rse), the ratio B/A with its
standard error, and a verdict.

The verdict. r = median_B / median_A. Its standard error combines the noise inside each run (the
medians' relative standard errors) with the noise between runs, which that does not see: two runs of
unchanged code on one machine differ by more than their rounds' spread (clock frequency, where the
process lands, memory layout). d = --drift (the between-run relative noise of one run, 3% by default,
measured on an idle machine: docs/comparing-runs.md) enters once per run:

    s = r * sqrt(rse_A^2 + rse_B^2 + 2 d^2)

With k = --sigmas (3) and the practical threshold t = --threshold (2%):

    SLOWER      r - 1 > k*s  and  r - 1 > t    (B is slower beyond the noise and by more than t)
    FASTER      1 - r > k*s  and  1 - r > t
    SAME        otherwise, if 1 - t <= r - k*s and r + k*s <= 1 + t (the whole interval r +- k*s lies
                within 1 +- t: any difference is too small to matter)
    UNCERTAIN   otherwise: the noise is too large to tell

A timing without a noise estimate (fewer than two rounds) makes its case UNCERTAIN; a case
without a kernel timing in either run (FAIL, SKIPPED) gets no verdict. A case whose bench entry has the
same key and the same timing (its figures and `samples`, the digest of its round times) in both runs was
not re-timed (B reused A's measurement from the cache): it is SAME.

Exit status: 1 when a case regressed, 0 when none did, 2 for bad input (a file missing, not JSON, or
not a run record; the message names the file and the field). What counts as a regression is
--fail-on: "status" (a case PASS in A is in B with another status), "slower" (a case SLOWER),
"any" (either; the default), "none" (nothing).
"""
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from ..model.records import BadRecord, CaseRow, RunRecord, Timing
from ..model.verdicts import Speed, Verdict
from ..pipeline.stage_table import StageName

FAIL_ON = ("any", "status", "slower", "none")


@dataclass(frozen=True)
class Change:
    """B's time over A's: the ratio, its standard error (None: unknown) and the verdict."""
    ratio: float
    err: float | None
    verdict: Speed

    def describe(self) -> str:
        return f"{self.ratio:.3f} ±{'?' if self.err is None else f'{self.err:.3f}'}"


DRIFT = 0.03  # --drift's default: see the module docstring


def judge(a: Timing, b: Timing, threshold: float = 0.02, sigmas: float = 3.0, drift: float = DRIFT) -> Change:
    """The verdict on B's timing against A's (the rule in the module docstring)."""
    ratio = b.median / a.median
    if a.median_rse is None or b.median_rse is None:
        return Change(ratio, None, Speed.UNCERTAIN)
    err = ratio * math.hypot(a.median_rse, b.median_rse, drift, drift)
    if ratio - 1 > sigmas * err and ratio - 1 > threshold:
        return Change(ratio, err, Speed.SLOWER)
    if 1 - ratio > sigmas * err and 1 - ratio > threshold:
        return Change(ratio, err, Speed.FASTER)
    if 1 - threshold <= ratio - sigmas * err and ratio + sigmas * err <= 1 + threshold:
        return Change(ratio, err, Speed.SAME)
    return Change(ratio, err, Speed.UNCERTAIN)


def load(path: Path) -> tuple[RunRecord, dict]:
    """The record at `path` and its rows by case, each checked for what the comparison reads; BadRecord if it
    is not a run record."""
    record, rows = RunRecord.read(path), {}
    for i, row in enumerate(record.cases):
        if row.case in rows:
            raise BadRecord(f"{path}: cases[{i}]: case {row.case!r} appears twice")
        if row.kernel_timing and row.kernel_timing.median == 0:
            raise BadRecord(f"{path}: cases[{i}].kernel_timing.median: a median round time of 0 us cannot be compared")
        rows[row.case] = row
    return record, rows


def _about(path: Path, record: RunRecord) -> str:
    """The file, with when and where the run was, where the record says."""
    started = record.started
    known = [time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if started is not None else None,
             record.machine.get("host")]
    return f"{path} ({', '.join(map(str, filter(None, known)))})" if any(known) else str(path)


def _setting_changes(a: RunRecord, b: RunRecord) -> list:
    """'machine.host: x -> y' for each machine or toolchain entry that differs between the records."""
    changes = []
    for part in ("machine", "toolchain"):
        old, new = getattr(a, part), getattr(b, part)
        changes += [f"{part}.{k}: {json.dumps(old.get(k))[:60]} -> {json.dumps(new.get(k))[:60]}"
                    for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return changes


def _status_line(case: str, a: CaseRow | None, b: CaseRow | None) -> str:
    if a is None:
        return f"{case}: new in B ({b.status})"
    if b is None:
        return f"{case}: only in A (was {a.status})"
    why = b.reason or b.skipped
    return f"{case}: {a.status} -> {b.status}" + (f": {why}" if why else "")


def _table(lines: list) -> list:
    widths = [max(len(x) for x in col) for col in zip(*lines)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in lines]


def _sol(row: CaseRow) -> str:
    """The fraction of the machine's speed of light the row's kernel reached ("-": none)."""
    return "-" if row.speed is None or row.speed.sol is None else f"{row.speed.sol:.2f}"


def _timings(cases: list, a_rows: dict, b_rows: dict, threshold: float, sigmas: float,
             drift: float) -> tuple[list, dict]:
    """The timing table of `cases` (in both runs) and the verdict of each case timed in both."""
    table, verdicts = [["case", "A median us", "B median us", "B/A", "A SOL", "B SOL", "verdict"]], {}
    # the fractions of the speed of light, where either run measured any (records from before have none)
    sol = any(row.speed and row.speed.sol is not None for rows in (a_rows, b_rows) for row in rows.values())
    for case in cases:
        a, b = a_rows[case], b_rows[case]
        ta, tb = a.kernel_timing, b.kernel_timing
        if ta is None or tb is None:
            missing = [f"{side} {row.status}" for side, row in (("A", a), ("B", b)) if row.kernel_timing is None]
            table.append([case, ta.describe() if ta else "-", tb.describe() if tb else "-", "-", _sol(a), _sol(b),
                          f"no kernel time: {', '.join(missing)}"])
            continue
        bench_key = a.keys.get(StageName.BENCH)
        if bench_key and bench_key == b.keys.get(StageName.BENCH) and ta == tb:
            change, note = Change(1.0, 0.0, Speed.SAME), " (one measurement: the same bench entry)"
        else:
            change = judge(ta, tb, threshold, sigmas, drift)
            note = " (no noise estimate: fewer than two rounds)" if change.err is None else ""
        verdicts[case] = change.verdict
        table.append([case, ta.describe(), tb.describe(), change.describe(), _sol(a), _sol(b), change.verdict + note])
    return _table([line if sol else line[:4] + line[6:] for line in table]), verdicts


def compare(a_path: Path, b_path: Path, threshold: float = 0.02, sigmas: float = 3.0,
            fail_on: str = "any", drift: float = DRIFT) -> tuple[str, int]:
    """The comparison's text and exit status (0: no regression, 1: a regression); BadRecord for bad input."""
    (a, a_rows), (b, b_rows) = load(a_path), load(b_path)
    lines = [f"A: {_about(a_path, a)}", f"B: {_about(b_path, b)}"]
    if settings := _setting_changes(a, b):
        lines += ["note: the runs differ in their machine or toolchain, and the timings with them:"]
        lines += [f"  {s}" for s in settings]
    order = [*a_rows, *(c for c in b_rows if c not in a_rows)]
    changed = [c for c in order if getattr(a_rows.get(c), "status", None) != getattr(b_rows.get(c), "status", None)]
    lines += ["", f"status changes: {len(changed) or 'none'}"]
    lines += [f"  {_status_line(c, a_rows.get(c), b_rows.get(c))}" for c in changed]
    no_longer_pass = [c for c in changed if c in b_rows and c in a_rows and a_rows[c].status == Verdict.PASS]

    both = [c for c in order if c in a_rows and c in b_rows]
    table, verdicts = _timings(both, a_rows, b_rows, threshold, sigmas, drift)
    lines += ["", *table] if both else ["", "no case in both runs"]
    counts = ", ".join(f"{list(verdicts.values()).count(v)} {v.lower()}" for v in Speed)
    lines += ["", f"cases in both runs: {len(both)}, timed in both: {len(verdicts)}: {counts} "
                  f"(FASTER/SLOWER: beyond {sigmas:g} standard errors and {threshold:.1%}; ± is one standard error, "
                  f"B/A's with {drift:.1%} of drift between runs)"]

    regressions = []
    if fail_on in ("any", "status"):
        regressions += [f"{c} ({a_rows[c].status} -> {b_rows[c].status})" for c in no_longer_pass]
    if fail_on in ("any", "slower"):
        regressions += [f"{c} (SLOWER)" for c, v in verdicts.items() if v == Speed.SLOWER]
    lines.append(f"REGRESSED: {', '.join(regressions)}" if regressions
                 else f"no regression (--fail-on {fail_on})")
    return "\n".join(lines), 1 if regressions else 0
