"""A stage's output as the store records it (Entry), and the damage it can show (CorruptObject).

The store (storage.store) writes and finds entries; what one holds, and what its digest covers, is here.
"""
from dataclasses import dataclass, field

from ..model.hashing import digest_json

# The coarsest timestamp granularity of the file systems a cache or a source tree may live on (2 s: FAT, some
# network file systems): two writes this close may carry the same modification time.
RACY_NS = 2_000_000_000


class CorruptObject(Exception):
    """A stored object no longer matches its recorded digest."""

    def __init__(self, entry, name: str | None, problem: str):
        what = f"object {name!r}" if name is not None else "its record"
        super().__init__(f"cache entry {entry.stage}:{entry.case} (key {entry.key[:12]}): {what} {problem}")
        self.entry, self.name, self.problem = entry, name, problem


@dataclass(frozen=True)
class Entry:
    """One cached stage output.

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
    objects: dict
    meta: dict
    stats: dict
    recipe: str | None = None
    seen: dict = field(default_factory=dict)
    committed: int | None = None

    def intact(self) -> bool:
        """Whether the objects and metadata are still those its digest was made from."""
        return digest_json({"objects": self.objects, "meta": self.meta}) == self.digest

    def proof_of_content(self, digest: str) -> int | None:
        """The modification time that shows an object unchanged since the commit: the one recorded, if it
        is RACY_NS older than the commit (a write after the commit then gives another time), else None."""
        seen = self.seen.get(digest)
        return seen if seen is not None and self.committed and seen <= self.committed - RACY_NS else None
