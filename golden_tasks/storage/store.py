"""Content-addressed store: immutable objects by digest, stage entries by key.

Layout under the root:
    objects/<d[:2]>/<digest>                  raw bytes (tensor data, compiled artifacts)
    entries/<stage>/<k[:2]>/<key>.json        one stage output: its objects, metadata and key recipe
    locks/<stage>/<k[:2]>/<key>.lock          held while a process computes that entry
    plans/<checkout>/<profile>/<module>.json  planned cases of one kernel module of one checkout
    log/runs.jsonl                            hit/miss counts of each run
    log/used/<digest>.txt                     the entries a run used; its mtime: their last use

Every file appears by atomic rename of a fully written, fsynced temporary file,
and an entry is written only after all of its objects, so an interrupted run
never leaves a half-written entry that a later run trusts.

Every object's digest is recorded in the entries that use it, and an entry's
own digest covers its objects and metadata. Looking an entry up checks that
digest and each object's size, and re-hashes an object whose modification time
differs from the one recorded, or was recorded too close to the commit for a
later write to show in it (git's "racy clean" rule: a file system stamps a write
at the granularity of its clock, up to RACY_NS); loading an object re-hashes it.
So that this costs nothing for the objects a run writes, each is stamped as
written RACY_NS in the past, before its name appears: any later write gives it
another time. An object that no longer matches makes its entry a miss, with a
warning naming the entry.
Lookups always read the disk: another process may have replaced an entry (a
dropped one recomputed), and a remembered entry would make keys that no
longer exist.

One computation per key at a time: `computing` holds a file lock on the key
(across threads, worker processes, doit processes and `golden_tasks.run`
callers), and whoever waited for it finds the entry made while it waited.

A read-only store never writes under its root: what the run computes goes to
an overlay store (a scratch directory) that is read after the root.
"""
import enum
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Literal, cast

from ..model.errors import VerificationFailure
from ..model.hashing import digest_bytes, digest_file
from ..model.records import StoredObject
from .entry import RACY_NS, CorruptObject, Entry, content_digest

if TYPE_CHECKING:
    from filelock import FileLock
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class CacheWriteError(VerificationFailure):
    """The cache cannot be written (permissions, full disk)."""


class _Damaged(enum.Enum):  # the sentinel's type: `is _DAMAGED` then narrows what Store._read returns
    DAMAGED = enum.auto()


# Store._read: an entry file that no longer matches its digest, or holds a malformed record
_DAMAGED: Final = _Damaged.DAMAGED


def warn(message: str) -> None:
    sys.stderr.write(f"golden-tasks: warning: {message}\n")


@functools.cache
def umask() -> int:
    """This process's umask: read from /proc, where the kernel shows it, else by setting it and back
    (which, for an instant, leaves other threads' new files unmasked)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def atomic_write(path: Path, write: Callable[[BinaryIO], object], mtime_ns: int | None = None) -> None:
    """Write `path` through a temporary file and a rename; nothing partial ever appears. The file gets the
    mode a plain open() would give it (0666 less the umask: a team sharing a cache reads each other's
    files), not the temporary file's 0600, and `mtime_ns` as its modification time if given."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise CacheWriteError(_cannot_write(path, exc)) from exc
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if mtime_ns is not None:
                os.utime(f.fileno(), ns=(mtime_ns, mtime_ns))
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


def object_problem(path: Path | str, record: StoredObject) -> str | None:
    """Why the object at `path` does not match `record`, or None when it does."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return "is missing"
    if size != record.nbytes:
        return f"has {size} bytes, {record.nbytes} recorded (truncated?)"
    if digest_file(path) != record.digest:
        return "content does not match its digest (corrupted)"
    return None


class Store:
    def __init__(self, root: Path | str, readonly: bool = False, overlay: Path | str | None = None) -> None:
        self.root = Path(root)
        self._root = str(self.root)  # lookups build paths as strings: a Path per lookup costs more than the stat
        self.readonly = readonly
        # a read-only store is given the overlay it writes to (project.config)
        self.overlay = Store(cast("Path | str", overlay)) if readonly else None
        self._bad: set[tuple[str, str]] = set()  # read-only: corrupt entries left on disk, not to be reported again
        self.dropped: set[tuple[str, str]] = set()  # (stage, key) of the entries this process dropped as corrupt
        # entry file -> (its stat signature, its intact Entry): see get
        self._read_before: dict[str, tuple[tuple[int, int, int], Entry]] = {}

    @property
    def _written(self) -> "Store":
        """Where this store writes: its overlay when it is read-only, else itself."""
        return self.overlay if self.overlay is not None else self

    def __getstate__(self) -> dict[str, Any]:  # what this process read stays here: a child reads for itself
        return {**self.__dict__, "_read_before": {}}

    # -- objects --------------------------------------------------------------

    def object_path(self, digest: str) -> Path:
        return Path(self._object_file(digest))

    def _object_file(self, digest: str) -> str:
        """Its file here; a read-only store's overlay copy first: one written there was made in a read-only
        run that found the root's copy damaged or missing (_write_object), and the root's is left in place."""
        if self.overlay is not None:
            written = self.overlay._object_file(digest)
            if os.path.exists(written):
                return written
        return f"{self._root}/objects/{digest[:2]}/{digest}"

    def put_buffer(self, buf: "Buffer") -> StoredObject:
        """Store a buffer-protocol object; return its record."""
        view = memoryview(buf).cast("B")
        digest = digest_bytes(view)
        self._write_object(digest, lambda f: f.write(view))
        return StoredObject(digest=digest, nbytes=view.nbytes)

    def put_file(self, src: Path) -> StoredObject:
        digest = digest_file(src)
        with open(src, "rb") as s:
            self._write_object(digest, lambda f: shutil.copyfileobj(s, f))
        return StoredObject(digest=digest, nbytes=os.path.getsize(src))

    def object_files(self) -> Iterator[Path]:
        """The path of every file in this store's objects folder (not its overlay's): objects, and the
        temporary files of writes in progress or interrupted (*.tmp, dot-files)."""
        return (p for p in (self.root / "objects").glob("*/*") if p.is_file())

    def _write_object(self, digest: str, write: Callable[[BinaryIO], object]) -> None:
        """Write the object unless this store has it, stamped RACY_NS in the past (see the module). A
        read-only store writes to its overlay whatever the overlay lacks: the root's copy under the same
        digest may be the damaged one this run recomputes."""
        path = self._written.object_path(digest)
        if path.exists():
            return
        atomic_write(path, write, mtime_ns=time.time_ns() - RACY_NS)

    # -- entries --------------------------------------------------------------

    def entry_path(self, stage: str, key: str) -> Path:
        return Path(self._entry_file(stage, key))

    def _entry_file(self, stage: str, key: str) -> str:
        return f"{self._root}/entries/{stage}/{key[:2]}/{key}.json"

    def entries(self) -> Iterator[tuple[Path, Entry]]:
        """(path, Entry) for every readable entry manifest in this store (not its overlay), by path."""
        for path in sorted((self.root / "entries").glob("*/*/*.json")):
            try:
                yield path, Entry.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError, CorruptObject):  # unreadable, or a malformed record in it
                continue

    def get(self, stage: str, key: str) -> Entry | None:
        """The valid entry for (stage, key), or None.

        A corrupt entry (an object missing, truncated or altered) is a miss: it
        is reported, and dropped unless it lies in a read-only root. A read-only
        store finds entries in its root, then in its overlay, and their objects
        in either.

        An entry file is parsed and its digest checked once per process while a
        stat of it (inode, size, mtime) is unchanged: entries are replaced only by
        rename, so any new content is a new stat. Its objects are stat'ed on every
        call, and re-hashed unless size and mtime prove them unchanged
        (Entry.proof_of_content). Nothing is written: use is recorded once per run
        (record_use).
        """
        entry = None if (stage, key) in self._bad else self._read(stage, key)
        if entry is None and self.overlay is not None:
            entry = self.overlay._read(stage, key)
        if entry is None:
            return None
        if entry is _DAMAGED:
            return None
        for name, record in entry.objects.items():
            path = self._object_file(record.digest)
            proof = entry.proof_of_content(record.digest)
            try:
                st = os.stat(path)
                unchanged = proof is not None and st.st_size == record.nbytes and st.st_mtime_ns == proof
            except OSError:
                unchanged = False
            problem = None if unchanged else object_problem(path, record)
            if problem:
                self.drop(CorruptObject(entry, name, problem))
                return None
        return entry

    def _read(self, stage: str, key: str) -> Entry | Literal[_Damaged.DAMAGED] | None:
        """The entry under (stage, key) here: None when there is none, _DAMAGED when it was edited or holds a
        malformed record (dropped)."""
        path = self._entry_file(stage, key)
        try:
            st = os.stat(path)
            signature = (st.st_ino, st.st_size, st.st_mtime_ns)
            if (before := self._read_before.get(path)) and before[0] == signature:
                return before[1]
            with open(path, "rb") as f:
                entry = Entry.from_json(json.loads(f.read()))
        except CorruptObject as malformed:
            self.drop(malformed)
            return _DAMAGED
        except (OSError, ValueError, TypeError):
            return None
        if not entry.intact():
            self.drop(CorruptObject(entry, None, "does not match its digest (edited?)"))
            return _DAMAGED
        self._read_before[path] = (signature, entry)
        return entry

    def drop(self, corruption: CorruptObject) -> None:
        """Forget a corrupt entry (and its bad objects) so that its stage is recomputed."""
        entry = corruption.entry
        self.dropped.add((entry.stage, entry.key))
        owner = self._written
        if not owner.entry_path(entry.stage, entry.key).exists() and self.readonly:  # the read-only root's
            self._bad.add((entry.stage, entry.key))
            warn(f"{corruption}; treating it as a miss (read-only cache: left in place)")
            return
        warn(f"{corruption}; dropping it and recomputing")
        for record in entry.objects.values():
            path = self.object_path(record.digest)
            if path.is_relative_to(owner.root) and path.exists() and object_problem(path, record):
                path.unlink(missing_ok=True)
        owner.entry_path(entry.stage, entry.key).unlink(missing_ok=True)

    def commit(self, stage: str, key: str, case: str, objects: dict[str, StoredObject], meta: dict[str, Any],
               stats: dict[str, Any], recipe: dict[str, Any] | None = None) -> Entry:
        """Record a stage output whose objects are already stored."""
        seen = {r.digest: os.stat(self.object_path(r.digest)).st_mtime_ns for r in objects.values()}
        committed = time.time_ns()  # after the stats: a write after them has a later time than these
        # the recipe (a kilobyte or more) is read only by `golden-tasks explain`: an object of its own
        made = self.put_buffer(json.dumps(recipe, sort_keys=True).encode()).digest if recipe else None
        entry = Entry(stage=stage, key=key, case=case, digest=content_digest(objects, meta), objects=objects,
                      meta=meta, stats=stats, recipe=made, seen=seen, committed=committed)
        text = json.dumps(entry.to_json(), sort_keys=True, indent=1).encode()
        atomic_write(self._written.entry_path(stage, key), lambda f: f.write(text))
        return entry

    def recipe(self, entry: Entry) -> dict[str, Any] | None:
        """What went into the entry's key (graph.recipe, with the fingerprints' parts), or None when its
        object is gone or damaged."""
        if not entry.recipe:
            return None
        path = self.object_path(entry.recipe)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        # the object holds the recipe commit wrote: a JSON object
        return cast("dict[str, Any]", json.loads(data)) if digest_bytes(data) == entry.recipe else None

    def computing(self, stage: str, key: str) -> "FileLock":
        """A FileLock to hold while computing (stage, key): look the entry up again once it is held."""
        from filelock import FileLock  # noqa: PLC0415 -- only where stages run, never in the doit parent

        path = self._written.root / "locks" / stage / key[:2] / f"{key}.lock"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheWriteError(_cannot_write(path, exc)) from exc
        return FileLock(path)

    # -- small files ----------------------------------------------------------

    def read_json(self, relative: str) -> Any:
        """A JSON file's value under the store (the overlay first when read-only), or None."""
        for store in ([self.overlay] if self.overlay is not None else []) + [self]:
            try:
                return json.loads((store.root / relative).read_text())
            except (OSError, ValueError):
                continue
        return None

    def remove(self, relative: str) -> None:
        """Remove a small file under the store (the overlay's, when read-only), if it exists."""
        (self._written.root / relative).unlink(missing_ok=True)

    def plot_path(self, key: str) -> Path:
        """Where the HTML report keeps the figures it drew from entries, under the page's content `key`."""
        return self.root / "plots" / f"{key}.json"

    def plot_files(self) -> list[Path]:
        return list((self.root / "plots").glob("*.json"))

    def write_json(self, relative: str, data: object) -> None:
        text = json.dumps(data, sort_keys=True, indent=1).encode()
        atomic_write(self._written.root / relative, lambda f: f.write(text))

    def record_use(self, used: Collection[tuple[str, str]]) -> None:
        """Note that a run used the entries `used` ((stage, key) pairs), for gc's least-recently-used
        order (last_used): one file per distinct set under log/used/, its mtime the set's last use, so
        that a run that uses the same entries again touches one file (lookups write nothing)."""
        if self.readonly or not used:
            return
        text = "".join(f"{stage}/{key}\n" for stage, key in sorted(used)).encode()
        path = self.root / "log" / "used" / f"{digest_bytes(text)}.txt"
        try:
            os.utime(path)
        except FileNotFoundError:
            try:
                atomic_write(path, lambda f: f.write(text))
            except CacheWriteError as exc:
                warn(f"could not record this run's use of the cache: {exc}")
        except OSError as exc:
            warn(f"could not record this run's use of the cache: {exc}")

    def last_used(self) -> dict[tuple[str, str], float]:
        """(stage, key) -> the last time a run recorded using it (record_use), over every record."""
        last: dict[tuple[str, str], float] = {}
        for path in (self.root / "log" / "used").glob("*.txt"):
            try:
                when, lines = path.stat().st_mtime, path.read_text().split()
            except OSError:
                continue
            for line in lines:
                stage, _, key = line.partition("/")
                last[stage, key] = max(when, last.get((stage, key), 0.0))
        return last

    def forget_use(self, kept: set[tuple[str, str]]) -> None:
        """Remove each record of use (record_use) that lists none of the entries `kept` ((stage, key))."""
        for path in (self.root / "log" / "used").glob("*.txt"):
            try:
                listed = {tuple(line.split("/", 1)) for line in path.read_text().split()}
            except OSError:
                continue
            if not listed & kept:
                path.unlink(missing_ok=True)

    def runs_logged(self, last: int) -> list[dict[str, Any]]:
        """The hit/miss counts of the last `last` runs (log_run), oldest first."""
        try:
            lines = (self.root / "log" / "runs.jsonl").read_text().splitlines()[-last:]
        except OSError:
            return []
        return [json.loads(line) for line in lines]

    def log_run(self, counts: dict[str, Any]) -> None:
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
