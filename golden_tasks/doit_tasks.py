# ruff: noqa: E402
"""The doit adapter: each case's stages as doit tasks `<stage>:<case>`.

Runs in the doit parent, which must stay light: it reads plans and entry
manifests, never torch or the kernel modules. Up-to-date checks are cache
lookups of the stage's current key, so `doit list -s`, `doit info` and
`doit --reporter=json` report a cache hit as up-to-date. Actions run the stage
through graph.execute (in doit's worker processes with -n N).

Every run that verifies cases writes its record (report.write_files: runs/report.json and
runs/<case>.log, the full messages of each failing case) whatever reporter doit uses: each task's
outcome goes to the run's journal from the process that knows it (the doit parent for its up-to-date
checks, the process that ran the action for the rest), and the doit parent reads it into the rows
when the run completes (SummaryReporter.complete_run) or, with another reporter, when it exits. An
interrupted run (Ctrl-C) writes nothing: the files stay those of the last complete run.

The console (SummaryReporter) prints no line per up-to-date task: on a terminal a live progress view
(rich) runs until the summary, elsewhere one line per task that runs. A run that verifies cases ends
with the table and one reason line per failing case, naming its log; `doit --failure-verbosity=2`
adds doit's own failure output (every message, the tasks' captured output).
"""
import sys


def _plain_interrupt(kind, value, tb, previous=sys.excepthook):
    """Ctrl-C ends the doit parent with a line, not a traceback: installed as this module is imported (by
    the dodo.py or the loader plugin), before anything else of ours loads; what runs before it (the
    interpreter's start, doit's own imports) is not ours to hook."""
    if not issubclass(kind, KeyboardInterrupt):
        return previous(kind, value, tb)
    run = globals().get("_run")
    if run:
        # doit ends its workers when the interrupt reaches it while they run; not always so when it reaches
        # it later (Python may run the handler only after doit stopped waiting for them), and this exit
        # would then wait for ever for a worker that waits for its next task (multiprocessing joins them).
        reaper.kill(reaper.children(os.getpid()), signal.SIGTERM)
    report_json = run and config.runs_root(run.root) / "report.json"
    kept = f"; {report_json} is still the last complete run's" if report_json and report_json.exists() else ""
    sys.stderr.write(f"\ngolden-tasks: interrupted{kept}\n")


# before the other imports (E402 below): an interrupt while they load is one line too
sys.excepthook = _plain_interrupt

import atexit
import dataclasses
import difflib
import fnmatch
import functools
import gc
import inspect
import json
import os
import shlex
import shutil
import signal
import tempfile
import time
import traceback
from pathlib import Path

from doit import get_var
from doit.cmd_base import DoitCmdBase, NamespaceTaskLoader, opt_cwd, opt_dodo, opt_seek_file
from doit.cmd_run import Run
from doit.cmdparse import CmdOption, CmdParse, CmdParseError
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

from . import config, graph, reaper, report, runtime, sandbox
from .discover import forget
from .errors import StalePlan, VerificationFailure
from .library import CONTEXT, Library, unknown_variables
from .plan import VARIABLES, Plan
from .records import RunRecord
from .store import Store
from .toolchain import machine, toolchain
from .verdicts import StageState, Verdict

PLAN = "plan"
VERIFY = "verify"


_libraries = {}


def library(root: Path) -> Library:
    """The project's library, planned once per process. A cache that cannot be written or a bad
    doit variable ends the run before anything ran (exit status 3) with its message alone (doit would
    print its loader's traceback)."""
    if root not in _libraries:
        try:
            _libraries[root] = Library(root, get_var)
        except (VerificationFailure, ValueError, RuntimeError) as exc:  # RuntimeError: planning itself failed
            _usage_error(str(exc))
    return _libraries[root]


def _usage_error(message: str):
    """End the run before anything ran: doit's exit status 3, one line, no traceback."""
    sys.stderr.write(f"golden-tasks: {message}\n")
    sys.exit(3)


_tally = report.Tally()  # status checks of this doit process, logged when it exits

# The doit parent's plans and tasks (a million objects at 1,000 cases) live until it exits, and Python's collector
# would scan them again at each full collection: a quarter of a no-op run at that size. So a run's doit parent
# collects young objects after YOUNG_OBJECTS allocations rather than 700, and what is loaded when the first task is
# checked is frozen (never scanned again). A process that runs stages collects as Python does (_ready_to_run).
_PYTHONS_THRESHOLDS = gc.get_threshold()
YOUNG_OBJECTS = 100_000


@functools.cache
def _freeze_loaded_tasks() -> None:
    gc.freeze()


class _UpToDate:
    """A doit `uptodate` check that says why its task must run.

    doit calls it with no arguments (Dependency.get_status) and reads its truth value. When that is
    false, `doit info` lists the check as `'{}'.format(check)` (cmd_info.Info.get_reasons), i.e. its
    str, which is `TASK: REASON` for the reason its last call found; a plain function would print
    as `<function ...>`."""

    # doit asks each check's signature on every call, for its optional `task` and `values` parameters;
    # given here, inspect.signature answers without introspecting __call__ (a tenth of a no-op run)
    __signature__ = inspect.Signature()

    def __init__(self, task: str):
        self.task = task
        self.reason = "not checked yet"
        self.current = None  # its last call's answer; None before the first

    def __call__(self) -> bool:
        _freeze_loaded_tasks()
        reason = self.stale()
        self.reason, self.current = reason or "up to date", reason is None
        return self.current

    def stale(self) -> str | None:
        """Why the task must run now, or None when it is up to date."""
        raise NotImplementedError

    def __str__(self) -> str:
        return f"{self.task}: {self.reason}"


class _Planned(_UpToDate):
    """plan:CASE is up to date unless the case could not be planned."""

    def __init__(self, case: str, error: str | None):
        super().__init__(f"{PLAN}:{case}")
        self.error = error

    def stale(self) -> str | None:
        return f"the case cannot be planned: {self.error}" if self.error else None


class _StageCached(_UpToDate):
    """STAGE:CASE is up to date when the store holds a valid entry under the stage's current key
    (and fresh=1 does not measure a timing stage again). Each check is tallied in the run's cache
    log, and a hit is journaled as the task's outcome."""

    def __init__(self, root: Path, stage: str, case: str):
        super().__init__(f"{stage}:{case}")
        self.root, self.stage, self.case = root, stage, case

    def stale(self) -> str | None:
        lib = library(self.root)
        reason = _why_not_cached(graph.BY_NAME[self.stage], lib.plans[self.case], lib.store, self.root,
                                 _hits.setdefault(self.case, {}))
        _tally.add(self.stage, self.case, reason is None)
        if reason is None:
            _journal(self.task, StageState.CACHED)
        return reason


# The doit parent's cache hits in this run: case -> {stage: entry}. doit checks a task once its task_dep
# are done, so a hit found then is what the stages downstream read; a miss is not kept (a worker
# computes it, and the next check that needs it reads the store again).
_hits = {}


def _why_not_cached(stage: graph.Stage, plan: Plan, store: Store, root: Path, hits: dict) -> str | None:
    """graph.not_cached's answer as text, or None when the stage is cached; a stage with no entry under
    its key names the command that says what changed. `hits`: the case's entries found cached so far in
    this run, to which a hit is added."""
    found = dict(hits)
    missed = graph.not_cached(stage, plan, store, found)
    hits.update({name: entry for name, entry in found.items() if entry is not None})
    if missed is None or missed.kind is not graph.Missing.NO_ENTRY:
        return missed and str(missed)
    return f"{missed}; `{_explain_command(root, f'{stage.name}:{plan.case}')}` names what changed since its last run"


def _explain_command(root: Path, task: str) -> str:
    """The `golden-tasks explain` command line for `task` under this run's project and doit variables."""
    variables = [f"{name}={value}" for name in (*VARIABLES, *CONTEXT) if (value := get_var(name)) is not None]
    project = [] if root == Path.cwd().resolve() else ["--project", str(root)]
    return shlex.join(["golden-tasks", *project, "explain", task, *variables])


def _log_tally(store, pid):
    if os.getpid() == pid and _tally.cases:  # the doit parent only, and only if it checked anything
        store.log_run(_tally.to_json())


_doit_parent = os.getpid()  # dodo.py imports this module in the doit parent, before workers fork
_ready = {}  # what this process has set up: {"worker", "threads"} -> its pid


def _ready_to_run(torch_stage: bool) -> None:
    """Once per process: a -n worker ends with the doit parent, and everything it started with it
    (a `kill -9` of the parent alone leaves no compiler or kernel running); a process that computes
    with torch sizes its thread pools; one that runs stages collects garbage as Python does."""
    pid = os.getpid()
    if pid != _doit_parent and _ready.get("worker") != pid:
        reaper.own_tree_until_parent_dies()
        _ready["worker"] = pid
    if torch_stage and _ready.get("threads") != pid:
        config.apply_threads()
        _ready["threads"] = pid
    if _ready.get("collects") != pid:
        gc.set_threshold(*_PYTHONS_THRESHOLDS)
        _ready["collects"] = pid


def _outcome(task: str, message: str = None, max_abs: float = None):
    """A task action's result for doit, journaled: True, or TaskFailed with `message` (and the failed
    validation's largest error, `max_abs`)."""
    _journal(task, StageState.FAILED if message else StageState.RAN, message, max_abs)
    return TaskFailed(f"{task}: {message}") if message else True


class _CaseVerified(_UpToDate):
    """verify:CASE does nothing itself: it is up to date when every task it depends on is (their checks, in
    `checks` by task name, asked here if this process has not asked them yet). doit would otherwise run it,
    which with -n sends it to a worker and back: in a no-op run of a large library, a third of doit's time."""

    def __init__(self, case: str, deps: list, checks: dict):
        super().__init__(f"{VERIFY}:{case}")
        self.deps, self.checks = deps, checks

    def stale(self) -> str | None:
        for name in self.deps:
            check = self.checks[name]
            if not (check() if check.current is None else check.current):
                return f"{name} is not up to date"
        return None


def _run_stage(root, stage, case):
    lib = library(root)
    plan = lib.plans[case]
    task = f"{stage}:{case}"
    try:
        _ready_to_run(graph.BY_NAME[stage].torch)
        graph.execute(graph.BY_NAME[stage], plan, lib.store)
    except StalePlan as exc:
        forget(root, lib.store, plan.module)
        return _outcome(task, str(exc))
    except Exception as exc:  # noqa: BLE001 -- one clear message; a traceback only for the unexpected
        detail = "" if isinstance(exc, VerificationFailure) else "\n" + "".join(traceback.format_exception(exc))
        return _outcome(task, f"{exc}{detail}", getattr(exc, "max_abs", None))
    return _outcome(task)


class _RuntimeCurrent(_UpToDate):
    """runtime:CASE is up to date when runs/CASE holds the case's current run (runtime.is_current)."""

    def __init__(self, root: Path, case: str):
        super().__init__(f"runtime:{case}")
        self.root, self.case = root, case

    def stale(self) -> str | None:
        lib = library(self.root)
        plan, case_dir = lib.plans[self.case], config.runs_root(self.root) / self.case
        if plan.fresh:
            return f"fresh=1: {case_dir} is written again with the new timings"
        if runtime.is_current(plan, lib.store, case_dir, dict(_hits.get(self.case, {}))):
            return None
        if not (case_dir / runtime.MANIFEST).exists():
            return f"{case_dir} holds no run yet"
        return (f"{case_dir} holds another run (other keys or profile) or a file in it changed since it was "
                "written, so it is written again")


def _materialize(root, case):
    lib = library(root)
    try:
        runtime.materialize(lib.plans[case], lib.store, config.runs_root(root) / case)
    except (OSError, RuntimeError) as exc:
        return _outcome(f"runtime:{case}", f"cannot write the runtime dir: {exc}")
    return _outcome(f"runtime:{case}")


def _replay(root, case):
    from . import replay  # noqa: PLC0415 -- imports torch: only when a replay runs

    _ready_to_run(torch_stage=True)  # it calls the kernel, as bench does
    return replay.main(config.runs_root(root) / case, root) == 0


def _plan_action(case, error):
    return _outcome(f"{PLAN}:{case}", error)


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A doit command line as doit reads it (doit does not expose it to dodo files): its command,
    its options (doit's names: num_process, reporter, ...) and its task arguments; a run with no
    task arguments runs the default tasks."""
    command: str
    options: dict
    tasks: tuple
    variables: tuple = ()  # the NAME of each NAME=VALUE

    @classmethod
    def parse(cls, argv) -> "CommandLine":
        args = [a for a in argv if a.startswith("-") or "=" not in a]  # NAME=VALUE are doit's variables
        variables = tuple(a.partition("=")[0] for a in argv if not a.startswith("-") and "=" in a)
        common = DoitCmdBase.base_options + (opt_dodo, opt_cwd, opt_seek_file)
        parser = CmdParse([CmdOption(o) for o in common + Run.cmd_options])
        try:
            given, args = parser.parse_only(args)  # doit's options, up to the command or the first task
            command = args.pop(0) if args and args[0] in _COMMANDS else "run"
            if command == "run":
                given, args = parser.parse_only(args, given)
            else:  # another command's own options (`info --no-status`) are not task names
                own = CmdParse([CmdOption(o) for o in common + getattr(_COMMANDS[command], "cmd_options", ())])
                args = own.parse_only(args)[1]
        except CmdParseError:  # doit itself will say what is wrong with it
            return cls("invalid", {}, (), variables)
        return cls(command, given, tuple(args), variables)

    @property
    def workers(self) -> int:
        """doit's worker processes (-n N): 1 without."""
        return max(1, self.options.get("num_process", 1))

    def selects(self, task: str) -> bool:
        """Whether the run selects `task` by name, group or pattern (the default tasks: verify)."""
        group = task.partition(":")[0]
        return any(t in (task, group) or ("*" in t and fnmatch.fnmatchcase(task, t)) for t in self.tasks or [VERIFY])


_COMMANDS = {c.get_name(): c for c in DoitMain.DOIT_CMDS} | {"auto": None}  # "auto": the doit-auto plugin's


@dataclasses.dataclass
class _Run:
    """This doit parent's run: its journal (a file of JSON lines {task, state, message}) and record."""
    root: Path
    line: CommandLine
    journal: Path
    started: float = dataclasses.field(default_factory=time.time)
    interrupted: bool = False
    finished: bool = False
    drawn: bool = False
    record: RunRecord = None


_run = None  # set in the doit parent of a run (tasks_for)
JOURNAL_ENV = "GOLDEN_TASKS_JOURNAL"


_parent_outcomes = []  # the doit parent's own part of the journal (its up-to-date checks), kept in memory


def _journal(task: str, state: str, message: str = None, max_abs: float = None) -> None:
    """Append a task's outcome to the run's journal: the doit parent's to its list, a worker's to the
    journal file in one write (atomic next to other processes')."""
    line = {"task": task, "state": state, "message": message, "max_abs": max_abs}
    if os.getpid() == _doit_parent:
        _parent_outcomes.append(line)
        return
    path = os.environ.get(JOURNAL_ENV)
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)


def finish_run() -> RunRecord | None:
    """The run record, built from the journal and written (report.write_files) once, in the doit
    parent; None when the run verified no case, checked no task (doit stopped before running) or
    was interrupted."""
    if _run is None or _run.finished or _run.interrupted or _run.root not in _libraries:
        return _run and _run.record
    _run.finished = True
    lines = _parent_outcomes + [json.loads(line) for line in _run.journal.read_text().splitlines()]
    lib = _libraries[_run.root]
    cases = [c for c in lib.plans if _run.line.selects(f"{VERIFY}:{c}")]
    if not lines or not cases:
        return None
    states, errors, failed_max_abs = {}, {}, {}
    for line in lines:
        stage, _, case = line["task"].partition(":")
        states.setdefault(case, {})[stage] = StageState(line["state"])
        if line["message"]:
            errors.setdefault(case, {})[stage] = line["message"]
        if line["max_abs"] is not None:
            failed_max_abs[case] = line["max_abs"]
    runs = config.runs_root(lib.root)
    rows = [report.case_row(lib.plans[c], states.get(c, {}), errors.get(c, {}), lib.store, dict(_hits.get(c, {})),
                            failed_max_abs.get(c)) for c in cases]
    lib.store.record_use({(stage, key) for row in rows for stage, key in row.keys.items() if key})
    for row in rows:
        row.log = str(report.log_path(runs, row.case)) if row.status == Verdict.FAIL else None
    _run.record = RunRecord(cases=rows, started=_run.started, finished=time.time(), machine=machine(),
                            toolchain=toolchain())
    try:
        report.write_files(runs, _run.record)
    except (VerificationFailure, OSError) as exc:  # CacheWriteError: the runs dir cannot be written
        sys.stderr.write(f"golden-tasks: the run's files were not written: {exc}\n")
        _run.record = None
    return _run.record


def draw_run(say=lambda line: None) -> None:
    """Once, after finish_run wrote the record: runs/report.html (slow when it plots, in its own process:
    it `say`s so first), unless GOLDEN_TASKS_HTML=0."""
    if _run is None or _run.drawn or not _run.record:
        return
    _run.drawn = True
    if not config.draws_html():  # a page from an earlier run would pass for this one's
        (config.runs_root(_run.root) / "report.html").unlink(missing_ok=True)
        return
    if failed := report.write_html(_run.root, say):
        sys.stderr.write(f"golden-tasks: runs/report.html was not written: {failed}\n")


def _at_exit(parent: int) -> None:
    if os.getpid() != parent:  # a process forked without exec may run its parent's atexit hooks
        return
    try:
        finish_run()
        draw_run()
        if _libraries:
            _log_tally(library(_run.root).store, parent)
    finally:
        shutil.rmtree(_run.journal.parent, ignore_errors=True)


def _interrupt(signum, frame):
    _run.interrupted = True
    raise KeyboardInterrupt


def _start_run(root: Path, line: CommandLine) -> None:
    """In the doit parent of a run, before workers fork: the journal, and what happens at its end."""
    global _run
    # in a folder of its own, which a kernel's process is kept out of (isolate.confinement)
    journal = Path(tempfile.mkdtemp(prefix="golden-tasks-run-")) / "journal.jsonl"
    journal.touch()
    _run = _Run(root, line, journal)
    os.environ[JOURNAL_ENV] = str(journal)
    signal.signal(signal.SIGINT, _interrupt)
    gc.set_threshold(YOUNG_OBJECTS)
    atexit.register(_at_exit, os.getpid())


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
                            f"{report.first_line(p.error)}" for p in unplanned)
        _usage_error(f"no task {arg!r}{hint}")


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
}


def _print_variables() -> None:
    """After `doit help <task>`, which knows only a task's first doc line and its --options."""
    names = [*VARIABLES, *CONTEXT]
    width = max(map(len, names)) + 2
    print("\nvariables, as NAME=VALUE after the task names (`doit verify:rms_norm rounds=20`):")
    for name in names:
        print(f"  {name:<{width}}{VARIABLE_HELP.get(name, '')}")


def tasks_for(root: Path, variables=()) -> dict:
    """The `task_*` functions for a dodo.py: `globals().update(tasks_for(root))`. `variables`: the names
    of the dodo.py's own doit variables, if it reads any (every other unknown NAME=VALUE is an error)."""
    root = Path(root).resolve()
    line = CommandLine.parse(sys.argv[1:])
    if unknown := unknown_variables(line.variables, variables):
        _usage_error(f"{unknown}; `doit help verify` lists the variables")
    config.quiet_third_party_warnings()
    # Workers fork after this: tell them how many share the cores (the profile: see Library).
    os.environ.setdefault(config.WORKERS_ENV, str(line.workers))
    if line.command == "run":
        _start_run(root, line)
    elif line.command == "help" and line.tasks:
        atexit.register(_print_variables)

    checks = {}  # task name -> its up-to-date check, for verify:CASE's (_CaseVerified)

    def checked(check: _UpToDate) -> list:
        checks[check.task] = check
        return [check]

    def task_plan():
        """plan each case: import errors and bad specs surface here"""
        for plan in library(root).plans.values():
            yield {"name": plan.case, "actions": [(_plan_action, [plan.case, plan.error])],
                   "uptodate": checked(_Planned(plan.case, plan.error)), "doc": f"plan {plan.case}"}

    def stage_creator(stage):
        def create():
            for plan in library(root).plans.values():
                case = plan.case
                if plan.error:  # `doit abi:<case>` shows why the case cannot be planned
                    yield {"name": case, "doc": f"{stage.doc} ({case})",
                           "actions": [(TaskFailed, [plan.error])], "task_dep": [f"{PLAN}:{case}"]}
                    continue
                yield {"name": case, "doc": f"{stage.doc} ({case})",
                       "actions": [(_run_stage, [root, stage.name, case])],
                       "uptodate": checked(_StageCached(root, stage.name, case)),
                       "task_dep": [f"{PLAN}:{case}"] + [f"{d}:{case}" for d in stage.reads + stage.after]}
        create.__name__ = f"task_{stage.name}"
        create.__doc__ = stage.doc
        return create

    def task_runtime():
        """write runs/<case>: the latest verified run, self-contained and replayable"""
        for plan in library(root).ok():
            case = plan.case
            yield {"name": case, "actions": [(_materialize, [root, case])],
                   "uptodate": checked(_RuntimeCurrent(root, case)),
                   # every stage: the dir holds each one's entry (golden_bench may finish after bench)
                   "task_dep": [f"{s.name}:{case}" for s in graph.STAGES], "doc": f"runtime dir of {case}"}

    def task_replay():
        """replay runs/<case>: saved artifact, inputs and golden; no compile, no kernel import"""
        for plan in library(root).plans.values():
            yield {"name": plan.case, "actions": [(_replay, [root, plan.case])], "verbosity": 2,
                   "doc": f"replay runs/{plan.case}"}

    def task_verify():
        """verify every case; `verify:<case>` for one (`doit help verify`: the variables)"""
        lib = library(root)
        if line.command in ("run", "info"):
            _check_names(line, {PLAN, VERIFY, "runtime", "replay", *graph.BY_NAME}
                         | {f"{task}:{case}" for task in (PLAN, VERIFY, "replay", *graph.BY_NAME) for case in lib.plans}
                         | {f"runtime:{p.case}" for p in lib.ok()}, lib.unplanned())
        for plan in lib.plans.values():
            case = plan.case
            if plan.error:  # always run: its plan task fails, and says why
                yield {"name": case, "actions": None, "task_dep": [f"{PLAN}:{case}"], "doc": f"verify {case}"}
                continue
            deps = [f"{PLAN}:{case}", *(f"{s.name}:{case}" for s in graph.STAGES), f"runtime:{case}"]
            yield {"name": case, "actions": None, "task_dep": deps[1:], "uptodate": [_CaseVerified(case, deps, checks)],
                   "doc": f"verify {case}"}

    tasks = {"task_plan": task_plan, "task_verify": task_verify, "task_runtime": task_runtime,
             "task_replay": task_replay}
    tasks.update({f"task_{s.name}": stage_creator(s) for s in graph.STAGES})
    return tasks


class _LiveProgress:
    """The live view on a terminal: tasks done of the run's total, cache hits, failures, the tasks
    running now. rich draws it below whatever the run prints (`print`) and removes it at `stop`."""

    def __init__(self, outstream, total: int):
        from rich.console import Console  # noqa: PLC0415 -- only on a terminal
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

        self.running, self.cached, self.failed = [], 0, 0
        self.view = Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                             TimeElapsedColumn(), TextColumn("{task.fields[detail]}"),
                             console=Console(file=outstream), transient=True)
        self.task = self.view.add_task("", total=total, detail="")
        self.view.start()

    def update(self, advance: int = 0) -> None:
        detail = f"{self.cached} cached" + (f", {self.failed} failed" if self.failed else "")
        if self.running:
            detail += "  running: " + ", ".join(self.running)
        self.view.update(self.task, advance=advance, detail=detail)

    def print(self, text: str) -> None:
        self.view.console.out(text, end="", highlight=False)

    def stop(self) -> None:
        self.view.stop()


def _closure(tasks: dict, selected) -> set:
    """The names of the selected tasks and every task they depend on."""
    seen, todo = set(), list(selected)
    while todo:
        name = todo.pop()
        if name not in seen and name in tasks:
            seen.add(name)
            todo.extend(tasks[name].task_dep)
    return seen


class SummaryReporter(ConsoleReporter):
    """doit's console output without a line per up-to-date task: on a terminal a live progress view,
    elsewhere a line per task that runs. A run that verifies cases ends with the summary table of
    its record (finish_run) and one reason line per failing case; doit's own failure output (each
    message as it happens, dependency cascades, the failed tasks' captured output) only with
    `--failure-verbosity` 1 or 2, or in a run that verifies nothing (it has no table).

    A verified case whose row is not PASS or SKIPPED although no task failed (an entry that
    vanished under the run, say) ends the run with exit status 1: no CI may read a green exit
    beside a row that is not a pass."""

    desc = "console output with a per-case summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.live = None
        self.wrote = False
        self.quiet = False  # a run that verifies cases: its failures are summarised under the table

    def initialize(self, tasks, selected_tasks):
        self.quiet = any(t.partition(":")[0] == VERIFY for t in _closure(tasks, selected_tasks))
        if self.outstream.isatty():
            total = sum(1 for t in _closure(tasks, selected_tasks) if tasks[t].actions)
            self.live = _LiveProgress(self.outstream, total)

    def write(self, text):
        self.wrote = True
        if self.live:
            self.live.print(text)
        else:
            super().write(text)

    def _done(self, task, failed=False):
        if self.live and task.actions:
            if task.name in self.live.running:
                self.live.running.remove(task.name)
            self.live.failed += failed
            self.live.update(advance=1)

    def execute_task(self, task):
        if self.live:
            if task.actions:
                self.live.running.append(task.name)
                self.live.update()
        else:
            super().execute_task(task)

    def add_success(self, task):
        super().add_success(task)
        self._done(task)

    def add_failure(self, task, fail):
        # Summarised: what our actions report (TaskFailed: journaled, in the case's log) and the cascade
        # it causes; doit's own errors (an up-to-date check that raised, say) print as doit prints them.
        if self.quiet and not self.failure_verbosity and isinstance(fail, (TaskFailed, UnmetDependency)):
            self.failures.append({"task": task, "exception": fail})
        else:
            super().add_failure(task, fail)
        self._done(task, failed=not isinstance(fail, UnmetDependency))

    def skip_uptodate(self, task):
        if self.live and task.actions and task.name.partition(":")[0] != PLAN:  # a plan is no cache hit
            self.live.cached += 1
        self._done(task)

    def skip_ignore(self, task):
        super().skip_ignore(task)
        self._done(task)

    def complete_run(self):
        if self.live:
            self.live.stop()
            self.live = None
        if _run and _run.interrupted:
            return
        if not self.quiet or self.failure_verbosity:
            super().complete_run()
        elif self.runtime_errors:
            self.write("Execution aborted.\n" + "\n".join(self.runtime_errors) + "\n")
        record = finish_run()
        if not record:
            return
        rows = record.cases
        self.write(("\n" if self.wrote else "") + report.format_table(rows) + "\n")
        unjudged = [r for r in rows if r.status.failed]
        unreached = [r.case for r in unjudged if r.status == Verdict.INCOMPLETE]
        if unreached and self.failures:
            self.write(f"not reached: {', '.join(unreached)} (doit stops at the first failure; "
                       "--continue runs the rest)\n")
        self.outstream.flush()  # the table first: the page takes a few seconds to draw
        draw_run(lambda line: (self.write(line + "\n"), self.outstream.flush()))
        runs = config.runs_root(_run.root)
        self.write(f"report: {runs / 'report.json'} (also report.xml{', report.html' * config.draws_html()})\n")
        if any(r.stages.get("compile") == StageState.RAN for r in rows) and config.sandbox() == "auto" \
                and (reason := sandbox.support()):
            self.write(f"note: kernels ran unconfined: {reason} (docs/threat-model.md)\n")
        if unjudged and not self.failures:
            for row in unjudged:
                self.write(f"golden-tasks: {row.case} is {row.status} although no task failed\n")
        self.write(report.outcome_line(rows) + "\n")
        raise SystemExit(self.exit_status(record))

    def exit_status(self, record: RunRecord) -> int:
        """doit's meanings, the same with or without --continue and -n: 0 when every case is PASS or
        SKIPPED, 1 when a case failed (its stage failed, or it is not judged although none did), 2 when
        something other than a case's verdict went wrong while running (an up-to-date check or action
        that raised, a runtime error of doit's)."""
        ours = (TaskFailed, UnmetDependency)  # a stage's verdict, and the tasks it kept from running
        if self.runtime_errors or any(not isinstance(f["exception"], ours) for f in self.failures):
            return 2
        return 0 if record.passed else 1


DOIT_CONFIG = {
    "default_tasks": [VERIFY],
    "reporter": SummaryReporter,
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
