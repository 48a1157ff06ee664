# ruff: noqa: E402
"""The doit adapter: each case's stages as doit tasks `<stage>:<case>`, loaded by a dodo.py (tasks_for)
or, without one, by the loader plugin (ProjectLoader).

Runs in the doit parent, which must stay light: it reads plans and entry manifests, never torch or the
kernel modules. The parts: the session of this doit process (doit_session: the command line, the library,
the run's journal and record), the up-to-date checks (doit_checks: cache lookups of each task's current
key), the console reporter (doit_reporter), and here the tasks and their actions, which run the stage
through execution.execute (in doit's worker processes with -n N) and journal their outcome.

Every run that verifies cases writes its record (report.write_files: runs/report.json and
runs/<case>.log, the full messages of each failing case) whatever reporter doit uses; an interrupted
run (Ctrl-C) writes nothing: the files stay those of the last complete run.
"""
import sys


def _plain_interrupt(kind, value, tb, previous=sys.excepthook):
    """Ctrl-C ends the doit parent with a line, not a traceback: installed as this module is imported (by
    the dodo.py or the loader plugin), before anything else of ours loads; what runs before it (the
    interpreter's start, doit's own imports) is not ours to hook."""
    if not issubclass(kind, KeyboardInterrupt):
        return previous(kind, value, tb)
    started = sys.modules.get("golden_tasks.frontends.doit_session")  # not yet while our imports load
    session = started and started.current
    if session and session.journal_path:
        # doit ends its workers when the interrupt reaches it while they run; not always so when it reaches
        # it later (Python may run the handler only after doit stopped waiting for them), and this exit
        # would then wait for ever for a worker that waits for its next task (multiprocessing joins them).
        reaper.kill(reaper.children(os.getpid()), signal.SIGTERM)
    report_json = session and session.journal_path and session.project.runs / "report.json"
    kept = f"; {report_json} is still the last complete run's" if report_json and report_json.exists() else ""
    sys.stderr.write(f"\ngolden-tasks: interrupted{kept}\n")


# before the other imports (E402 below): an interrupt while they load is one line too
sys.excepthook = _plain_interrupt

import atexit
import difflib
import gc
import os
import signal
from pathlib import Path

from doit import get_var
from doit.cmd_base import NamespaceTaskLoader
from doit.exceptions import TaskFailed

from ..model.plan import VARIABLES
from ..model.verdicts import StageState
from ..pipeline import cluster, graph, runtime
from ..pipeline.execution import produce_here
from ..pipeline.stage_table import BY_NAME, STAGES
from ..pipeline.summary import first_line
from ..pipeline.walker import Events, StageError, walk
from ..planning.discover import forget
from ..planning.library import unknown_variables
from ..project import config, reaper
from . import doit_session
from .doit_checks import CaseVerified, Planned, RuntimeCurrent, StageCached, UpToDate
from .doit_reporter import SummaryReporter
from .doit_session import PLAN, PYTHONS_THRESHOLDS, VERIFY, CommandLine, Session, usage_error

_ready = {}  # what this process has set up: {"worker", "threads", "collects"} -> its pid


def _ready_to_run(torch_stage: bool) -> None:
    """Once per process: a -n worker ends with the doit parent, and everything it started with it
    (a `kill -9` of the parent alone leaves no compiler or kernel running); a process that computes
    with torch sizes its thread pools; one that runs stages collects garbage as Python does."""
    pid = os.getpid()
    if pid != doit_session.current.parent and _ready.get("worker") != pid:
        reaper.own_tree_until_parent_dies()
        _ready["worker"] = pid
    if torch_stage and _ready.get("threads") != pid:
        config.apply_threads()
        _ready["threads"] = pid
    if _ready.get("collects") != pid:
        gc.set_threshold(*PYTHONS_THRESHOLDS)
        _ready["collects"] = pid


def _outcome(task: str, message: str = None, worst=None, state: StageState = StageState.RAN):
    """A task action's result for doit, journaled: True (its `state`), or TaskFailed with `message` (and what a
    failed validation found at worst: outputs.Worst)."""
    doit_session.current.journal(task, StageState.FAILED if message else state, message, worst)
    return TaskFailed(f"{task}: {message}") if message else True


class _Journaled(Events):
    """A stage task's walk, journaled as the outcome of the task `<stage>:<case>` (a stale plan makes the case be
    planned again)."""

    def __init__(self, session: Session, case: str):
        self.session, self.case, self.result = session, case, None

    def cached(self, stage, entry) -> None:  # computed meanwhile by another process that held its key's lock
        self.result = _outcome(f"{stage.name}:{self.case}", state=StageState.CACHED)

    def ran(self, stage, entry) -> None:
        self.result = _outcome(f"{stage.name}:{self.case}")

    def failed(self, stage, error: StageError) -> None:
        if error.stale and (plan := self.session.library.plans.get(self.case)):
            forget(self.session.root, self.session.library.store, plan.module)
        self.result = _outcome(f"{stage.name}:{self.case}", error.message, error.worst)


# The tasks' actions. They find this process's session (inherited from the doit parent) in
# doit_session.current: doit's workers run the tasks they were forked with, named by their arguments.

def _run_stage(stage: str, case: str, plan: str):
    """The task `<stage>:<case>`, walked with the plan of `plan` (the case's own, or for a stage every case
    shares, graph.MACHINE's task, the first planned case's)."""
    session = doit_session.current
    try:
        producer = cluster.producer(session.root)
        _ready_to_run(BY_NAME[stage].torch and producer is produce_here)  # a Ray driver needs no torch
    except ValueError as exc:  # a bad setting: named in its message
        return _outcome(f"{stage}:{case}", str(exc))
    journaled = _Journaled(session, case)
    walk(session.library.plans[plan], session.library.store, [BY_NAME[stage]], journaled, producer=producer)
    return journaled.result


def _materialize(case: str):
    session = doit_session.current
    try:
        runtime.materialize(session.library.plans[case], session.library.store, session.project.runs / case)
    except (OSError, RuntimeError) as exc:
        return _outcome(f"runtime:{case}", f"cannot write the runtime dir: {exc}")
    return _outcome(f"runtime:{case}")


def _replay(case: str):
    from ..pipeline import replay  # noqa: PLC0415 -- imports torch: only when a replay runs

    _ready_to_run(torch_stage=True)  # it calls the kernel, as bench does
    session = doit_session.current
    return replay.main(session.project.runs / case, session.root) == 0


def _plan_action(case: str, error: str):
    return _outcome(f"{PLAN}:{case}", error)


def _check_names(line: CommandLine, names: set, unplanned: list) -> None:
    """A task argument that names no task ends the run with the closest names (doit would say only
    that it is not a task), or, when a kernel module could not be planned (`unplanned`: its failed
    plans), with why: its cases are not known."""
    for arg in line.tasks:
        if "*" in arg or arg in names:
            continue
        close = difflib.get_close_matches(arg, names, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `doit list` shows the tasks"
        if unplanned:
            hint += "".join(f"; {p.module} could not be planned, so its cases are not known: "
                            f"{first_line(p.error)}" for p in unplanned)
        usage_error(f"no task {arg!r}{hint}")


# The doit variables (NAME=VALUE after the task names) by name, for `doit help <task>`.
VARIABLE_HELP = {
    "backend": "eager|aoti: compile every case with this backend (empty: each case's own)",
    "options": "JSON object: inductor options merged over each case's",
    "timeout": "seconds a kernel or golden call may take before it counts as hung (default 60)",
    "warmup": "untimed calls before the timed rounds (fewer when they spend a quarter of the budget)",
    "rounds": "a fixed number of timed rounds (default: until the noise target or the budget)",
    "rse": "noise target: time until the mean's relative standard error is this (default 0.01)",
    "budget": "seconds of timed rounds for each of the kernel and the golden (default 2)",
    "flush": "1: evict the last-level cache (a GPU's L2) before every round",
    "fresh": "1: measure the timings again (every verdict stays cached)",
    "profile": f"size profile of kernel modules that have them (${config.PROFILE_ENV}, default "
               f"{config.DEFAULT_PROFILE!r})",
    "ranks": f"world size of every multi-rank case (${config.RANKS_ENV}; default: each case's own)",
    "sandbox": f"auto (default), required (refuse to run a kernel this machine cannot confine) or off "
               f"(${config.SANDBOX_ENV})",
    "executor": "local (default) or ray: run each stage that must run as a task on a Ray cluster (docs/cluster.md)",
    "ray_address": f"the Ray cluster executor=ray submits to (${config.RAY_ADDRESS_ENV}; none: a local one)",
    "baselines": f"0: verify the kernels alone, timing none of their baselines (${config.BASELINES_ENV}; default 1)",
}


def _print_variables() -> None:
    """After `doit help <task>`, which knows only a task's first doc line and its --options."""
    names = [*VARIABLES, *config.RunContext.VARIABLES]
    width = max(map(len, names)) + 2
    print("\nvariables, as NAME=VALUE after the task names (`doit verify:rms_norm rounds=20`):")
    for name in names:
        print(f"  {name:<{width}}{VARIABLE_HELP.get(name, '')}")


def task_names(lib) -> set:
    """The names of the tasks of each case of the library `lib` (planning.library.Library)."""
    names = {f"{task}:{plan.case}" for plan in lib.plans.values()
             for task in (PLAN, VERIFY, *(s.name for s in graph.stages_of(plan)))}
    names |= {f"{s.name}:{graph.MACHINE}" for s in graph.MACHINE_STAGES if lib.ok()}
    return (names | {f"replay:{p.case}" for p in lib.kernels()} | {f"{VERIFY}:{s}" for s in lib.sweeps()}
            | {f"runtime:{p.case}" for p in lib.kernels() if not p.error})


def tasks_for(root: Path, variables=()) -> dict:
    """The `task_*` functions for a dodo.py: `globals().update(tasks_for(root))`. `variables`: the names
    of the dodo.py's own doit variables, if it reads any (every other unknown NAME=VALUE is an error)."""
    line = CommandLine.parse(sys.argv[1:])
    if unknown := unknown_variables(line.variables, variables):
        usage_error(f"{unknown}; `doit help verify` lists the variables")
    config.quiet_third_party_warnings()
    # the run's context (its workers among it) is entered as the library is planned, before workers fork: Session
    session = doit_session.current = Session(Path(root).resolve(), line)
    try:
        executor = config.current().given(get_var).executor
    except ValueError as exc:
        usage_error(str(exc))
    if executor == "ray":
        if line.options.get("par_type") == "process" and line.workers > 1:
            usage_error("executor=ray submits from one process, the Ray driver: leave out -P process (doit's -n "
                        "workers are then its threads, each waiting on a task of the cluster)")
        DOIT_CONFIG["par_type"] = "thread"  # one process is the Ray driver: doit's -n workers are its threads
    # doit captures an action's output by swapping sys.stdout and sys.stderr, which threads running actions at
    # once leave swapped for good: a reporter's own stream is then gone (the JSON reporter's output was lost)
    threads = line.workers > 1 and line.options.get("par_type", DOIT_CONFIG.get("par_type")) == "thread"
    uncaptured = {"io": {"capture": False}} if threads else {}
    if line.command == "run":
        session.start()
    elif line.command == "help" and line.tasks:
        atexit.register(_print_variables)

    checks = {}  # task name -> its up-to-date check, for verify:CASE's (CaseVerified)

    def checked(check: UpToDate) -> list:
        checks[check.task] = check
        return [check]

    def task_plan():
        """plan each case: import errors and bad specs surface here"""
        for plan in session.library.plans.values():
            yield {"name": plan.case, "actions": [(_plan_action, [plan.case, plan.error])],
                   "uptodate": checked(Planned(plan.case, plan.error)), "doc": f"plan {plan.case}", **uncaptured}

    def stage_creator(stage):
        def create():
            if not stage.per_case:  # one task, which any case's plan walks
                if first := next(iter(session.library.ok()), None):
                    yield {"name": graph.MACHINE, "doc": stage.doc, **uncaptured,
                           "actions": [(_run_stage, [stage.name, graph.MACHINE, first.case])],
                           "uptodate": checked(StageCached(session, stage.name, first.case, graph.MACHINE))}
                return
            for plan in session.library.plans.values():
                case = plan.case
                if plan.error:  # `doit abi:<case>` shows why the case cannot be planned
                    yield {"name": case, "doc": f"{stage.doc} ({case})",
                           "actions": [(TaskFailed, [plan.error])], "task_dep": [f"{PLAN}:{case}"], **uncaptured}
                    continue
                if stage not in graph.stages_of(plan):  # a baseline's stage that its case computes
                    continue
                yield {"name": case, "doc": f"{stage.doc} ({case})",
                       "actions": [(_run_stage, [stage.name, case, case])],
                       "uptodate": checked(StageCached(session, stage.name, case)),
                       "task_dep": [f"{PLAN}:{case}"] + [f"{d}:{graph.computed_by(plan, BY_NAME[d])}"
                                                         for d in stage.reads + stage.after],
                       **uncaptured}
        create.__name__ = f"task_{stage.name}"
        create.__doc__ = stage.doc
        return create

    def task_runtime():
        """write runs/<case>: the latest verified run, self-contained and replayable"""
        for plan in (p for p in session.library.kernels() if not p.error):
            case = plan.case
            yield {"name": case, "actions": [(_materialize, [case])],
                   "uptodate": checked(RuntimeCurrent(session, case)),
                   # every stage: the dir holds each one's entry (golden_bench may finish after bench)
                   "task_dep": [f"{s.name}:{graph.computed_by(plan, s)}" for s in STAGES],
                   "doc": f"runtime dir of {case}",
                   **uncaptured}

    def task_replay():
        """replay runs/<case>: saved artifact, inputs and golden; no compile, no kernel import"""
        for plan in session.library.kernels():
            yield {"name": plan.case, "actions": [(_replay, [plan.case])], "verbosity": 2,
                   "doc": f"replay runs/{plan.case}", **uncaptured}

    def task_verify():
        """verify every case; `verify:<case>` for one (`doit help verify`: the variables)"""
        lib = session.library
        if line.command in ("run", "info"):
            _check_names(line, {PLAN, VERIFY, "runtime", "replay", *BY_NAME} | task_names(lib), lib.unplanned())
        for plan in lib.plans.values():
            case = plan.case
            if plan.error:  # always run: its plan task fails, and says why
                yield {"name": case, "actions": None, "task_dep": [f"{PLAN}:{case}"], "doc": f"verify {case}"}
                continue
            # a case's own stages and runtime dir, and its baselines (which a baseline failing leaves unmet: the
            # rows say why)
            deps = [f"{PLAN}:{case}", *(f"{s.name}:{case}" for s in graph.stages_of(plan)),
                    *([] if plan.baseline_of else [f"runtime:{case}"]), *(f"{VERIFY}:{b}" for b in plan.baselines)]
            yield {"name": case, "actions": None, "task_dep": deps[1:],
                   "uptodate": checked(CaseVerified(case, deps, checks)), "doc": f"verify {case}"}
        for sweep, points in lib.sweeps().items():  # verify:<sweep>: every point (a failed one always runs)
            deps = [f"{VERIFY}:{p}" for p in points]
            failed = any(lib.plans[p].error for p in points)
            checks_of = {} if failed else {"uptodate": checked(CaseVerified(sweep, deps, checks))}
            yield {"name": sweep, "actions": None, "task_dep": deps,
                   "doc": f"verify the {len(points)} points of {sweep}", **checks_of}

    tasks = {"task_plan": task_plan, "task_verify": task_verify, "task_runtime": task_runtime,
             "task_replay": task_replay}
    tasks.update({f"task_{s.name}": stage_creator(s) for s in STAGES})
    return tasks


DOIT_CONFIG = {
    "default_tasks": [VERIFY],
    "reporter": SummaryReporter,
    # every case gets its verdict, whatever another's is (doit would stop at the first failure);
    # `doit --no-continue` stops there
    "continue": True,
    # doit's own state is not trusted for up-to-dateness (the store is); sqlite3
    # is its backend that tolerates concurrent processes.
    "backend": "sqlite3",
    "dep_file": ".doit.db",
}


class ProjectLoader(NamespaceTaskLoader):
    """doit's loader plugin "golden-tasks" (the entry point doit.LOADER in pyproject.toml): the tasks of
    the project in the current directory, without a dodo.py. A project selects it with

        [tool.doit]
        loader = "golden-tasks"
    """

    def setup(self, opt_values):
        self.namespace = {"DOIT_CONFIG": DOIT_CONFIG, **tasks_for(Path.cwd())}
