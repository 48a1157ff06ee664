"""The end-of-run summary: one row per case, as a table and as JSON."""
import json

from .graph import STAGES, snapshot
from .outputs import BenchMeta, Stats, ValidateMeta
from .plan import FailedPlan, Plan
from .store import atomic_write

# How a stage fared in this run.
RAN, CACHED, FAILED, NOT_RUN = "ran", "cached", "FAILED", "-"


def case_row(plan: Plan | FailedPlan, states: dict, errors: dict, store) -> dict:
    """The summary of one case from its stage states and its cached entries (the row of the run
    record: see docs/reports.md)."""
    row = {"case": plan.case, "stages": {s.name: states.get(s.name, NOT_RUN) for s in STAGES},
           "max_abs": None, "outputs": [], "warnings": [], "kernel_us": None, "golden_us": None, "speedup": None,
           "speedup_err": None, "kernel_timing": None, "golden_timing": None, "rank_us": None, "imbalance": None,
           "keys": {}, "seconds": None, "errors": errors, "skipped": None}
    if plan.error:
        row.update(status="FAIL", stages={s.name: NOT_RUN for s in STAGES}, errors={"plan": plan.error})
        return row
    entries = snapshot(plan, store)
    row["keys"] = {name: entry and entry.key for name, entry in entries.items()}
    row["seconds"] = sum(Stats.of(entries[name]).seconds or 0.0 for name, state in row["stages"].items()
                         if state == RAN and entries[name])
    validate, bench, timed_golden = entries["validate"], entries["bench"], entries["golden_bench"]
    verdict = validate and ValidateMeta.of(validate)
    if verdict:
        row.update(max_abs=verdict.max_abs, outputs=verdict.outputs, warnings=list(verdict.warnings))
    if bench and (second := BenchMeta.of(bench).second_set) and second != "checked":
        row["warnings"].append(f"the benchmark's second input set was {second}")
    if timed_golden and (timing := Stats.of(timed_golden).golden_us):
        row.update(golden_us=timing["median"], golden_timing=timing)
    if bench and (timing := Stats.of(bench).kernel_us):  # a skipped bench has none
        row.update(kernel_us=timing["median"], kernel_timing=timing)  # several ranks: of each round's slowest rank
        if "ranks" in timing:
            row["rank_us"] = [r["median"] for r in timing["ranks"]]
            row["imbalance"] = timing["imbalance"]
    if row["kernel_us"] and row["golden_us"]:
        row["speedup"] = row["golden_us"] / row["kernel_us"]
        noise = [t["rse"] for t in (row["kernel_timing"], row["golden_timing"])]
        if None not in noise:  # relative standard errors add in quadrature
            row["speedup_err"] = row["speedup"] * (noise[0] ** 2 + noise[1] ** 2) ** 0.5
    if errors or FAILED in row["stages"].values():
        row["status"] = "FAIL"
    elif verdict and verdict.skipped:
        row.update(status="SKIPPED", skipped=verdict.skipped)
    elif validate and bench:
        row["status"] = "PASS"
    else:
        row["status"] = "INCOMPLETE"
    return row


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


def format_table(rows: list) -> str:
    header = ["case", "status", *[s.name for s in STAGES], "max err", "kernel us", "golden us", "speedup"]
    body = [[r["case"], r["status"], *r["stages"].values(), _num(r["max_abs"], ".2e"),
             _num(r["kernel_us"], ".1f"), _num(r["golden_us"], ".1f"),
             "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"{r['case']}: SKIPPED: {r['skipped']}" for r in rows if r["skipped"]]
    lines += [f"{r['case']}: per rank, median us: " + ", ".join(f"{i}: {us:.1f}" for i, us in enumerate(r["rank_us"]))
              + (f"; LOAD IMBALANCE: {r['imbalance']}" if r["imbalance"] else "") for r in rows if r["rank_us"]]
    return "\n".join(lines)


def write_json(path, rows: list) -> None:
    text = json.dumps({"cases": rows, "passed": all(r["status"] == "PASS" for r in rows)},
                      indent=1, sort_keys=True).encode()
    atomic_write(path, lambda f: f.write(text))
