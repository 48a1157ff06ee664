"""A stage's output as the store records it (Entry), and the damage it can show (CorruptObject).

The store (storage.store) writes and finds entries; what one holds, and what its digest covers, is here.
"""
import dataclasses
import json
from typing import Any

from ..model.hashing import digest_json
from ..model.records import BadRecord, StoredObject, StoredTensor

# The coarsest timestamp granularity of the file systems a cache or a source tree may live on (2 s: FAT, some
# network file systems): two writes this close may carry the same modification time.
RACY_NS = 2_000_000_000


class CorruptObject(Exception):
    """A stored object no longer matches its recorded digest."""

    def __init__(self, entry: "Entry", name: str | None, problem: str) -> None:
        what = f"object {name!r}" if name is not None else "its record"
        super().__init__(f"cache entry {entry.stage}:{entry.case} (key {entry.key[:12]}): {what} {problem}")
        self.entry, self.name, self.problem = entry, name, problem


# An entry's JSON names each object's record type by its "kind".
_KINDS: dict[str, type[StoredObject]] = {"tensor": StoredTensor, "file": StoredObject}
_KIND_OF = {record_type: kind for kind, record_type in _KINDS.items()}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cached stage output: its objects' records by name, its meta and stats (JSON).

    `digest` covers every object and `meta`, the deterministic part that
    downstream keys read; `stats` (timings), `recipe` (the digest of the object
    that holds what went into the key: Store.recipe), `seen` (each object's
    mtime when recorded) and `committed` (when, in ns) are informational and kept
    out of it, so that a re-run producing the same outputs keeps its digest.
    """
    stage: str
    key: str
    case: str
    digest: str
    objects: dict[str, StoredObject]
    meta: dict[str, Any]  # JSON
    stats: dict[str, Any]  # JSON
    recipe: str | None = None
    seen: dict[str, int] = dataclasses.field(default_factory=dict)  # object digest -> its mtime (ns)
    committed: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Entry":
        """The entry an entry file holds. TypeError: it does not hold an entry's fields; CorruptObject (naming
        the entry, without its objects: none of them can be checked): an object's record is malformed."""
        entry = cls(**data)
        try:
            if not isinstance(entry.objects, dict):
                raise BadRecord(f"objects: expected an object, got {json.dumps(entry.objects)[:80]}")
            objects = {name: _object_of(record, f"objects.{name}") for name, record in entry.objects.items()}
        except BadRecord as exc:
            raise CorruptObject(dataclasses.replace(entry, objects={}), None, f"is malformed: {exc}") from None
        return dataclasses.replace(entry, objects=objects)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "objects": _objects_json(self.objects)}

    def intact(self) -> bool:
        """Whether the objects and metadata are still those its digest was made from."""
        return content_digest(self.objects, self.meta) == self.digest

    def proof_of_content(self, digest: str) -> int | None:
        """The modification time that shows an object unchanged since the commit: the one recorded, if it
        is RACY_NS older than the commit (a write after the commit then gives another time), else None."""
        seen = self.seen.get(digest)
        return seen if seen is not None and self.committed and seen <= self.committed - RACY_NS else None


def content_digest(objects: dict[str, StoredObject], meta: dict[str, Any]) -> str:
    """An entry's digest: of its objects' records and its meta."""
    return digest_json({"objects": _objects_json(objects), "meta": meta})


def _object_of(data: Any, where: str) -> StoredObject:
    """An object's record from an entry's JSON: its kind's type (_KINDS) read from the other fields."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in _KINDS:
        raise BadRecord(f"{where}: expected an object's record, its kind one of {', '.join(_KINDS)}, got "
                        f"{json.dumps(data)[:80]}")
    return _KINDS[kind].from_json({k: v for k, v in data.items() if k != "kind"}, where)


def _objects_json(objects: dict[str, StoredObject]) -> dict[str, dict[str, Any]]:
    """The objects' records as an entry's JSON holds them: each with its kind."""
    return {name: {**record.to_json(), "kind": _KIND_OF[type(record)]} for name, record in objects.items()}
