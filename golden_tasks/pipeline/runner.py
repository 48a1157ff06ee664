"""`golden_tasks.run`: the same pipeline and cache, scheduled in-process. Importing it imports no torch
(the pytest plugin's items verify cached cases with `verify` alone); `run` imports what it needs."""
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..model.errors import VerificationFailure
from ..model.plan import BenchSettings, FailedPlan, Plan
from ..model.records import CaseRow, Timing
from ..model.verdicts import StageState, Verdict
from ..project import config
from ..storage.store import Store
from . import cluster, graph, runtime, summary
from .execution import IMPORTED, CaseSource, Live, Producer, produce_here
from .stage_table import BY_NAME, STAGES, StageName
from .stored import load_timings
from .walker import Recorder, walk

if TYPE_CHECKING:
    from ..forms.base import KernelForm


@dataclasses.dataclass
class RunResult:
    """The outcome of one case: a view of its row (`report`, as doit's run record holds it), with its runtime
    dir, the seconds of the runs that made its entries and its timings with every round. `status` is the row's
    (PASS, FAIL, SKIPPED, INCOMPLETE); `passed` only when validation ran and passed; `skipped`: why a SKIPPED
    case was not verified here. A skip is not a failure: the result is true (bool) unless the case `failed`."""
    report: CaseRow  # the summary row
    work_dir: Path  # the case's runtime dir (written when it passes; see golden_tasks.pipeline.replay)
    timings: dict[str, float | None]  # stage -> seconds of the run that produced its entry
    bench: Timing | None  # the kernel's timing, with every round (None: not timed)
    golden_bench: Timing | None  # the golden's timing, with every round (None: not timed)
    baselines: list[CaseRow] = dataclasses.field(default_factory=list)  # the row of each baseline, in order

    @property
    def case(self) -> str:
        return self.report.case

    @property
    def status(self) -> Verdict:
        return self.report.status

    @property
    def stages(self) -> dict[str, StageState]:
        """stage -> StageState."""
        return self.report.stages

    @property
    def skipped(self) -> str | None:
        return self.report.skipped

    @property
    def passed(self) -> bool:
        return self.status == Verdict.PASS

    @property
    def failed(self) -> bool:
        return self.status.failed

    @property
    def error(self) -> str | None:
        """Every failure's message; for a case that did not pass without one, its status (and a skip's reason)."""
        row = self.report
        return "\n".join(row.errors.values()) or (f"SKIPPED: {row.skipped}" if row.skipped else None) \
            or (row.status if row.status != Verdict.PASS else None)

    def __bool__(self) -> bool:
        return not self.failed




def verify(plan: Plan | FailedPlan, store: Store, work_dir: Path, case: CaseSource = IMPORTED,
           producer: Producer | None = None, declared: dict[str, Any] | None = None
           ) -> tuple[CaseRow, dict[str, float | None]]:
    """Every stage of `plan` in graph order, each reused from `store` or computed, up to the first that
    fails; the runtime dir `work_dir` written when the case passes; the hits and misses logged.
    Returns (the summary row: summary.case_row, stage -> seconds of the run that made its entry).
    `case`: Live when the caller has the case (else imported where a stage runs its code); `producer`
    runs the stages that must run (execution.execute; cluster.producer: this run's executor); `declared`: the
    project's figures of its devices (project.layout.Layout.machine)."""
    walked = Recorder()
    if not plan.error:
        plan = cast(Plan, plan)  # only a FailedPlan has an error (Plan.error is None)
        lookups = graph.Lookups(plan, store)
        # every stage, a baseline's too: those it shares with its case are found under the same keys (or computed,
        # where its case's walk has not yet: a pytest item may run before its case's)
        if producer in (None, produce_here) and any(graph.remeasured(s, plan) or lookups.cached(s) is None
                                                    for s in STAGES):
            config.apply_threads()  # imports torch: not for a case whose every stage is cached
        walk(plan, store, STAGES, walked, case, producer)
    row = summary.case_row(plan, walked.states, walked.errors, store, failed=walked.worst, declared=declared)
    if row.status == Verdict.PASS and not plan.baseline_of:  # a baseline has no runtime dir
        plan = cast(Plan, plan)  # a FailedPlan's row is a FAIL (summary.case_row)
        if plan.fresh or not runtime.is_current(graph.Lookups(plan, store), work_dir):
            runtime.materialize(plan, store, work_dir, row)
    tally = summary.Tally()
    for stage, state in walked.states.items():
        if state.reached:
            tally.add(stage, plan.case, state == StageState.CACHED)
    store.log_run(tally.to_json())
    store.record_use({(stage, key) for stage, key in row.keys.items() if key})
    return row, walked.seconds


def run(fn: "KernelForm | str", specs: object, golden: object = None, *, name: str | None = None,
        cache_dir: Path | str | None = None, runs_dir: Path | str | None = None, executor: str | None = None,
        **options: Any) -> RunResult:
    """Verify one kernel through every stage, reusing and filling the cache.

    `fn` is a kernel form (a `@golden_tasks.jit` function), or the import path of one in a module
    this process must not import ("package.module:function": golden_tasks.forms.untrusted); `specs` a list of
    TensorSpec/ScalarSpec in parameter order (or a callable returning one).
    `options` are Case's, with its defaults: rtol, atol, compare, ignore_nan, seed,
    backend, options, warmup, rounds, min_rounds, max_rounds, rse, budget, flush, timeout,
    inputs_from, golden_from, file_deps, env_deps (relative paths are found from the current directory).
    `executor`: where the stages that must run run ("local", or "ray": on the Ray cluster at $RAY_ADDRESS,
    golden_tasks.pipeline.cluster); default $GOLDEN_TASKS_EXECUTOR, else local.
    Setup errors (ABI mismatch, bad specs, compile errors) and validation
    mismatches come back as a failed RunResult with a precise message.
    """
    context = config.current().given(lambda name, default: executor if name == "executor" else default,
                                     what="golden_tasks.run's argument")
    # torch's deprecation chatter is not the user's warnings
    with config.third_party_warnings_hidden(), config.entered(context):
        return _run(fn, specs, golden, name, cache_dir, runs_dir, options)


def _run(fn: "KernelForm | str", specs: object, golden: object, name: str | None,
         cache_dir: Path | str | None, runs_dir: Path | str | None, options: dict[str, Any]) -> RunResult:
    """run's work, with its options as a dict."""
    from ..forms.base import KernelForm  # noqa: PLC0415 -- as above
    from ..planning.case import Case, plans_of  # noqa: PLC0415 -- imports torch: not for verify's callers

    # Case's options that run() passes on, its bench settings last (its name, specs, kernel and golden are
    # run()'s arguments; its root is the current directory).
    timing_options = {f.name for f in dataclasses.fields(BenchSettings)}
    arguments = ("name", "specs", "kernel", "golden", "root",  # not a stage: Case's fields
                 "baseline_of", "sweep", "sweep_of", "point")  # a sweep is doit's: run() verifies one case
    run_options = sorted((f.name for f in dataclasses.fields(Case) if f.name not in arguments),
                         key=lambda name: name in timing_options)
    if not isinstance(fn, (KernelForm, str)):
        raise TypeError(f"fn must be a kernel form such as a @golden_tasks.jit function, or the import path "
                        f"of one, got {fn!r}")
    unknown = sorted(set(options) - set(run_options))
    if unknown:
        raise TypeError(f"run() got unknown options {', '.join(unknown)}; it takes {', '.join(run_options)}")
    case_name = name or (fn.partition(":")[2] if isinstance(fn, str) else fn.name)
    project = config.Project.at(cache=cache_dir, runs=runs_dir)
    store, work_dir = project.store, project.runs / case_name
    case: Case | None = None
    plan: Plan | FailedPlan
    baselines: list[Plan] = []
    try:
        case = Case(name=case_name, specs=specs, kernel=fn, golden=golden, **options).resolved()
        made, _ = plans_of(case, profile=config.profile())
        plan = made[0].for_this_run()
        baselines = [b.in_run_of(plan) for b in made[1:]]
    except VerificationFailure as exc:
        plan = FailedPlan(case_name, None, str(exc), config.profile())
    producer, declared = cluster.producer(Path.cwd()), project.layout.machine
    row, timings = verify(plan, store, work_dir, IMPORTED if case is None else Live(case), producer, declared)
    rows = [verify(b, store, work_dir, Live(c), producer, declared)[0]
            for b, c in zip(baselines, case.with_baselines()[1:])] if case else []
    summary.with_baselines([row, *rows])
    bench = golden_entry = None
    if isinstance(plan, Plan):
        lookups = graph.Lookups(plan, store)
        bench, golden_entry = (lookups.cached(BY_NAME[s]) for s in (StageName.BENCH, StageName.GOLDEN_BENCH))
    return RunResult(report=row, work_dir=work_dir, timings=timings,
                     bench=load_timings(store, bench).kernel_us if bench else None,
                     golden_bench=load_timings(store, golden_entry).golden_us if golden_entry else None,
                     baselines=rows)
