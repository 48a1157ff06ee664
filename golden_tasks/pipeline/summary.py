"""A case's summary in a run: its row of the run record (records.CaseRow), built from its stage states in the
run and its cached entries, and the tally of cache hits over a run. Both runners make them: the doit adapter
(frontends.doit_session) and golden_tasks.run (runner)."""
import dataclasses
from collections.abc import Mapping
from typing import Any

from ..model.machine import speed
from ..model.outputs import SAMPLES_FILE, BenchMeta, CompileMeta, GoldenMeta, MachineMeta, Stats, ValidateMeta, Worst
from ..model.plan import FailedPlan, Plan
from ..model.records import CaseRow, Speed, Timing
from ..model.verdicts import StageState, Verdict
from ..model.work import Work
from ..storage.entry import Entry
from ..storage.store import Store
from .graph import Lookups, computed_by
from .stage_table import STAGES, StageName


def case_row(plan: Plan | FailedPlan, states: Mapping[str, StageState], errors: dict[str, str], store: Store,
             known: dict[str, Entry] | None = None, failed: Worst | None = None,
             declared: dict[str, Any] | None = None) -> CaseRow:
    """The summary of one case from its stage states and its cached entries; `known`: entries already
    found under their current keys (graph.Lookups); `failed`: what a validation that failed in this run found at worst
    (errors.StageFailed.worst); `declared`: the project's figures of its devices (Layout.machine), which its
    speed then uses."""
    stages: dict[str, StageState] = {s.name: states.get(s.name, StageState.NOT_RUN) for s in STAGES}
    if isinstance(plan, FailedPlan):
        return CaseRow(case=plan.case, status=Verdict.FAIL, stages=dict.fromkeys(stages, StageState.NOT_RUN),
                       errors={"plan": plan.error}, reason=_first_failure({"plan": plan.error}), sweep_of=plan.sweep_of)
    entries = Lookups(plan, store, known).snapshot()
    row = CaseRow(case=plan.case, status=Verdict.INCOMPLETE, stages=stages, errors=errors, baseline_of=plan.baseline_of,
                  sweep_of=plan.sweep_of, point=dict(plan.point), dataset=dict(plan.dataset),
                  golden_protected=plan.golden_protected,
                  keys={name: entry.key if entry else None for name, entry in entries.items()},
                  fingerprints={"kernel": plan.kernel, "policy": plan.policy, "golden": plan.golden},  # not a stage
                  seconds=sum(Stats.of(entry).seconds or 0.0 for name, state in stages.items()
                              if state == StageState.RAN and (entry := entries[name])))
    for name, state in stages.items():
        if state.reached and (entry := entries[name]) and entry.meta.get("skipped"):
            stages[name] = StageState.SKIPPED
    validate, bench, timed_golden = (entries[StageName.VALIDATE], entries[StageName.BENCH],
                                     entries[StageName.GOLDEN_BENCH])
    compiled = entries[StageName.COMPILE]
    row.config = (compiled and CompileMeta.of(compiled).config) or None
    verdict = ValidateMeta.of(validate) if validate else None
    if verdict:
        row.max_abs, row.outputs, row.warnings = verdict.max_abs, verdict.outputs, list(verdict.warnings)
    elif failed:
        row.max_abs = failed.max_abs
        row.unwritten, row.nan, row.inf = (n or None for n in (failed.unwritten, failed.nan, failed.inf))
    if bench and (second := BenchMeta.of(bench).second_set) and second != "checked":
        row.warnings.append(f"the benchmark's second input set was {second}")
    row.caveat = caveat = (bench and BenchMeta.of(bench).caveat) or None
    if caveat:
        row.warnings.append(f"its time was {caveat}")
    row.golden_timing = _timing(timed_golden, "golden_us") if timed_golden else None
    # several ranks: of each round's slowest rank; a skipped bench has none
    row.kernel_timing = kernel_timing = _timing(bench, "kernel_us") if bench else None
    row.golden_us = row.golden_timing.median if row.golden_timing else None
    row.kernel_us = kernel_timing.median if kernel_timing else None
    if kernel_timing and kernel_timing.ranks:
        row.rank_us = [rank.median for rank in kernel_timing.ranks]
        row.imbalance = kernel_timing.imbalance
    row.speed = _speed(plan, entries, None if caveat else kernel_timing, declared)
    if errors or StageState.FAILED in stages.values():
        row.status, row.reason = Verdict.FAIL, _first_failure(errors)
    elif verdict and verdict.skipped:
        row.status, row.skipped = Verdict.SKIPPED, verdict.skipped
    elif validate and bench:
        row.status = Verdict.PASS
    return row


def walked(plan: Plan | FailedPlan, states: Mapping[str, Mapping[str, StageState]],
           errors: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, StageState], dict[str, str]]:
    """A case's stage states and failures in a run (`states`, `errors`: case -> stage -> its own), with those of
    the stages its plan shares with another's that computed them (a baseline's case: graph.computed_by)."""
    if isinstance(plan, FailedPlan):
        return dict(states.get(plan.case, {})), dict(errors.get(plan.case, {}))
    owners = {s.name: computed_by(plan, s) for s in STAGES}
    return ({name: state for name, owner in owners.items() if (state := states.get(owner, {}).get(name))},
            {name: error for name, owner in owners.items() if (error := errors.get(owner, {}).get(name))})


def sweeps_of(rows: list[CaseRow]) -> dict[str, list[CaseRow]]:
    """Each sweep's name -> its points' rows and their baselines' rows (Case.sweep), in the order of `rows`."""
    found: dict[str, list[CaseRow]] = {}
    for row in rows:
        if row.sweep_of:
            found.setdefault(row.sweep_of, []).append(row)
    return found


def with_baselines(rows: list[CaseRow]) -> list[CaseRow]:
    """`rows` (in library order: a case's baselines follow it), each case's speedup set over the first of its
    baselines that passed with a timing (its median over the kernel's, their relative standard errors added in
    quadrature), and a warning for each baseline before it that did not pass."""
    baselines: dict[str, list[CaseRow]] = {}  # case -> its baselines' rows, in order: one pass, at any library size
    for row in rows:
        if row.baseline_of:
            baselines.setdefault(row.baseline_of, []).append(row)
    for row in rows:
        if row.baseline_of or row.kernel_us is None or row.caveat or row.status == Verdict.FAIL:
            continue
        for base in baselines.get(row.case, ()):
            name = base.case.removeprefix(f"{row.case}@")
            if base.status != Verdict.PASS or not base.kernel_us or base.caveat:
                if base.status in (Verdict.FAIL, Verdict.INCOMPLETE):
                    row.warnings.append(f"its baseline {name} is {base.status}, so no speedup is over it: see "
                                        f"{base.case}")
                continue
            row.baseline, row.speedup = name, base.kernel_us / row.kernel_us
            noise = [timing.median_rse if timing else None for timing in (row.kernel_timing, base.kernel_timing)]
            if noise[0] is not None and noise[1] is not None:
                row.speedup_err = row.speedup * (noise[0] ** 2 + noise[1] ** 2) ** 0.5
            break
    return rows


def _timing(entry: Entry, field: str) -> Timing | None:
    """The entry's timing summary, with the digest of the object that holds its round times ("samples")."""
    timing: Timing | None = getattr(Stats.of(entry), field)  # a Stats field: kernel_us or golden_us
    record = entry.objects.get(SAMPLES_FILE)
    return timing and dataclasses.replace(timing, samples=None if record is None else record.digest)


def _speed(plan: Plan, entries: Mapping[str, Entry | None], timing: Timing | None,
           declared: dict[str, Any] | None) -> Speed | None:
    """The case's work, and what `timing` (None: no figure) makes of it against the machine's limits measured on
    its device (model.machine.speed); None for a plan from before work was counted."""
    if not plan.work:
        return None
    work, golden, calibrated = (Work.from_json(plan.work), entries[StageName.GOLDEN], entries[StageName.CALIBRATE])
    flops = work.flops(GoldenMeta.of(golden).flops if golden else None)
    device, threads = (timing.device or "cpu", timing.threads) if timing else ("cpu", None)
    limits = MachineMeta.of(calibrated).of_device(device, threads, declared) if calibrated else None
    return speed(work.bytes, "specs" if work.declared_bytes is None else "declared", flops,
                 None if flops is None else "counted" if work.declared_flops is None else "declared",
                 work.working_set, work.dtype, limits, timing.median if timing else None,
                 timing.median_rse if timing else None)


def first_line(text: object) -> str:
    """The first line of `text` that is not blank, stripped."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _first_failure(errors: dict[str, str]) -> str:
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

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.misses: dict[str, int] = {}
        self.cases: set[str] = set()

    def add(self, stage: str, case: str | None, hit: bool) -> None:
        """A check of `stage` of `case` (None: of a stage every case shares, graph.MACHINE's)."""
        bucket = self.hits if hit else self.misses
        bucket[stage] = bucket.get(stage, 0) + 1
        if case is not None:
            self.cases.add(case)

    def to_json(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "cases": len(self.cases)}


def origin(dataset: dict[str, Any]) -> str:
    """Where a dataset's case (Plan.dataset) comes from, as its FAIL line names it: the definition and the
    workload, or the problem."""
    if "workload" in dataset:
        return f"definition {dataset['definition']}, workload {dataset['workload'].get('uuid')}"
    return f"problem {dataset.get('problem')}"


def resized(dataset: dict[str, Any]) -> str:
    """The sizes a dataset's case ran at where they are not the dataset's, and the dataset's."""
    def sizes(values: dict[str, Any], only: dict[str, Any]) -> str:
        return ", ".join(f"{name}={value}" for name, value in values.items() if name in only)
    declared = dataset["declared"]
    return f"ran at {sizes(dataset['sizes'], declared)} (the dataset's: {sizes(declared, declared)})"
