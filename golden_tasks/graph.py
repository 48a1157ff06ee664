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
from .store import Entry, Store
from .toolchain import toolchain


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    doc: str
    reads: tuple = ()  # upstream stages: their digests enter the key, their outputs are passed in
    after: tuple = ()  # ordering only
    plan_fields: tuple = ()  # plan entries that enter the key
    live: bool = True  # needs the imported case (kernel, golden, specs, comparators)


STAGES = (
    Stage("abi", "check the specs against the kernel's parameter table",
          plan_fields=("params", "signature"), live=False),
    Stage("compile", "compile the kernel for the spec shapes", reads=("abi",),
          plan_fields=("kernel", "backend", "options")),
    Stage("inputs", "generate the seeded In/InOut tensors", reads=("abi",), plan_fields=("specs", "seed")),
    Stage("golden", "run the golden on the inputs", reads=("abi", "inputs"), plan_fields=("golden", "bench")),
    Stage("dispatch", "run the compiled kernel on the inputs", reads=("abi", "compile", "inputs"), live=False),
    Stage("validate", "compare the kernel's outputs with the golden's", reads=("dispatch", "golden"),
          plan_fields=("policy",)),
    Stage("bench", "time the kernel", reads=("abi", "compile", "inputs"), after=("validate",),
          plan_fields=("bench",), live=False),
)
BY_NAME = {s.name: s for s in STAGES}


@functools.cache
def pipeline_version() -> str:
    """Digest of the package's own source: a change to any stage invalidates its entries."""
    root = Path(__file__).parent
    return digest_json({str(p.relative_to(root)): digest_file(p) for p in sorted(root.rglob("*.py"))})


def resolve(stage: Stage, plan: dict, store: Store):
    """(key, upstream entries) for a stage, or (None, {}) while an upstream is not cached."""
    upstream = {}
    for name in stage.reads:
        key, _ = resolve(BY_NAME[name], plan, store)
        entry = store.get(name, key) if key else None
        if entry is None:
            return None, {}
        upstream[name] = entry
    key = digest_json({
        "stage": stage.name,
        "pipeline": pipeline_version(),
        "toolchain": toolchain(),
        "plan": {f: plan[f] for f in stage.plan_fields},
        "upstream": {n: e.digest for n, e in upstream.items()},
    })
    return key, upstream


def cached(stage: Stage, plan: dict, store: Store):
    """The stage's cached entry under its current key, or None."""
    key, _ = resolve(stage, plan, store)
    return store.get(stage.name, key) if key else None


def _tensors():
    """The tensor I/O module, imported only when a stage has tensors (it imports torch)."""
    return importlib.import_module("golden_tasks.tensors")


def load_outputs(store: Store, entry: Entry):
    from .stages import Outputs  # noqa: PLC0415

    tensors = {n: _tensors().load_tensor(store, r) for n, r in entry.objects.items() if r["kind"] == "tensor"}
    files = {n: store.object_path(r["digest"]) for n, r in entry.objects.items() if r["kind"] == "file"}
    return Outputs(tensors=tensors, files=files, meta=entry.meta, stats=entry.stats)


def execute(stage: Stage, plan: dict, store: Store, case=None) -> tuple[Entry, bool]:
    """Run the stage unless its key is cached; return (entry, ran).

    `case` is the live case when the caller has it; otherwise it is imported
    (and checked against the plan) only for stages that need it.
    """
    key, upstream = resolve(stage, plan, store)
    if key is None:
        missing = [n for n in stage.reads if cached(BY_NAME[n], plan, store) is None]
        raise RuntimeError(f"{stage.name}:{plan['case']} needs {', '.join(missing)} first")
    hit = store.get(stage.name, key)
    if hit is not None:
        return hit, False
    if case is None and stage.live:
        from .case import live_case  # noqa: PLC0415

        case = live_case(plan)
    module = importlib.import_module(f"golden_tasks.stages.{stage.name}")
    inputs = {n: load_outputs(store, e) for n, e in upstream.items()}
    with tempfile.TemporaryDirectory(prefix=f"golden-{stage.name}-") as work:
        start = time.perf_counter()
        out = module.run(case, plan, Path(work), **inputs)
        elapsed = time.perf_counter() - start
        objects = {n: {**_tensors().put_tensor(store, t), "kind": "tensor"} for n, t in out.tensors.items()}
        objects.update({n: {**store.put_file(Path(p)), "kind": "file"} for n, p in out.files.items()})
    entry = store.commit(stage.name, key, plan["case"], objects, out.meta, {**out.stats, "seconds": elapsed})
    return entry, True
