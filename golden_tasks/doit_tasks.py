"""The doit adapter: each case's stages as doit tasks `<stage>:<case>`.

Runs in the doit parent, which must stay light: it reads plans and entry
manifests, never torch or the kernel modules. Up-to-date checks are cache
lookups of the stage's current key, so `doit list -s`, `doit info` and
`doit --reporter=json` report a cache hit as up-to-date. Actions run the stage
through graph.execute (in doit's worker processes with -n N).
"""
import argparse
import atexit
import os
import sys
import traceback
from pathlib import Path

from doit import get_var
from doit.exceptions import TaskFailed, UnmetDependency
from doit.reporter import ConsoleReporter

from . import config, graph, reaper, report, runtime
from .discover import forget
from .errors import StalePlan, VerificationFailure
from .library import Library

PLAN = "plan"
VERIFY = "verify"


_libraries = {}


def library(root: Path) -> Library:
    """The project's library, planned once per process. A cache that cannot be written or a bad
    doit variable ends the run with its message alone (doit would print its loader's traceback)."""
    if root not in _libraries:
        try:
            _libraries[root] = Library(root, get_var)
        except (VerificationFailure, ValueError, RuntimeError) as exc:  # RuntimeError: planning itself failed
            sys.exit(f"golden-tasks: {exc}")
    return _libraries[root]


_tally = report.Tally()  # status checks of this doit process, logged when it exits


def _is_cached(root, stage, case):
    lib = library(root)
    hit = graph.cached(graph.BY_NAME[stage], lib.plans[case], lib.store) is not None
    _tally.add(stage, case, hit)
    return hit


def _log_tally(store, pid):
    if os.getpid() == pid and _tally.cases:  # the doit parent only, and only if it checked anything
        store.log_run(_tally.to_json())


_doit_parent = os.getpid()  # dodo.py imports this module in the doit parent, before workers fork
_ready = {}  # what this process has set up: {"worker", "threads"} -> its pid


def _ready_to_run(torch_stage: bool) -> None:
    """Once per process: a -n worker ends with the doit parent, and everything it started with it
    (a `kill -9` of the parent alone leaves no compiler or kernel running); a process that computes
    with torch sizes its thread pools."""
    pid = os.getpid()
    if pid != _doit_parent and _ready.get("worker") != pid:
        reaper.own_tree_until_parent_dies()
        _ready["worker"] = pid
    if torch_stage and _ready.get("threads") != pid:
        config.apply_threads()
        _ready["threads"] = pid


def _run_stage(root, stage, case):
    lib = library(root)
    plan = lib.plans[case]
    try:
        _ready_to_run(graph.BY_NAME[stage].torch)
        graph.execute(graph.BY_NAME[stage], plan, lib.store)
    except StalePlan as exc:
        forget(root, lib.store, plan.module)
        return TaskFailed(f"{stage}:{case}: {exc}")
    except Exception as exc:  # noqa: BLE001 -- one clear message; a traceback only for the unexpected
        detail = "" if isinstance(exc, VerificationFailure) else "\n" + "".join(traceback.format_exception(exc))
        return TaskFailed(f"{stage}:{case}: {exc}{detail}")
    return True


def _runtime_current(root, case):
    lib = library(root)
    return runtime.is_current(lib.plans[case], lib.store, config.runs_root(root) / case)


def _materialize(root, case):
    lib = library(root)
    try:
        runtime.materialize(lib.plans[case], lib.store, config.runs_root(root) / case)
    except (OSError, RuntimeError) as exc:
        return TaskFailed(f"runtime:{case}: cannot write the runtime dir: {exc}")
    return True


def _replay(root, case):
    from . import replay  # noqa: PLC0415 -- imports torch: only when a replay runs

    return replay.main(config.runs_root(root) / case, root) == 0


def _plan_action(error):
    return TaskFailed(error) if error else True


def _doit_workers(argv) -> int:
    """The -n/--process value of this doit command line (doit does not expose it to dodo files)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-n", "--process", type=int, default=1)
    known, _ = parser.parse_known_args(argv)
    return max(1, known.process)


def _doit_command(argv) -> str:
    """doit's command on this command line: "run" unless a non-running command is named first."""
    first = next((a for a in argv if not a.startswith("-")), "run")
    return first if first in _NON_RUNNING else "run"


_NON_RUNNING = {"list", "info", "help", "forget", "ignore", "clean", "dumpdb", "strace", "tabcompletion",
                "resetdep", "auto"}


def tasks_for(root: Path) -> dict:
    """The `task_*` functions for a dodo.py: `globals().update(tasks_for(root))`."""
    root = Path(root).resolve()
    # Workers fork after this: tell them how many share the cores (the profile: see Library).
    os.environ.setdefault(config.WORKERS_ENV, str(_doit_workers(sys.argv[1:])))
    if _doit_command(sys.argv[1:]) == "run":
        parent = os.getpid()
        atexit.register(lambda: _log_tally(library(root).store, parent) if _libraries else None)

    def task_plan():
        """plan each case: import errors and bad specs surface here"""
        for plan in library(root).plans.values():
            yield {"name": plan.case, "actions": [(_plan_action, [plan.error])],
                   "uptodate": [not plan.error], "doc": f"plan {plan.case}"}

    def stage_creator(stage):
        def create():
            for plan in library(root).plans.values():
                case = plan.case
                if plan.error:  # `doit abi:<case>` shows why the case cannot be planned
                    yield {"name": case, "doc": f"{stage.doc} ({case})", "actions": [(_plan_action, [plan.error])],
                           "task_dep": [f"{PLAN}:{case}"]}
                    continue
                yield {"name": case, "doc": f"{stage.doc} ({case})",
                       "actions": [(_run_stage, [root, stage.name, case])],
                       "uptodate": [(_is_cached, [root, stage.name, case])],
                       "task_dep": [f"{PLAN}:{case}"] + [f"{d}:{case}" for d in stage.reads + stage.after]}
        create.__name__ = f"task_{stage.name}"
        create.__doc__ = stage.doc
        return create

    def task_runtime():
        """write runs/<case>: the latest verified run, self-contained and replayable"""
        for plan in library(root).ok():
            case = plan.case
            yield {"name": case, "actions": [(_materialize, [root, case])],
                   "uptodate": [(_runtime_current, [root, case])],
                   "task_dep": [f"validate:{case}", f"bench:{case}"], "doc": f"runtime dir of {case}"}

    def task_replay():
        """replay runs/<case>: saved artifact, inputs and golden; no compile, no kernel import"""
        for plan in library(root).plans.values():
            yield {"name": plan.case, "actions": [(_replay, [root, plan.case])], "verbosity": 2,
                   "doc": f"replay runs/{plan.case}"}

    def task_verify():
        """verify every case; `verify:<case>` for one"""
        for plan in library(root).plans.values():
            case = plan.case
            deps = ([f"{PLAN}:{case}"] if plan.error
                    else [f"{s.name}:{case}" for s in graph.STAGES] + [f"runtime:{case}"])
            yield {"name": case, "actions": None, "task_dep": deps, "doc": f"verify {case}"}

    tasks = {"task_plan": task_plan, "task_verify": task_verify, "task_runtime": task_runtime,
             "task_replay": task_replay}
    tasks.update({f"task_{s.name}": stage_creator(s) for s in graph.STAGES})
    return tasks


class SummaryReporter(ConsoleReporter):
    """doit's console output, then a summary table and runs/report.json of the cases this run
    verified (`verify` or `verify:<case>`; a run of single stages has no verdict to summarise).

    A verified case whose row is not PASS or SKIPPED although no task failed (an entry that
    vanished under the run, say) ends the run with exit status 1: no CI may read a green exit
    beside a row that is not a pass."""

    desc = "console output with a per-case summary"

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.states = {}  # case -> {stage: state}
        self.errors = {}  # case -> {stage: message}
        self.verified = set()  # cases whose verify task was part of the run

    def _set(self, task, state, message=None):
        stage, _, case = task.name.partition(":")
        if stage == VERIFY and case:
            self.verified.add(case)
        if case and (stage in graph.BY_NAME or stage == PLAN):
            self.states.setdefault(case, {})[stage] = state
            if message:
                self.errors.setdefault(case, {})[stage] = message

    def add_success(self, task):
        super().add_success(task)
        self._set(task, report.RAN)

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        if isinstance(fail, UnmetDependency):
            self._set(task, report.NOT_RUN)
        else:
            self._set(task, report.FAILED, fail.message)

    def skip_uptodate(self, task):
        super().skip_uptodate(task)
        self._set(task, report.CACHED)

    def complete_run(self):
        super().complete_run()
        if not self.verified:
            return
        lib = next(iter(_libraries.values()))
        rows = [report.case_row(lib.plans[c], self.states.get(c, {}), self.errors.get(c, {}), lib.store)
                for c in lib.plans if c in self.verified]
        self.write("\n" + report.format_table(rows) + "\n")
        path = config.runs_root(lib.root) / "report.json"
        report.write_json(path, rows)
        self.write(f"report: {path}\n")
        unjudged = [r for r in rows if r["status"] not in ("PASS", "SKIPPED")]
        if unjudged and not self.failures:
            for row in unjudged:
                self.write(f"golden-tasks: {row['case']} is {row['status']} although no task failed\n")
            raise SystemExit(1)


DOIT_CONFIG = {
    "default_tasks": [VERIFY],
    "reporter": SummaryReporter,
    # doit's own state is not trusted for up-to-dateness (the store is); sqlite3
    # is its backend that tolerates concurrent processes.
    "backend": "sqlite3",
    "dep_file": ".doit.db",
}
