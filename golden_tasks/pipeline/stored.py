"""A stage's outputs in the store: put there as objects when it ran, read back re-hashed for what reads them.

Tensors go through storage.tensors (imported only where a stage has tensors: it
imports torch); files and the timings' round times are objects as they are.
"""
import dataclasses
import importlib
import json
from pathlib import Path
from types import ModuleType
from typing import Any

from ..model.outputs import SAMPLES_FILE, Outputs, Stats
from ..model.records import StoredObject, StoredTensor
from ..project.toolchain import hardware
from ..storage.entry import CorruptObject, Entry
from ..storage.store import Store, object_problem
from .stage_table import BY_NAME


@dataclasses.dataclass(frozen=True)
class Produced:
    """What running a stage made, its objects stored: their records by name, its meta and stats (JSON), to be
    committed as the stage's entry."""
    objects: dict[str, StoredObject]
    meta: dict[str, Any]
    stats: dict[str, Any]


def _tensors() -> ModuleType:
    """The tensor I/O module, imported only when a stage has tensors (it imports torch)."""
    return importlib.import_module("golden_tasks.storage.tensors")


def load_outputs(store: Store, entry: Entry) -> Outputs:
    """The entry's outputs, every object re-hashed; raises CorruptObject naming the entry."""
    out = Outputs(meta=BY_NAME[entry.stage].meta.of(entry), stats=Stats.of(entry))
    for name, record in entry.objects.items():
        if isinstance(record, StoredTensor):
            try:
                out.tensors[name] = _tensors().load_tensor(store, record)
            except ValueError as exc:
                raise CorruptObject(entry, name, str(exc)) from None
        else:
            path = store.object_path(record.digest)
            problem = object_problem(path, record)
            if problem:
                raise CorruptObject(entry, name, problem)
            out.files[name] = path
    return out


def store_outputs(store: Store, out: Outputs, elapsed: float) -> Produced:
    """A stage's Outputs, its tensors and files put in the store, and its timings' round times in the object
    SAMPLES_FILE (the stats keep their summary: Stats.split)."""
    objects: dict[str, StoredObject] = {n: _tensors().put_tensor(store, t) for n, t in out.tensors.items()}
    objects.update({n: store.put_file(Path(p)) for n, p in out.files.items()})
    stats, samples = dataclasses.replace(out.stats, seconds=elapsed, node=hardware()).split()
    if samples:
        objects[SAMPLES_FILE] = store.put_buffer(json.dumps(samples, sort_keys=True).encode())
    return Produced(objects, out.meta.to_json(), stats.to_json())


def load_timings(store: Store, entry: Entry) -> Stats:
    """The entry's stats with every round time (its SAMPLES_FILE joined in); raises CorruptObject."""
    stats, record = Stats.of(entry), entry.objects.get(SAMPLES_FILE)
    if record is None:
        return stats
    path = store.object_path(record.digest)
    if problem := object_problem(path, record):
        raise CorruptObject(entry, SAMPLES_FILE, problem)
    return stats.joined(json.loads(path.read_bytes()))
