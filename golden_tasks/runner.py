"""`golden_tasks.run`: the same pipeline and cache, scheduled in-process."""
import dataclasses
import traceback
from pathlib import Path

from . import config, graph, report, runtime
from .case import Case, plan_of
from .errors import VerificationFailure
from .forms import KernelForm
from .outputs import Stats
from .plan import FailedPlan


@dataclasses.dataclass
class RunResult:
    """The outcome of one case: `passed` only when validation ran and passed."""
    passed: bool
    error: str
    case: str
    stages: dict  # stage -> "ran" | "cached" | "FAILED" | "-"
    timings: dict  # stage -> seconds of the run that produced its entry
    work_dir: Path  # the case's runtime dir (written when it passes; see golden_tasks.replay)
    bench: dict  # kernel timing stats (us)
    golden_bench: dict  # golden timing stats (us)
    report: dict  # the summary row

    def __bool__(self):
        return self.passed


def run(fn, specs, golden=None, *, name=None, rtol=1e-5, atol=1e-8, compare=None, ignore_nan=False,
        seed=0, backend=None, options=None, warmup=5, rounds=100, timeout=60.0, inputs_from=None,
        golden_from=None, file_deps=(), env_deps=(), cache_dir=None, runs_dir=None) -> RunResult:
    """Verify one kernel through every stage, reusing and filling the cache.

    `fn` is a kernel form (a `@golden_tasks.jit` function); `specs` a list of
    TensorSpec/ScalarSpec in parameter order (or a callable returning one).
    `inputs_from` / `golden_from`: data directories to read inputs (in/<name>.pt)
    / golden outputs (out/<name>.pt) from instead of generating them.
    `timeout`: seconds one kernel call may take before it fails as hung.
    `file_deps` / `env_deps`: files (relative to the cwd; globs allowed) and environment
    variables the kernel, golden or comparators read when called (see Case).
    Setup errors (ABI mismatch, bad specs, compile errors) and validation
    mismatches come back as a failed RunResult with a precise message.
    """
    if not isinstance(fn, KernelForm):
        raise TypeError(f"fn must be a kernel form such as a @golden_tasks.jit function, got {fn!r}")
    case_name = name or fn.name
    store = config.open_store(cache_dir=cache_dir)
    work_dir = (Path(runs_dir).resolve() if runs_dir else config.runs_root()) / case_name
    states, errors, timings = {}, {}, {}
    try:
        case = Case(name=case_name, specs=specs, kernel=fn, golden=golden, rtol=rtol, atol=atol,
                    compare=dict(compare or {}), ignore_nan=ignore_nan, seed=seed, backend=backend,
                    options=dict(options or {}), warmup=warmup, rounds=rounds, timeout=timeout,
                    inputs_from=inputs_from, golden_from=golden_from, file_deps=tuple(file_deps),
                    env_deps=tuple(env_deps)).resolved()
        plan = plan_of(case, profile=config.profile())[0].for_this_run()
    except VerificationFailure as exc:
        plan = FailedPlan(case_name, None, str(exc), config.profile())
    if not plan.error:
        config.apply_threads()
        for stage in graph.STAGES:
            try:
                entry, ran = graph.execute(stage, plan, store, case)
            except Exception as exc:  # noqa: BLE001 -- a stage's failure is its row, never the caller's exception
                detail = "" if isinstance(exc, VerificationFailure) else "\n" + traceback.format_exc()
                states[stage.name], errors[stage.name] = report.FAILED, f"{exc}{detail}"
                break
            states[stage.name] = report.RAN if ran else report.CACHED
            timings[stage.name] = Stats.of(entry).seconds
    row = report.case_row(plan, states, errors, store)
    if row["status"] == "PASS":
        runtime.materialize(plan, store, work_dir, row)
    tally = report.Tally()
    for stage, state in row["stages"].items():
        if state in (report.RAN, report.CACHED):
            tally.add(stage, case_name, state == report.CACHED)
    store.log_run(tally.to_json())
    bench, golden_entry = (graph.cached(graph.BY_NAME[s], plan, store) if not plan.error else None
                           for s in ("bench", "golden"))
    return RunResult(
        passed=row["status"] == "PASS",
        error="\n".join(row["errors"].values()) or (f"SKIPPED: {row['skipped']}" if row["skipped"] else None)
        or (row["status"] if row["status"] != "PASS" else None),
        case=case_name, stages=row["stages"], timings=timings, work_dir=work_dir,
        bench=(bench and Stats.of(bench).kernel_us) or {},
        golden_bench=(golden_entry and Stats.of(golden_entry).golden_us) or {},
        report=row)
