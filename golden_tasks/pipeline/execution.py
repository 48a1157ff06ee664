"""Running a stage: under its key's lock, where it must run, its outputs stored and committed as its entry.

execute(stage, plan, store, case: CaseSource)
  -> the entry under the stage's current key (graph.Lookups), if cached
  -> else, upstream first (recursively), then under store.computing(key):
       producer(stage, plan, store, upstream entries, case) -> Produced | DamagedUpstream
         produce_here: load the upstream outputs, call the stage's module (stage_table.Stage.module)
         in an isolated or confined child where the stage says so (forms.isolate), store its outputs
         (a cluster's producer does the same on a node: pipeline/cluster.py)
       -> committed as the entry; a DamagedUpstream drops that entry and computes again, once.

replay_stages runs the same stage modules on a runtime dir's saved outputs, storing nothing.
"""
import dataclasses
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..model.errors import StageFailed
from ..model.outputs import Outputs, Upstream
from ..model.plan import Plan
from ..project import config, reaper
from ..storage.entry import CorruptObject, Entry
from ..storage.store import Store
from . import graph
from .stage_table import BY_NAME, STAGES, InReplay, Stage, StageName
from .stored import Produced, load_outputs, store_outputs


class CaseSource:
    """The form the case takes on its way to the process that runs a stage: at hand (Live), pickled with its user
    code (Pickled), or to be imported there (Imported)."""

    def crossing(self, plan: Plan) -> "CaseSource":
        """What crosses into another process (an isolated child, a cluster's node)."""
        raise NotImplementedError

    def load(self, plan: Plan) -> object:
        """The case, in the process that runs the stage."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Imported(CaseSource):
    """No case at hand: the process that runs the stage imports its module (and checks it against the plan)."""

    def crossing(self, plan: Plan) -> CaseSource:
        return self

    def load(self, plan: Plan) -> object:
        from ..planning.case import live_case  # noqa: PLC0415 -- imports torch and the kernel module

        return live_case(plan)


@dataclasses.dataclass(frozen=True)
class Pickled(CaseSource):
    """The case pickled with its user code (origin.dumps_by_value)."""
    data: bytes

    def crossing(self, plan: Plan) -> CaseSource:
        return self

    def load(self, plan: Plan) -> object:
        import cloudpickle  # noqa: PLC0415

        return cloudpickle.loads(self.data)


@dataclasses.dataclass(frozen=True)
class Live(CaseSource):
    """The case at hand (a Case, or what stands in for one: a replay's saved policy and placement)."""
    case: object

    def crossing(self, plan: Plan) -> CaseSource:
        from ..model.errors import SpecError  # noqa: PLC0415
        from ..model.origin import dumps_by_value  # noqa: PLC0415

        try:
            return Pickled(dumps_by_value(self.case))
        except Exception as exc:  # noqa: BLE001 -- an object that no pickler can carry: a lock, an open file
            raise SpecError(f"case {plan.case!r}: its kernel, golden and comparators run in an isolated process, "
                            f"so they must pickle, and they do not: {type(exc).__name__}: {exc}") from None

    def load(self, plan: Plan) -> object:
        return self.case


@dataclasses.dataclass(frozen=True)
class Absent(CaseSource):
    """No case at all (a replay: its source may be gone); no stage that loads the case runs with it."""

    def crossing(self, plan: Plan) -> CaseSource:
        return self

    def load(self, plan: Plan) -> object:
        raise TypeError(f"{plan.case}: a stage that loads the case ran without one (stage_table: loads_case)")


IMPORTED, ABSENT = Imported(), Absent()


@dataclasses.dataclass(frozen=True)
class DamagedUpstream:
    """What a producer returns instead of Produced when an upstream object failed its re-hash: the entry, the
    object's name and the problem (storage.entry.CorruptObject's), so that the caller drops the entry and recomputes."""
    entry: Entry
    name: str | None  # None: the entry's own record
    problem: str

    def error(self) -> CorruptObject:
        return CorruptObject(self.entry, self.name, self.problem)


# What runs a stage that must run and stores what it made: produce_here, or an executor's (cluster.RayCluster.produce)
Producer = Callable[[Stage, Plan, Store, dict[str, Entry], CaseSource], Produced | DamagedUpstream]
_T = TypeVar("_T")


def execute(stage: Stage, plan: Plan, store: Store, case: CaseSource = IMPORTED,
            producer: Producer | None = None) -> tuple[Entry, bool]:
    """Run the stage unless its key is cached; return (entry, ran).

    Upstream stages that are not cached (never run, or dropped as corrupt) are
    run first. `case`: Live when the caller has the case; Imported, it is
    imported (and checked against the plan) only by the stages that run its code. An
    upstream object found corrupt while loading is dropped and recomputed once.
    `producer` runs a stage and stores what it made (default: produce_here; an
    executor's runs it elsewhere); the entry is committed here either way.
    """
    producer = producer or produce_here
    for attempt in range(2):
        key, upstream = graph.Lookups(plan, store).resolve(stage)
        if key is None:
            for name in stage.reads:
                execute(BY_NAME[name], plan, store, case, producer)
            key, upstream = graph.Lookups(plan, store).resolve(stage)
        if key is None:  # another process dropped an upstream entry as damaged between its commit and this read
            raise StageFailed(f"the {stage.name} stage of {plan.case}: an upstream entry it reads was dropped as "
                              "damaged by another process as soon as it was made; verify again")
        hit = None if graph.remeasured(stage, plan) else store.get(stage.name, key)
        if hit is not None:
            return hit, False
        with store.computing(stage.name, key):
            hit = None if graph.remeasured(stage, plan) else store.get(stage.name, key)  # computed by a lock holder
            if hit is not None:
                return hit, False
            made = producer(stage, plan, store, upstream, case)
            if isinstance(made, Produced):
                return _commit(stage, plan, store, key, upstream, made), True
            if attempt:
                raise made.error()
            store.drop(made.error())  # then recompute it, outside this key's lock
    raise AssertionError("unreachable: the second attempt returns or raises")


def produce_here(stage: Stage, plan: Plan, store: Store, upstream: dict[str, Entry],
                 case: CaseSource) -> Produced | DamagedUpstream:
    """Run the stage here on its upstream entries' outputs and store the objects it made. A stage that runs
    user code runs in an isolated child (golden_tasks.forms.isolate): a crash, an exit or a hang there fails
    this stage of this case only (the case crosses: CaseSource.crossing)."""
    if stage.confined:
        return _confined(stage, plan, store, upstream, case)
    return _where_it_runs(stage, plan, run_stage, (stage.name, plan, store, upstream, case))


def _commit(stage: Stage, plan: Plan, store: Store, key: str, upstream: dict[str, Entry], made: Produced) -> Entry:
    """Commit what a producer made as the stage's entry under `key`."""
    return store.commit(stage.name, key, plan.case, made.objects, made.meta, made.stats,
                        {**graph.recipe(stage, plan, upstream), "parts": graph.parts_detail(stage, plan)})


def _where_it_runs(stage: Stage, plan: Plan, target: Callable[..., _T], args: tuple[Any, ...]) -> _T:
    """target(*args), in an isolated child for a stage that runs there (the case, last in `args`, crossing),
    else here."""
    if not stage.isolated:
        return target(*args)
    from ..forms import isolate  # noqa: PLC0415 -- imports torch: only where stages run

    *rest, case = args
    done: _T = isolate.call(target, (*rest, case.crossing(plan)), stage.seconds(plan),  # what target returned
                            f"the {stage.name} stage of {plan.case}")
    return done


def _copied(outputs: Outputs) -> Outputs:
    """The outputs with copies of their tensors: a tensor mapped from a stored file cannot cross into a child."""
    return dataclasses.replace(outputs, tensors={k: t.clone() for k, t in outputs.tensors.items()})


def _confined(stage: Stage, plan: Plan, store: Store, upstream: dict[str, Entry],
              case: CaseSource) -> Produced | DamagedUpstream:
    """As run_stage, for a stage that runs the kernel's own code: its upstream outputs are loaded here, the
    stage runs in a child confined to reading them and the user's sources and writing its work directory
    (isolate.confinement), and what it made is hashed and stored here."""
    from ..forms import isolate  # noqa: PLC0415 -- imports torch: only where stages run

    try:
        inputs = {n: _copied(load_outputs(store, e)) for n, e in upstream.items()}
    except CorruptObject as corruption:
        return DamagedUpstream(corruption.entry, corruption.name, corruption.problem)
    work = reaper.make_temp(f"golden-{stage.name}-")
    try:
        given = [p for o in inputs.values() for p in o.files.values()]
        start = time.perf_counter()
        out = isolate.call(call_stage, (stage.name, plan, inputs, Path(work), case.crossing(plan)),
                           stage.seconds(plan), f"the {stage.name} stage of {plan.case}",
                           isolate.confinement(given, writable=work))
        return store_outputs(store, out, time.perf_counter() - start)
    finally:
        reaper.remove_temp(work)


def run_stage(name: str, plan: Plan, store: Store, upstream: dict[str, Entry],
              case: CaseSource) -> Produced | DamagedUpstream:
    """Load the upstream outputs, run stage `name`'s module, store its objects; DamagedUpstream when an
    upstream object is damaged."""
    try:
        inputs = {n: load_outputs(store, e) for n, e in upstream.items()}
    except CorruptObject as corruption:
        return DamagedUpstream(corruption.entry, corruption.name, corruption.problem)
    work = reaper.make_temp(f"golden-{name}-")
    try:
        start = time.perf_counter()
        out = call_stage(name, plan, inputs, Path(work), case)
        return store_outputs(store, out, time.perf_counter() - start)
    finally:
        reaper.remove_temp(work)


def call_stage(name: str, plan: Plan, inputs: dict[str, Outputs], workdir: Path, case: CaseSource) -> Outputs:
    """Stage `name`'s module on its upstream Outputs (by stage name), seeing only its view of the plan. Only a
    stage that loads the case (Stage.loads_case, all isolated) is handed it: one that runs here (abi, dispatch,
    bench) calls only the artifact, and user code is never loaded beside it."""
    stage = BY_NAME[name]
    if stage.torch:
        config.apply_threads()
    loaded = case.load(plan) if stage.loads_case else None
    out: Outputs = importlib.import_module(stage.module).run(loaded, graph.view(stage, plan), workdir,  # a stage's
                                                             Upstream(**inputs))  # run returns its Outputs
    return out


def replay_stages(plan: Plan, saved: dict[StageName, Outputs], workdir: Path) -> dict[StageName, Outputs]:
    """Every stage a replay runs (InReplay.RUN), in graph order on the outputs of those before it, starting from
    `saved` (stage name -> Outputs: the InReplay.SAVED ones), isolated as in a verify, storing nothing: how a
    runtime dir is replayed. None of them loads the case (its source may be gone): what they read of it (the
    policy, the placement) is saved."""
    outputs = dict(saved)
    for stage in STAGES:
        if stage.replay is InReplay.RUN:
            inputs = {n: _copied(outputs[n]) if stage.isolated else outputs[n] for n in stage.reads
                      if BY_NAME[n].replay is not InReplay.LEFT_OUT}
            outputs[stage.name] = _where_it_runs(stage, plan, call_stage, (stage.name, plan, inputs, workdir, ABSENT))
    return outputs
