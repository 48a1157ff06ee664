"""The task graph: which stages exist, what each reads, and how its key is made.

This is the one place that knows the DAG and the keys; the doit adapter and
the in-process runner both walk it. It imports no torch: keys are computed
from plans and small entry manifests, so the doit parent can check every
stage's status cheaply.

A stage's key is the xxh3-128 of: its name, the pipeline's code version, the
toolchain, the plan fields it depends on, and the digests of the upstream
entries it reads. A stage whose key is in the store is up to date: keys depend
only on content, so reverting an edit finds the earlier entries again, and a
stage whose upstream re-ran but produced the same digests is not re-run
(early cutoff).
"""
import dataclasses
import functools
import importlib
import tempfile
import time
from pathlib import Path

from .hashing import digest_file, digest_json
from .store import CorruptObject, Entry, Store, object_problem
from .toolchain import toolchain


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    doc: str
    reads: tuple = ()  # upstream stages: their digests enter the key, their outputs are passed in
    after: tuple = ()  # ordering only
    plan_fields: tuple = ()  # plan entries that enter the key
    live: bool = True  # needs the imported case (kernel, golden, specs, comparators)
    torch: bool = True  # computes with torch (its worker sizes the thread pools first)


STAGES = (
    Stage("abi", "check the specs against the kernel's parameter table",
          plan_fields=("params", "signature"), live=False, torch=False),
    Stage("compile", "compile the kernel for the spec shapes", reads=("abi",),
          plan_fields=("kernel", "backend", "options")),
    Stage("inputs", "generate the seeded In/InOut tensors (or read them from a data dir)", reads=("abi",),
          plan_fields=("specs", "seed", "data_in")),
    Stage("golden", "run the golden on the inputs (or read its outputs from a data dir)", reads=("abi", "inputs"),
          plan_fields=("golden", "bench", "data_out")),
    Stage("dispatch", "run the compiled kernel on the inputs", reads=("abi", "compile", "inputs"), live=False),
    Stage("validate", "compare the kernel's outputs with the golden's", reads=("dispatch", "golden"),
          plan_fields=("policy",)),
    Stage("bench", "time the kernel", reads=("abi", "compile", "inputs"), after=("validate",),
          plan_fields=("bench",), live=False),
)
BY_NAME = {s.name: s for s in STAGES}


# Modules that only present or schedule results; editing them cannot change a stage's output.
_NOT_IN_VERSION = {"cli.py", "report.py", "doit_tasks.py"}


@functools.cache
def pipeline_version() -> str:
    """Digest of the package's source that shapes outputs: editing it invalidates every entry."""
    root = Path(__file__).parent
    return digest_json({str(p.relative_to(root)): digest_file(p) for p in sorted(root.rglob("*.py"))
                        if p.name not in _NOT_IN_VERSION})


def recipe(stage: Stage, plan: dict, upstream: dict) -> dict:
    """Everything that enters the stage's key (the key is its digest)."""
    return {
        "stage": stage.name,
        "pipeline": pipeline_version(),
        "toolchain": toolchain(),
        "plan": {f: plan[f] for f in stage.plan_fields},
        "upstream": {n: e.digest for n, e in upstream.items()},
    }


def resolve(stage: Stage, plan: dict, store: Store):
    """(key, upstream entries) for a stage, or (None, {}) while an upstream is not cached.

    A resolved key is memoized on the store: it depends only on the plan and on
    immutable upstream entries (the store forgets its memo when it drops one).
    The memo holds the plan itself, so its id cannot be reused by another plan.
    """
    memo = store.resolved.get((stage.name, id(plan)))
    if memo is not None and memo[0] is plan:
        return memo[1], memo[2]
    upstream = {}
    for name in stage.reads:
        key, _ = resolve(BY_NAME[name], plan, store)
        entry = store.get(name, key) if key else None
        if entry is None:
            return None, {}
        upstream[name] = entry
    key = digest_json(recipe(stage, plan, upstream))
    store.resolved[(stage.name, id(plan))] = (plan, key, upstream)
    return key, upstream


def cached(stage: Stage, plan: dict, store: Store):
    """The stage's cached entry under its current key, or None."""
    key, _ = resolve(stage, plan, store)
    return store.get(stage.name, key) if key else None


def _tensors():
    """The tensor I/O module, imported only when a stage has tensors (it imports torch)."""
    return importlib.import_module("golden_tasks.tensors")


def load_outputs(store: Store, entry: Entry):
    """The entry's outputs, every object re-hashed; raises CorruptObject naming the entry."""
    from .stages import Outputs  # noqa: PLC0415

    out = Outputs(meta=entry.meta, stats=entry.stats)
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


def execute(stage: Stage, plan: dict, store: Store, case=None, retried=False) -> tuple[Entry, bool]:
    """Run the stage unless its key is cached; return (entry, ran).

    Upstream stages that are not cached (never run, or dropped as corrupt) are
    run first. `case` is the live case when the caller has it; otherwise it is
    imported (and checked against the plan) only for stages that need it.
    """
    key, upstream = resolve(stage, plan, store)
    if key is None:
        for name in stage.reads:
            execute(BY_NAME[name], plan, store, case)
        key, upstream = resolve(stage, plan, store)
    hit = store.get(stage.name, key)
    if hit is not None:
        return hit, False
    if case is None and stage.live:
        from .case import live_case  # noqa: PLC0415

        case = live_case(plan)
    module = importlib.import_module(f"golden_tasks.stages.{stage.name}")
    try:
        inputs = {n: load_outputs(store, e) for n, e in upstream.items()}
    except CorruptObject as corruption:  # recompute what went bad, then read it again
        if retried:
            raise
        store.drop(corruption)
        return execute(stage, plan, store, case, retried=True)
    with tempfile.TemporaryDirectory(prefix=f"golden-{stage.name}-") as work:
        start = time.perf_counter()
        out = module.run(case, plan, Path(work), **inputs)
        elapsed = time.perf_counter() - start
        objects = {n: {**_tensors().put_tensor(store, t), "kind": "tensor"} for n, t in out.tensors.items()}
        objects.update({n: {**store.put_file(Path(p)), "kind": "file"} for n, p in out.files.items()})
    detail = {f: plan["parts"][f] for f in stage.plan_fields if f in plan.get("parts", {})}
    entry = store.commit(stage.name, key, plan["case"], objects, out.meta, {**out.stats, "seconds": elapsed},
                         {**recipe(stage, plan, upstream), "parts": detail})
    return entry, True
