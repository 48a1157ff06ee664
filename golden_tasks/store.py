"""Content-addressed store: immutable objects by digest, stage entries by key.

Layout under the root:
    objects/<d[:2]>/<digest>            raw bytes (tensor data, compiled artifacts)
    entries/<stage>/<k[:2]>/<key>.json  one stage output: its objects and metadata

Every file appears by atomic rename of a fully written temporary file, and an
entry is written only after all of its objects, so an interrupted run never
leaves a half-written entry that a later run trusts.
"""
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .hashing import digest_bytes, digest_file, digest_json


@dataclass(frozen=True)
class Entry:
    """One cached stage output.

    `digest` covers every object and `meta`, the deterministic part that
    downstream keys read; `stats` (timings) is informational and kept out of it
    so that a re-run producing the same outputs does not invalidate dependants.
    """
    stage: str
    key: str
    case: str
    digest: str
    objects: dict
    meta: dict
    stats: dict


def atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class Store:
    def __init__(self, root):
        self.root = Path(root)
        self._hits = {}  # entries are immutable once written: memoize found ones

    def object_path(self, digest: str) -> Path:
        return self.root / "objects" / digest[:2] / digest

    def entry_path(self, stage: str, key: str) -> Path:
        return self.root / "entries" / stage / key[:2] / f"{key}.json"

    def put_buffer(self, buf) -> dict:
        """Store a buffer-protocol object; return its object record (digest, nbytes)."""
        view = memoryview(buf).cast("B")
        digest = digest_bytes(view)
        path = self.object_path(digest)
        if not path.exists():
            atomic_write(path, lambda f: f.write(view))
        return {"digest": digest, "nbytes": view.nbytes}

    def put_file(self, src: Path) -> dict:
        digest = digest_file(src)
        path = self.object_path(digest)
        if not path.exists():
            with open(src, "rb") as s:
                atomic_write(path, lambda f: shutil.copyfileobj(s, f))
        return {"digest": digest, "nbytes": os.path.getsize(path)}

    def get(self, stage: str, key: str):
        """The entry for (stage, key), or None when absent or missing an object."""
        hit = self._hits.get((stage, key))
        if hit is not None:
            return hit
        try:
            data = json.loads(self.entry_path(stage, key).read_text())
        except (OSError, ValueError):
            return None
        for obj in data["objects"].values():
            try:
                if os.path.getsize(self.object_path(obj["digest"])) != obj["nbytes"]:
                    return None
            except OSError:
                return None
        entry = Entry(**data)
        self._hits[(stage, key)] = entry
        return entry

    def commit(self, stage: str, key: str, case: str, objects: dict, meta: dict, stats: dict) -> Entry:
        """Record a stage output whose objects are already stored."""
        digest = digest_json({"objects": objects, "meta": meta})
        entry = Entry(stage=stage, key=key, case=case, digest=digest, objects=objects, meta=meta, stats=stats)
        text = json.dumps(entry.__dict__, sort_keys=True, indent=1).encode()
        atomic_write(self.entry_path(stage, key), lambda f: f.write(text))
        self._hits[(stage, key)] = entry
        return entry
