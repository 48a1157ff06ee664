"""The one walk of a case's stages, reported as events.

walk(plan, store, stages, events, case, producer)
  for each stage, in graph order:
    execution.execute (cached, or computed by `producer`: here, a Ray node)
      -> events.cached(stage, entry) | events.ran(stage, entry)
      -> a raise: events.failed(stage, StageError), and the walk stops (what reads it cannot run)

The front ends differ only in the stages they hand it and in what listens:
  golden_tasks.run and the pytest plugin (runner.verify): every stage, a Recorder, whose states, errors and
    worst make the case's row (summary.case_row);
  doit: one stage per task (doit orders the tasks and runs them in its workers), the session's journal
    listening (frontends/doit_tasks.py), whose lines make the same rows when the run ends;
  a launched rank (pipeline/launched.py): the stages before dispatch, which its ranks then run together.
"""
import dataclasses
import traceback
from collections.abc import Iterable

from ..model.errors import StalePlan, VerificationFailure
from ..model.outputs import Stats, Worst
from ..model.plan import Plan
from ..model.verdicts import StageState
from ..storage.entry import Entry
from ..storage.store import Store
from .execution import IMPORTED, CaseSource, Producer, execute
from .stage_table import Stage


@dataclasses.dataclass(frozen=True)
class StageError:
    """Why a stage failed: the message (the exception's, with its traceback when it is not an expected
    VerificationFailure), what a failed validation found at worst, and whether the plan itself is stale."""
    message: str
    worst: Worst | None = None
    stale: bool = False

    @classmethod
    def of(cls, exc: Exception) -> "StageError":
        detail = "" if isinstance(exc, VerificationFailure) else "\n" + "".join(traceback.format_exception(exc))
        return cls(f"{exc}{detail}", getattr(exc, "worst", None), isinstance(exc, StalePlan))


class Events:
    """What a walk reports, as doit reports to its reporter: override what you listen to."""

    def cached(self, stage: Stage, entry: Entry) -> None:
        """The stage's entry was in the store under its key."""

    def ran(self, stage: Stage, entry: Entry) -> None:
        """The stage ran and its entry was committed."""

    def failed(self, stage: Stage, error: StageError) -> None:
        """The stage failed; the walk stops."""


class Recorder(Events):
    """A case's walk as its row takes it (summary.case_row): each stage's state, the failure's message, what
    a failed validation found at worst, and the seconds of the run that made each entry."""

    def __init__(self) -> None:
        # by stage name (a StageName: the str that CaseRow's stages and errors are keyed by)
        self.states: dict[str, StageState] = {}
        self.errors: dict[str, str] = {}
        self.seconds: dict[str, float | None] = {}
        self.worst: Worst | None = None

    def cached(self, stage: Stage, entry: Entry) -> None:
        self.states[stage.name], self.seconds[stage.name] = StageState.CACHED, Stats.of(entry).seconds

    def ran(self, stage: Stage, entry: Entry) -> None:
        self.states[stage.name], self.seconds[stage.name] = StageState.RAN, Stats.of(entry).seconds

    def failed(self, stage: Stage, error: StageError) -> None:
        self.states[stage.name], self.errors[stage.name], self.worst = StageState.FAILED, error.message, error.worst


def walk(plan: Plan, store: Store, stages: Iterable[Stage], events: Events, case: CaseSource = IMPORTED,
         producer: Producer | None = None) -> StageError | None:
    """Each of `stages` (in graph order) reused from `store` or computed, up to the first that fails: its
    failure, or None when none failed. A stage's failure is an event, never the caller's exception."""
    for stage in stages:
        try:
            entry, ran = execute(stage, plan, store, case, producer)
        except Exception as exc:  # noqa: BLE001 -- a stage's failure is its event
            error = StageError.of(exc)
            events.failed(stage, error)
            return error
        (events.ran if ran else events.cached)(stage, entry)
    return None
