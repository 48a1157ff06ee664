"""The task graph: which stages exist, what each reads, and how its key is made.

This is the one place that knows the DAG and the keys; the doit adapter and
the in-process runner both walk it. It imports no torch: keys are computed
from plans and small entry manifests, so the doit parent can check every
stage's status cheaply.

A stage's key is the xxh3-128 of: its name, the pipeline's code version, the
toolchain, the plan fields that declare it (golden_tasks.model.plan: the nonce among
them, a fresh value on every run for a plan with parts that cannot be
fingerprinted), and the digests of the upstream entries it reads. A stage is
handed only those plan fields and the few every stage may read (Plan.view), so
it cannot read one that its key does not cover. A stage whose key is in the store is up to date: keys depend
only on content, so reverting an edit finds the earlier entries again, and a
stage whose upstream re-ran but produced the same digests is not re-run
(early cutoff).
"""
import dataclasses
import enum
import importlib
import json
import time
from pathlib import Path

from ..model.hashing import digest_json
from ..model.outputs import (
    SAMPLES_FILE,
    AbiMeta,
    BenchMeta,
    CompileMeta,
    DispatchMeta,
    InputsMeta,
    Meta,
    Outputs,
    Stats,
    ValidateMeta,
    join_timing,
)
from ..model.plan import BenchSettings, Plan, keyed_fields
from ..project import config, reaper
from ..project.toolchain import hardware, machine, pipeline_version, toolchain, visible_gpus
from ..storage.store import CorruptObject, Entry, Store, object_problem


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    doc: str
    reads: tuple = ()  # upstream stages: their digests enter the key, their outputs are passed in
    after: tuple = ()  # ordering only
    live: bool = True  # runs user code (kernel body, golden, init values, comparators): in an isolated child
    confined: bool = False  # runs the kernel's own code: in a confined child that writes nothing but its outputs
    torch: bool = True  # computes with torch (its worker sizes the thread pools first)
    budget: object = None  # live stages: plan -> seconds its isolated run may take before it counts as hung
    meta: type = Meta  # the type of its outputs' meta (golden_tasks.model.outputs)
    timing: bool = False  # measures time: the machine enters its key (toolchain.machine)
    replayed: bool = True  # a replay runs it when its outputs are not saved (it needs no kernel module)

    @property
    def plan_fields(self) -> tuple:
        """The plan fields that enter this stage's key (each field declares its stages)."""
        return keyed_fields(self.name)


# Seconds a compile may spend in the compiler itself, beyond the case's timeout for each of the
# two runs of the kernel body (the write check and the trace).
COMPILE_SECONDS = 1800.0


def _making(plan: Plan) -> float:
    """Seconds to make a case's tensors and run its golden once."""
    return plan.timeout * (1 + len(plan.specs))


def _timing(plan: Plan) -> float:
    """Seconds a timing of the golden may take (BenchSettings.longest)."""
    return BenchSettings(**plan.bench).longest(plan.timeout) + _making(plan)


STAGES = (
    Stage("abi", "check the specs against the kernel's parameter table", live=False, torch=False, meta=AbiMeta),
    Stage("compile", "compile the kernel for the spec shapes (scalar values are compiled in)", reads=("abi",),
          budget=lambda plan: COMPILE_SECONDS + 2 * plan.timeout, meta=CompileMeta, confined=True),
    Stage("inputs", "generate the seeded In/InOut tensors (or read them from a data dir)", reads=("abi",),
          budget=_making, meta=InputsMeta),
    Stage("golden", "run the golden on the inputs (or read its outputs from a data dir)", reads=("abi", "inputs"),
          budget=_making),
    Stage("dispatch", "run the compiled kernel on the inputs", reads=("abi", "compile", "inputs"), live=False,
          meta=DispatchMeta),
    Stage("validate", "compare the kernel's outputs with the golden's", reads=("dispatch", "golden", "inputs"),
          budget=lambda plan: 2 * plan.timeout, meta=ValidateMeta),
    Stage("inputs2", "a second input set (seed + 1) for the benchmark's recheck, and sets it meets once (seed + 2...)",
          reads=("abi",),
          budget=_making, meta=InputsMeta),
    Stage("golden2", "run the golden on the second input set", reads=("abi", "inputs2"), budget=_making),
    Stage("bench", "time the kernel; recheck its last timed round and its outputs on the second input set",
          reads=("abi", "compile", "inputs", "golden", "validate", "inputs2", "golden2"), live=False,
          meta=BenchMeta, timing=True),
    Stage("golden_bench", "time the golden on the inputs", reads=("abi", "inputs"), after=("golden",),
          budget=_timing, timing=True, replayed=False),
)
BY_NAME = {s.name: s for s in STAGES}


def recipe(stage: Stage, plan: Plan, upstream: dict) -> dict:
    """Everything that enters the stage's key (the key is its digest)."""
    return {
        "stage": stage.name,
        "pipeline": pipeline_version(),
        "toolchain": toolchain(),
        **({"machine": machine()} if stage.timing else {}),
        "plan": plan.keyed(stage.name),
        "upstream": {n: e.digest for n, e in upstream.items()},
    }


def resolve(stage: Stage, plan: Plan, store: Store, found: dict = None):
    """(key, upstream entries) for a stage, or (None, {}) while an upstream is not cached.

    Entries are read from the store on every call, never remembered across calls:
    another process may have replaced one since. `found` shares the lookups of
    one resolution (stage -> entry or None).
    """
    found = {} if found is None else found
    upstream = {}
    for name in stage.reads:
        if name not in found:
            key, _ = resolve(BY_NAME[name], plan, store, found)
            found[name] = store.get(name, key) if key else None
        if found[name] is None:
            return None, {}
        upstream[name] = found[name]
    return _key(stage, plan, upstream), upstream


def _key(stage: Stage, plan: Plan, upstream: dict) -> str:
    """The digest of the stage's recipe, made once per plan object for the same upstream digests and
    toolchain (a status check, a report row and a runtime dir each ask again in one run)."""
    made = (stage.name, id(toolchain()), stage.timing and visible_gpus(), tuple(e.digest for e in upstream.values()))
    if made not in plan.keys_made:
        plan.keys_made[made] = digest_json(recipe(stage, plan, upstream))
    return plan.keys_made[made]


def remeasured(stage: Stage, plan: Plan) -> bool:
    """Whether this run measures `stage` again although its entry is cached (`fresh=1`, a timing stage)."""
    return stage.timing and plan.fresh


def cached(stage: Stage, plan: Plan, store: Store, found: dict = None):
    """The stage's cached entry under its current key, or None. `found` (stage -> entry or None)
    shares the lookups of several calls that read the store at one moment (see `resolve`)."""
    found = {} if found is None else found
    if stage.name not in found:
        key, _ = resolve(stage, plan, store, found)
        found[stage.name] = store.get(stage.name, key) if key else None
    return found[stage.name]


class Missing(enum.Enum):
    """Why a stage has no usable cached entry (NotCached.kind): each says so, naming NotCached.detail."""
    REMEASURED = "fresh=1 measures its timings again"
    UPSTREAM = "its key depends on upstream {detail}, not cached yet"
    VOLATILE = "it recomputes on every run: it depends on what cannot be fingerprinted: {detail}"
    DAMAGED = "its cached entry (key {detail:.16}) is damaged or unreadable, so it is computed again"
    NO_ENTRY = "no cached entry under its key {detail:.16}"


@dataclasses.dataclass(frozen=True)
class NotCached:
    """Why a stage is not cached: the kind, and the detail that names it (the upstream stages not
    cached, the reasons it is volatile) or the key it has no entry under."""
    kind: Missing
    detail: str

    def __str__(self) -> str:
        return self.kind.value.format(detail=self.detail)


def not_cached(stage: Stage, plan: Plan, store: Store, found: dict) -> NotCached | None:
    """Why `stage` of `plan` has no usable cached entry, or None when it has one (the answer of `cached`,
    never a hit it would not give; the reasons cost lookups only on a miss). `found` as `resolve`'s:
    the entry found is added to it."""
    if remeasured(stage, plan):
        return NotCached(Missing.REMEASURED, "")
    if plan.volatile:  # every key holds this run's nonce (Plan.for_this_run): nothing is found, upstream neither
        return NotCached(Missing.VOLATILE, "; ".join(plan.volatile))
    key, _ = resolve(stage, plan, store, found)
    if key is None:
        missing = [n for n in stage.reads if cached(BY_NAME[n], plan, store, found) is None]
        return NotCached(Missing.UPSTREAM, ", ".join(missing))
    if (hit := store.get(stage.name, key)) is not None:
        found[stage.name] = hit
        return None
    # an entry the lookup dropped as damaged (with a warning), or one it cannot parse
    if any((stage.name, key) in s.dropped or s.entry_path(stage.name, key).exists()
           for s in (store, store.overlay) if s is not None):
        return NotCached(Missing.DAMAGED, key)
    return NotCached(Missing.NO_ENTRY, key)


def snapshot(plan: Plan, store: Store, found: dict = None) -> dict:
    """stage -> its cached entry (or None) for every stage, each entry read once; `found` as `resolve`'s."""
    found = {} if found is None else found
    return {s.name: cached(s, plan, store, found) for s in STAGES}


def _tensors():
    """The tensor I/O module, imported only when a stage has tensors (it imports torch)."""
    return importlib.import_module("golden_tasks.storage.tensors")


def load_outputs(store: Store, entry: Entry):
    """The entry's outputs, every object re-hashed; raises CorruptObject naming the entry."""
    out = Outputs(meta=BY_NAME[entry.stage].meta.of(entry), stats=Stats.of(entry))
    for name, record in entry.objects.items():
        if record["kind"] == "tensor":
            try:
                out.tensors[name] = _tensors().load_tensor(store, record)
            except ValueError as exc:
                raise CorruptObject(entry, name, str(exc)) from None
        else:
            path = store.object_path(record["digest"])
            problem = object_problem(path, record)
            if problem:
                raise CorruptObject(entry, name, problem)
            out.files[name] = path
    return out


def execute(stage: Stage, plan: Plan, store: Store, case=None, producer=None) -> tuple[Entry, bool]:
    """Run the stage unless its key is cached; return (entry, ran).

    Upstream stages that are not cached (never run, or dropped as corrupt) are
    run first. `case` is the live case when the caller has it; otherwise it is
    imported (and checked against the plan) only for stages that need it. An
    upstream object found corrupt while loading is dropped and recomputed once.
    `producer` runs a stage and stores what it made (default: produce_here; an
    executor's runs it elsewhere); the entry is committed here either way.
    """
    producer = producer or produce_here
    for attempt in range(2):
        key, upstream = resolve(stage, plan, store)
        if key is None:
            for name in stage.reads:
                execute(BY_NAME[name], plan, store, case, producer)
            key, upstream = resolve(stage, plan, store)
        hit = None if remeasured(stage, plan) else store.get(stage.name, key)
        if hit is not None:
            return hit, False
        with store.computing(stage.name, key):
            hit = None if remeasured(stage, plan) else store.get(stage.name, key)  # computed by a lock holder
            if hit is not None:
                return hit, False
            try:
                return _commit(stage, plan, store, key, upstream, producer(stage, plan, store, upstream, case)), True
            except CorruptObject as corruption:
                if attempt:
                    raise
                store.drop(corruption)  # then recompute it, outside this key's lock


def produce_here(stage: Stage, plan: Plan, store: Store, upstream: dict, case) -> tuple:
    """Run the stage here on its upstream entries' outputs and store the objects it made: ("done", objects,
    meta, stats), or ("corrupt", entry, object name, problem) for a damaged upstream object. A stage that
    runs user code runs in an isolated child (golden_tasks.forms.isolate): a crash, an exit or a hang there
    fails this stage of this case only. The live case crosses by value; without one the child imports it
    (and checks it against the plan)."""
    if stage.confined:
        return _confined(stage, plan, store, upstream, case)
    return _where_it_runs(stage, plan, run_stage, (stage.name, plan, store, upstream, case))


def _commit(stage: Stage, plan: Plan, store: Store, key: str, upstream: dict, done: tuple) -> Entry:
    """Commit what a producer made as the stage's entry under `key`."""
    if done[0] == "corrupt":
        raise CorruptObject(*done[1:])
    _, objects, meta, stats = done
    return store.commit(stage.name, key, plan.case, objects, meta, stats,
                        {**recipe(stage, plan, upstream), "parts": parts_detail(stage, plan)})


def parts_detail(stage: Stage, plan: Plan) -> dict:
    """The parts of the fingerprints in the stage's key, recorded beside it for `golden-tasks explain`."""
    return {f: plan.parts[f] for f in stage.plan_fields if f in plan.parts}


def _where_it_runs(stage: Stage, plan: Plan, target, args: tuple):
    """target(*args), in an isolated child for a stage that runs user code (the live case, last
    in `args`, crossing by value), else here."""
    if not stage.live:
        return target(*args)
    from ..forms import isolate  # noqa: PLC0415 -- imports torch: only where stages run

    *rest, case = args
    return isolate.call(target, (*rest, case and by_value(case, plan)), stage.budget(plan),
                        f"the {stage.name} stage of {plan.case}")


def _confined(stage: Stage, plan: Plan, store: Store, upstream: dict, case) -> tuple:
    """As run_stage, for a stage that runs the kernel's own code: its upstream outputs are loaded here (a
    damaged one raises CorruptObject, as _commit would for run_stage's "corrupt"), the stage runs in a
    child confined to reading them and the user's sources and writing its work directory
    (isolate.confinement), and what it made is hashed and stored here."""
    from ..forms import isolate  # noqa: PLC0415 -- imports torch: only where stages run

    loaded = {n: load_outputs(store, e) for n, e in upstream.items()}
    # a tensor mapped from a stored file cannot cross into the child; a copy can
    inputs = {n: dataclasses.replace(o, tensors={k: t.clone() for k, t in o.tensors.items()})
              for n, o in loaded.items()}
    work = reaper.make_temp(f"golden-{stage.name}-")
    try:
        given = [p for o in inputs.values() for p in o.files.values()]
        start = time.perf_counter()
        out = isolate.call(call_stage, (stage.name, plan, inputs, Path(work), case and by_value(case, plan)),
                           stage.budget(plan), f"the {stage.name} stage of {plan.case}",
                           isolate.confinement(given, writable=work))
        elapsed = time.perf_counter() - start
        return "done", *_stored(store, out, elapsed)
    finally:
        reaper.remove_temp(work)


def _stored(store: Store, out, elapsed: float) -> tuple:
    """(objects, meta, stats) of a stage's Outputs, its tensors and files put in the store, and its timings'
    round times in the object SAMPLES_FILE (the stats keep their summary: Stats.split)."""
    objects = {n: {**_tensors().put_tensor(store, t), "kind": "tensor"} for n, t in out.tensors.items()}
    objects.update({n: {**store.put_file(Path(p)), "kind": "file"} for n, p in out.files.items()})
    stats, samples = dataclasses.replace(out.stats, seconds=elapsed, node=hardware()).split()
    if samples:
        objects[SAMPLES_FILE] = {**store.put_buffer(json.dumps(samples, sort_keys=True).encode()), "kind": "file"}
    return objects, out.meta.to_json(), stats.to_json()


def load_timings(store: Store, entry: Entry) -> Stats:
    """The entry's stats with every round time (its SAMPLES_FILE joined in); raises CorruptObject."""
    stats, record = Stats.of(entry), entry.objects.get(SAMPLES_FILE)
    if record is None:
        return stats
    path = store.object_path(record["digest"])
    if problem := object_problem(path, record):
        raise CorruptObject(entry, SAMPLES_FILE, problem)
    samples = json.loads(path.read_bytes())
    return dataclasses.replace(stats, **{f: join_timing(getattr(stats, f), s) for f, s in samples.items()})


def replay(plan: Plan, saved: dict, case, workdir: Path) -> dict:
    """Every stage whose outputs are not in `saved` (stage -> Outputs), run in graph order on the
    outputs of those that are, isolated as in a verify, storing nothing: how a runtime dir is
    replayed. `case` provides what those stages read of the case (for validate: its policy)."""
    outputs = dict(saved)
    for stage in STAGES:
        if stage.name not in outputs and stage.replayed:
            # a tensor mapped from a saved file cannot cross into an isolated child; a copy can
            inputs = {n: dataclasses.replace(outputs[n], tensors={k: t.clone() for k, t in outputs[n].tensors.items()})
                      if stage.live else outputs[n] for n in stage.reads}
            outputs[stage.name] = _where_it_runs(stage, plan, call_stage, (stage.name, plan, inputs, workdir, case))
    return outputs


def by_value(case, plan: Plan) -> bytes:
    """The live case pickled with its user code, to cross into the isolated child (or to a cluster's node,
    whose stages get it so: bytes already)."""
    from ..model.errors import SpecError  # noqa: PLC0415
    from ..model.origin import dumps_by_value  # noqa: PLC0415

    if isinstance(case, bytes):
        return case
    try:
        return dumps_by_value(case)
    except Exception as exc:  # noqa: BLE001 -- an object that no pickler can carry: a lock, an open file
        raise SpecError(f"case {plan.case!r}: its kernel, golden and comparators run in an isolated process, "
                        f"so they must pickle, and they do not: {type(exc).__name__}: {exc}") from None


def run_stage(name: str, plan: Plan, store: Store, upstream: dict, case) -> tuple:
    """Load the upstream outputs, run stage `name`'s module, store its objects: ("done", objects,
    meta, stats), or ("corrupt", entry, object name, problem) when an upstream object is damaged.
    `case`: the live case, its pickled bytes, or None to import it."""
    try:
        inputs = {n: load_outputs(store, e) for n, e in upstream.items()}
    except CorruptObject as corruption:
        return "corrupt", corruption.entry, corruption.name, corruption.problem
    work = reaper.make_temp(f"golden-{name}-")
    try:
        start = time.perf_counter()
        out = call_stage(name, plan, inputs, Path(work), case)
        return "done", *_stored(store, out, time.perf_counter() - start)
    finally:
        reaper.remove_temp(work)


def call_stage(name: str, plan: Plan, inputs: dict, workdir: Path, case):
    """Stage `name`'s module on its upstream Outputs, seeing only its view of the plan. `case`: the
    live case, its pickled bytes, or None to import it (and check it against the plan)."""
    stage = BY_NAME[name]
    if stage.torch:
        config.apply_threads()
    if isinstance(case, bytes):
        import cloudpickle  # noqa: PLC0415

        case = cloudpickle.loads(case)
    elif case is None and stage.live:
        from ..planning.case import live_case  # noqa: PLC0415 -- imports torch

        case = live_case(plan)
    return importlib.import_module(f"golden_tasks.stages.{name}").run(case, plan.view(name), workdir, **inputs)
