"""`golden-tasks compare A.json B.json`: two run records (runs/report.json), case by case.

First every status change: a case whose status differs (PASS -> FAIL, FAIL -> PASS, -> SKIPPED, ...),
a case new in B, a case only in A. Then one line per case present in both runs: the kernel's median round
time in A and in B, each with its relative standard error (outputs.median_rse), the ratio B/A with its
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

from .outputs import median_rse
from .verdicts import Speed, Verdict

FAIL_ON = ("any", "status", "slower", "none")


class BadRecord(ValueError):
    """A file that is not a readable run record; the message names the file and the field."""


@dataclass(frozen=True)
class Timing:
    """A kernel's median round time (us) and the relative standard error of that median (None: unknown)."""
    median: float
    rse: float | None

    def describe(self) -> str:
        noise = "?" if self.rse is None else f"{self.rse:.1%}"
        return f"{self.median:.2f} ±{noise}"


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
    if a.rse is None or b.rse is None:
        return Change(ratio, None, Speed.UNCERTAIN)
    err = ratio * math.hypot(a.rse, b.rse, drift, drift)
    if ratio - 1 > sigmas * err and ratio - 1 > threshold:
        return Change(ratio, err, Speed.SLOWER)
    if 1 - ratio > sigmas * err and 1 - ratio > threshold:
        return Change(ratio, err, Speed.FASTER)
    if 1 - threshold <= ratio - sigmas * err and ratio + sigmas * err <= 1 + threshold:
        return Change(ratio, err, Speed.SAME)
    return Change(ratio, err, Speed.UNCERTAIN)


def _number(value, path: Path, field: str, low: float, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < math.inf:
        raise BadRecord(f"{path}: {field}: expected a finite number >= {low:g}, got {json.dumps(value)}")
    return value


def _timing(row: dict, path: Path, field: str) -> Timing | None:
    timing = row.get("kernel_timing")
    if timing is None:
        return None
    if not isinstance(timing, dict):
        raise BadRecord(f"{path}: {field}: expected an object, got {json.dumps(timing)}")
    median = _number(timing.get("median"), path, f"{field}.median", 0)
    if median == 0:
        raise BadRecord(f"{path}: {field}.median: a median round time of 0 us cannot be compared")
    _number(timing.get("iqr"), path, f"{field}.iqr", 0, allow_none=True)
    return Timing(median, median_rse(timing))


def load(path: Path) -> dict:
    """The record at `path`, its "cases" as {case: row}, each row checked for what the comparison reads and
    given its "timing" (Timing or None); BadRecord if it is not a run record."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadRecord(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadRecord(f"{path}: not JSON: {exc}") from None
    if not isinstance(record, dict) or not isinstance(record.get("cases"), list):
        raise BadRecord(f"{path}: not a golden-tasks run record (runs/report.json): it has no list of cases")
    rows = {}
    for i, row in enumerate(record["cases"]):
        field = f"cases[{i}]"
        if not isinstance(row, dict) or not isinstance(row.get("case"), str):
            raise BadRecord(f"{path}: {field}: expected an object with a case name")
        try:
            status = Verdict(row.get("status"))
        except ValueError:
            raise BadRecord(f"{path}: {field}.status: expected one of {', '.join(Verdict)}, "
                            f"got {json.dumps(row.get('status'))}") from None
        if row["case"] in rows:
            raise BadRecord(f"{path}: {field}: case {row['case']!r} appears twice")
        rows[row["case"]] = dict(row, status=status, timing=_timing(row, path, f"{field}.kernel_timing"))
    record["cases"] = rows
    return record


def _about(path: Path, record: dict) -> str:
    """The file, with when and where the run was, where the record says."""
    started, host = record.get("started"), (record.get("machine") or {}).get("host")
    known = [time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float))
             else None, host]
    return f"{path} ({', '.join(map(str, filter(None, known)))})" if any(known) else str(path)


def _setting_changes(a: dict, b: dict) -> list:
    """'machine.host: x -> y' for each machine or toolchain entry that differs between the records."""
    changes = []
    for part in ("machine", "toolchain"):
        old, new = a.get(part) or {}, b.get(part) or {}
        changes += [f"{part}.{k}: {json.dumps(old.get(k))[:60]} -> {json.dumps(new.get(k))[:60]}"
                    for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return changes


def _status_line(case: str, a: dict | None, b: dict | None) -> str:
    if a is None:
        return f"{case}: new in B ({b['status']})"
    if b is None:
        return f"{case}: only in A (was {a['status']})"
    why = b.get("reason") or b.get("skipped")
    return f"{case}: {a['status']} -> {b['status']}" + (f": {why}" if why else "")


def _table(lines: list) -> list:
    widths = [max(len(x) for x in col) for col in zip(*lines)]
    return ["  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in lines]


def _timings(cases: list, a_rows: dict, b_rows: dict, threshold: float, sigmas: float,
             drift: float) -> tuple[list, dict]:
    """The timing table of `cases` (in both runs) and the verdict of each case timed in both."""
    table, verdicts = [["case", "A median us", "B median us", "B/A", "verdict"]], {}
    for case in cases:
        a, b = a_rows[case], b_rows[case]
        ta, tb = a["timing"], b["timing"]
        if ta is None or tb is None:
            missing = [f"{side} {row['status']}" for side, row in (("A", a), ("B", b)) if row["timing"] is None]
            table.append([case, ta.describe() if ta else "-", tb.describe() if tb else "-", "-",
                          f"no kernel time: {', '.join(missing)}"])
            continue
        bench_key = (a.get("keys") or {}).get("bench")
        if bench_key and bench_key == (b.get("keys") or {}).get("bench") and a["kernel_timing"] == b["kernel_timing"]:
            change, note = Change(1.0, 0.0, Speed.SAME), " (one measurement: the same bench entry)"
        else:
            change = judge(ta, tb, threshold, sigmas, drift)
            note = " (no noise estimate: fewer than two rounds)" if change.err is None else ""
        verdicts[case] = change.verdict
        table.append([case, ta.describe(), tb.describe(), change.describe(), change.verdict + note])
    return _table(table), verdicts


def compare(a_path: Path, b_path: Path, threshold: float = 0.02, sigmas: float = 3.0,
            fail_on: str = "any", drift: float = DRIFT) -> tuple[str, int]:
    """The comparison's text and exit status (0: no regression, 1: a regression); BadRecord for bad input."""
    a, b = load(a_path), load(b_path)
    a_rows, b_rows = a["cases"], b["cases"]
    lines = [f"A: {_about(a_path, a)}", f"B: {_about(b_path, b)}"]
    if settings := _setting_changes(a, b):
        lines += ["note: the runs differ in their machine or toolchain, and the timings with them:"]
        lines += [f"  {s}" for s in settings]
    order = [*a_rows, *(c for c in b_rows if c not in a_rows)]
    changed = [c for c in order if (a_rows.get(c) or {}).get("status") != (b_rows.get(c) or {}).get("status")]
    lines += ["", f"status changes: {len(changed) or 'none'}"]
    lines += [f"  {_status_line(c, a_rows.get(c), b_rows.get(c))}" for c in changed]
    no_longer_pass = [c for c in changed if c in b_rows and a_rows.get(c, {}).get("status") == Verdict.PASS]

    both = [c for c in order if c in a_rows and c in b_rows]
    table, verdicts = _timings(both, a_rows, b_rows, threshold, sigmas, drift)
    lines += ["", *table] if both else ["", "no case in both runs"]
    counts = ", ".join(f"{list(verdicts.values()).count(v)} {v.lower()}" for v in Speed)
    lines += ["", f"cases in both runs: {len(both)}, timed in both: {len(verdicts)}: {counts} "
                  f"(FASTER/SLOWER: beyond {sigmas:g} standard errors and {threshold:.1%}; ± is one standard error, "
                  f"B/A's with {drift:.1%} of drift between runs)"]

    regressions = []
    if fail_on in ("any", "status"):
        regressions += [f"{c} ({a_rows[c]['status']} -> {b_rows[c]['status']})" for c in no_longer_pass]
    if fail_on in ("any", "slower"):
        regressions += [f"{c} (SLOWER)" for c, v in verdicts.items() if v == Speed.SLOWER]
    lines.append(f"REGRESSED: {', '.join(regressions)}" if regressions
                 else f"no regression (--fail-on {fail_on})")
    return "\n".join(lines), 1 if regressions else 0
