"""doit's up-to-date checks of our tasks, run in the doit parent (no torch): each is a cache lookup of what
its task would produce, so `doit list -s`, `doit info` and `doit --reporter=json` report a cache hit as up
to date, and `doit info` prints why a task is not (the check's str)."""
import functools
import gc
import inspect
import shlex
from pathlib import Path

from doit import get_var

from ..model.plan import VARIABLES
from ..model.records import MANIFEST
from ..model.verdicts import StageState
from ..pipeline import graph, runtime
from ..pipeline.stage_table import BY_NAME
from ..project import config
from .doit_session import PLAN, VERIFY, Session


@functools.cache
def _freeze_loaded_tasks() -> None:
    gc.freeze()  # what is loaded when the first task is checked (doit_session.YOUNG_OBJECTS)


class UpToDate:
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


class Planned(UpToDate):
    """plan:CASE is up to date unless the case could not be planned."""

    def __init__(self, case: str, error: str | None):
        super().__init__(f"{PLAN}:{case}")
        self.error = error

    def stale(self) -> str | None:
        return f"the case cannot be planned: {self.error}" if self.error else None


class StageCached(UpToDate):
    """STAGE:CASE is up to date when the store holds a valid entry under the stage's current key
    (and fresh=1 does not measure a timing stage again). Each check is tallied in the run's cache
    log, and a hit is journaled as the task's outcome and kept in the session's hits: doit checks a
    task once its task_dep are done, so a hit found then is what the stages downstream read; a miss is
    not kept (a worker computes it, and the next check that needs it reads the store again)."""

    def __init__(self, session: Session, stage: str, case: str, task_case: str | None = None):
        super().__init__(f"{stage}:{task_case or case}")  # task_case: graph.MACHINE, for a stage every case shares
        self.session, self.stage, self.case, self.shared = session, stage, case, task_case is not None

    def stale(self) -> str | None:
        lib, hits = self.session.library, self.session.hits.setdefault(self.case, {})
        lookups = graph.Lookups(lib.plans[self.case], lib.store, hits)
        missed = lookups.not_cached(BY_NAME[self.stage])
        hits.update(lookups.hits())
        self.session.tally.add(self.stage, None if self.shared else self.case, missed is None)
        if missed is None:
            self.session.journal(self.task, StageState.CACHED)
            return None
        if missed.kind is not graph.Missing.NO_ENTRY:
            return str(missed)
        return f"{missed}; `{explain_command(self.session.root, self.task)}` names what changed since its last run"


def explain_command(root: Path, task: str) -> str:
    """The `golden-tasks explain` command line for `task` under this run's project and doit variables."""
    variables = [f"{name}={value}" for name in (*VARIABLES, *config.RunContext.VARIABLES)
                 if (value := get_var(name)) is not None]
    project = [] if root == Path.cwd().resolve() else ["--project", str(root)]
    return shlex.join(["golden-tasks", *project, "explain", task, *variables])


class RuntimeCurrent(UpToDate):
    """runtime:CASE is up to date when runs/CASE holds the case's current run (runtime.is_current)."""

    def __init__(self, session: Session, case: str):
        super().__init__(f"runtime:{case}")
        self.session, self.case = session, case

    def stale(self) -> str | None:
        lib = self.session.library
        plan, case_dir = lib.plans[self.case], self.session.project.runs / self.case
        if plan.fresh:
            return f"fresh=1: {case_dir} is written again with the new timings"
        if runtime.is_current(graph.Lookups(plan, lib.store, self.session.hits.get(self.case)), case_dir):
            return None
        if not (case_dir / MANIFEST).exists():
            return f"{case_dir} holds no run yet"
        return (f"{case_dir} holds another run (other keys or profile) or a file in it changed since it was "
                "written, so it is written again")


class CaseVerified(UpToDate):
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
