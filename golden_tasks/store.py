"""Content-addressed store: immutable objects by digest, stage entries by key.

Layout under the root:
    objects/<d[:2]>/<digest>                  raw bytes (tensor data, compiled artifacts)
    entries/<stage>/<k[:2]>/<key>.json        one stage output: its objects, metadata and key recipe
    locks/<stage>/<k[:2]>/<key>.lock          held while a process computes that entry
    plans/<checkout>/<profile>/<module>.json  planned cases of one kernel module of one checkout
    log/runs.jsonl                            hit/miss counts of each run

Every file appears by atomic rename of a fully written, fsynced temporary file,
and an entry is written only after all of its objects, so an interrupted run
never leaves a half-written entry that a later run trusts.

Every object's digest is recorded in the entries that use it, and an entry's
own digest covers its objects and metadata. Looking an entry up checks that
digest and each object's size, and re-hashes an object whose modification time
differs from the one recorded; loading an object re-hashes it. An object that
no longer matches makes its entry a miss, with a warning naming the entry.
Lookups always read the disk: another process may have replaced an entry (a
dropped one recomputed), and a remembered entry would make keys that no
longer exist.

One computation per key at a time: `computing` holds a file lock on the key
(across threads, worker processes, doit processes and `golden_tasks.run`
callers), and whoever waited for it finds the entry made while it waited.

A read-only store never writes under its root: what the run computes goes to
an overlay store (a scratch directory) that is read after the root.
"""
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import VerificationFailure
from .hashing import digest_bytes, digest_file, digest_json


class CacheWriteError(VerificationFailure):
    """The cache cannot be written (permissions, full disk)."""


class CorruptObject(Exception):
    """A stored object no longer matches its recorded digest."""

    def __init__(self, entry, name: str, problem: str):
        what = f"object {name!r}" if name is not None else "its record"
        super().__init__(f"cache entry {entry.stage}:{entry.case} (key {entry.key[:12]}): {what} {problem}")
        self.entry, self.name, self.problem = entry, name, problem


@dataclass(frozen=True)
class Entry:
    """One cached stage output.

    `digest` covers every object and `meta`, the deterministic part that
    downstream keys read; `stats` (timings), `recipe` (what went into the key)
    and `seen` (each object's mtime when recorded) are informational and kept
    out of it, so that a re-run producing the same outputs keeps its digest.
    """
    stage: str
    key: str
    case: str
    digest: str
    objects: dict
    meta: dict
    stats: dict
    recipe: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)

    def intact(self) -> bool:
        """Whether the objects and metadata are still those its digest was made from."""
        return digest_json({"objects": self.objects, "meta": self.meta}) == self.digest


def warn(message: str) -> None:
    sys.stderr.write(f"golden-tasks: warning: {message}\n")


def atomic_write(path: Path, write) -> None:
    """Write `path` through a temporary file and a rename; nothing partial ever appears."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CacheWriteError(_cannot_write(path, exc)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CacheWriteError(_cannot_write(path, exc)) from exc
        raise


def _cannot_write(path: Path, exc: OSError) -> str:
    return (f"cannot write to the cache: {exc.strerror or exc} ({path}). Free space, make it writable, "
            "point GOLDEN_TASKS_CACHE elsewhere, or set GOLDEN_TASKS_CACHE_READONLY=1 to use it read-only")


def object_problem(path: Path, record: dict) -> str:
    """Why the object at `path` does not match `record`, or None when it does."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return "is missing"
    if size != record["nbytes"]:
        return f"has {size} bytes, {record['nbytes']} recorded (truncated?)"
    if digest_file(path) != record["digest"]:
        return "content does not match its digest (corrupted)"
    return None


class Store:
    def __init__(self, root, readonly: bool = False, overlay=None):
        self.root = Path(root)
        self.readonly = readonly
        self.overlay = Store(overlay) if readonly else None
        self._bad = set()  # read-only: corrupt entries left on disk, not to be reported again

    # -- objects --------------------------------------------------------------

    def object_path(self, digest: str) -> Path:
        path = self.root / "objects" / digest[:2] / digest
        if self.overlay is not None and not path.exists():
            return self.overlay.object_path(digest)
        return path

    def put_buffer(self, buf) -> dict:
        """Store a buffer-protocol object; return its object record (digest, nbytes)."""
        view = memoryview(buf).cast("B")
        digest = digest_bytes(view)
        self._write_object(digest, lambda f: f.write(view))
        return {"digest": digest, "nbytes": view.nbytes}

    def put_file(self, src: Path) -> dict:
        digest = digest_file(src)
        with open(src, "rb") as s:
            self._write_object(digest, lambda f: shutil.copyfileobj(s, f))
        return {"digest": digest, "nbytes": os.path.getsize(src)}

    def _write_object(self, digest: str, write) -> None:
        path = self.object_path(digest)
        if path.exists():
            return
        target = self.overlay if self.readonly else self
        atomic_write(target.root / "objects" / digest[:2] / digest, write)

    # -- entries --------------------------------------------------------------

    def entry_path(self, stage: str, key: str) -> Path:
        return self.root / "entries" / stage / key[:2] / f"{key}.json"

    def get(self, stage: str, key: str):
        """The valid entry for (stage, key), or None.

        A corrupt entry (an object missing, truncated or altered) is a miss: it
        is reported, and dropped unless it lies in a read-only root. A read-only
        store finds entries in its root, then in its overlay, and their objects
        in either.
        """
        entry = None if (stage, key) in self._bad else self._read(stage, key)
        if entry is None and self.overlay is not None:
            entry = self.overlay._read(stage, key)
        if entry is None:
            return None
        if not entry.intact():
            self.drop(CorruptObject(entry, None, "does not match its digest (edited?)"))
            return None
        for name, record in entry.objects.items():
            path = self.object_path(record["digest"])
            try:
                st = os.stat(path)
                unchanged = st.st_size == record["nbytes"] and st.st_mtime_ns == entry.seen.get(record["digest"])
            except OSError:
                unchanged = False
            problem = None if unchanged else object_problem(path, record)
            if problem:
                self.drop(CorruptObject(entry, name, problem))
                return None
        if not self.readonly:  # last use, for gc's least-recently-used order
            try:
                os.utime(self.entry_path(stage, key))
            except OSError:
                pass
        return entry

    def _read(self, stage, key):
        try:
            return Entry(**json.loads(self.entry_path(stage, key).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def drop(self, corruption: CorruptObject) -> None:
        """Forget a corrupt entry (and its bad objects) so that its stage is recomputed."""
        entry = corruption.entry
        owner = self.overlay if self.readonly else self
        if not owner.entry_path(entry.stage, entry.key).exists() and self.readonly:  # the read-only root's
            self._bad.add((entry.stage, entry.key))
            warn(f"{corruption}; treating it as a miss (read-only cache: left in place)")
            return
        warn(f"{corruption}; dropping it and recomputing")
        for record in entry.objects.values():
            path = self.object_path(record["digest"])
            if path.is_relative_to(owner.root) and path.exists() and object_problem(path, record):
                path.unlink(missing_ok=True)
        owner.entry_path(entry.stage, entry.key).unlink(missing_ok=True)

    def commit(self, stage: str, key: str, case: str, objects: dict, meta: dict, stats: dict,
               recipe: dict = None) -> Entry:
        """Record a stage output whose objects are already stored."""
        digest = digest_json({"objects": objects, "meta": meta})
        seen = {r["digest"]: os.stat(self.object_path(r["digest"])).st_mtime_ns for r in objects.values()}
        entry = Entry(stage=stage, key=key, case=case, digest=digest, objects=objects, meta=meta, stats=stats,
                      recipe=recipe or {}, seen=seen)
        target = self.overlay if self.readonly else self
        text = json.dumps(entry.__dict__, sort_keys=True, indent=1).encode()
        atomic_write(target.entry_path(stage, key), lambda f: f.write(text))
        return entry

    def computing(self, stage: str, key: str):
        """A FileLock to hold while computing (stage, key): look the entry up again once it is held."""
        from filelock import FileLock  # noqa: PLC0415 -- only where stages run, never in the doit parent

        target = self.overlay if self.readonly else self
        path = target.root / "locks" / stage / key[:2] / f"{key}.lock"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheWriteError(_cannot_write(path, exc)) from exc
        return FileLock(path)

    # -- small files ----------------------------------------------------------

    def read_json(self, relative: str):
        """A JSON file under the store (the overlay first when read-only), or None."""
        for store in ([self.overlay] if self.overlay is not None else []) + [self]:
            try:
                return json.loads((store.root / relative).read_text())
            except (OSError, ValueError):
                continue
        return None

    def remove(self, relative: str) -> None:
        """Remove a small file under the store (the overlay's, when read-only), if it exists."""
        ((self.overlay if self.readonly else self).root / relative).unlink(missing_ok=True)

    def write_json(self, relative: str, data) -> None:
        text = json.dumps(data, sort_keys=True, indent=1).encode()
        atomic_write(((self.overlay if self.readonly else self).root / relative), lambda f: f.write(text))

    def log_run(self, counts: dict) -> None:
        """Append one run's hit/miss counts to log/runs.jsonl (not in read-only mode)."""
        if self.readonly:
            return
        line = json.dumps({"time": time.time(), **counts}, sort_keys=True) + "\n"
        try:
            (self.root / "log").mkdir(parents=True, exist_ok=True)
            with open(self.root / "log" / "runs.jsonl", "a") as f:  # O_APPEND: concurrent lines stay whole
                f.write(line)
        except OSError as exc:
            warn(f"could not log this run's counts: {exc}")
