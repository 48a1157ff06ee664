"""What planning read: files, directory listings and environment variables, and whether they changed.

A kernel module may compute values at import (a table loaded from a data file,
a size read from an environment variable, a list of files globbed) that its
case's fingerprints capture. A plan made from them is stale as soon as they
change, so the planning subprocess records them while it imports the modules
(`Observer`: Python's audit hooks for opened files and listed directories, a
recording `os.environ` for variables read by user code), and the doit parent
re-checks the record (`changed`) before reusing a plan. Library internals are
not recorded: files and directories of the stdlib and installed packages (their
versions enter the plans' environment instead), and the import system's own
reads (the modules it loads are recorded as source files by the planner). A check stats each
file and directory first and reads it only when its stat differs (like git's index).
"""
import os
import sys
import threading
import time
from pathlib import Path

from ..model.hashing import digest_bytes, digest_file
from ..model.origin import is_user_file, is_user_module
from ..storage.entry import RACY_NS

_SYSTEM = ("/proc/", "/sys/", "/dev/")
# os.environ, Mapping.get
_ENVIRON_FRAMES = (os.__file__, "<frozen os>", "_collections_abc.py", "<frozen _collections_abc>")


class Observer:
    """While active (a `with` block), records reads by the code that runs: `files` opened for
    reading, `dirs` listed, `env` variables read by user code, and `import_dirs` the import
    system listed (a failed import is cured by a new file in one of them). With a `log` (a file
    descriptor), each read is also written there as it is recorded, a line "KIND\tNAME" (`logged`
    reads them back), so that what a process read is known even if it dies mid-import."""

    _active = None  # one observer at a time; audit hooks cannot be removed, so one hook checks this

    def __init__(self, log: int = None):
        self.files, self.dirs, self.env, self.import_dirs = set(), set(), set(), set()
        self.log = log

    def add(self, kind: str, name: str) -> None:
        """Record a read: `kind` is files, dirs, env or import_dirs."""
        found = getattr(self, kind)
        if name not in found:
            found.add(name)
            self.note(f"{kind}\t{name}")

    def note(self, line: str) -> None:
        """Write `line` to the log, if there is one and it can still be written (a full disk ends the log,
        not the planning: it only serves a process that dies)."""
        if self.log is not None:
            try:
                os.write(self.log, f"{line}\n".encode(errors="surrogateescape"))
            except OSError:
                self.log = None

    def __enter__(self):
        if not getattr(Observer, "_hooked", False):
            sys.addaudithook(_audit)
            os.environ.__class__ = _RecordingEnviron
            Observer._hooked = True
        Observer._active = self
        return self

    def __exit__(self, *exc):
        Observer._active = None

    def record(self, failed: bool = False) -> dict:
        """The current state of everything read: compare it with `changed` later. A failed
        plan also depends on the directories imports searched."""
        return snapshot(self.files, self.dirs | (self.import_dirs if failed else set()), self.env)


def logged(text: str) -> dict:
    """The reads an Observer's log holds (its text): kind -> set of names."""
    found = {"files": set(), "dirs": set(), "env": set(), "import_dirs": set()}
    for line in text.splitlines():
        kind, _, name = line.partition("\t")
        if kind in found:
            found[kind].add(name)
    return found


def _interesting(path) -> str:
    """The path as a string when it is user data (not library, system or bytecode), else None."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str):  # a file descriptor
        return None
    path = os.path.abspath(path)
    if path.startswith(_SYSTEM) or "__pycache__" in path or not is_user_file(path):
        return None
    return path


def _in_import_system(frame) -> bool:
    """Whether the import system itself made the read that `frame` made (loading a module, searching a
    path), as opposed to code run by an import: the nearest caller that is not library code decides."""
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith("<frozen importlib"):
            return True
        if not (file.startswith("<frozen ") or (os.path.isabs(file) and not is_user_file(file))):
            return False
        frame = frame.f_back
    return False


def _reads(mode, flags) -> bool:
    if isinstance(mode, str):
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY


_handling = threading.local()  # set while the observer itself works: deciding whose a path is reads files too


def _unless_observing(work, *args):
    """work(*args), unless this thread is already inside it (then None): what the observer reads and
    looks up itself is no read of the code it observes."""
    if getattr(_handling, "busy", False):
        return None
    _handling.busy = True
    try:
        return work(*args)
    finally:
        _handling.busy = False


def _audit(event: str, args: tuple) -> None:
    observer = Observer._active
    if observer is not None and event in ("open", "os.listdir", "os.scandir"):
        _unless_observing(_record, observer, event, args, sys._getframe(1))


def _record(observer: Observer, event: str, args: tuple, reader) -> None:
    """Note the read `event` that the code at frame `reader` made."""
    path = _interesting(args[0] if args else None)
    if path is None:
        return
    if event != "open":
        observer.add("import_dirs" if _in_import_system(reader) else "dirs", path)
    elif _reads(args[1], args[2] if len(args) > 2 else None) and not _in_import_system(reader):
        observer.add("files", path)


def _user_caller(frame) -> bool:
    """Whether the code at `frame` reading os.environ (past os's and Mapping's own methods) is user code."""
    while frame is not None and frame.f_code.co_filename.endswith(_ENVIRON_FRAMES):
        frame = frame.f_back
    return frame is not None and is_user_module(frame.f_globals.get("__name__"))


class _RecordingEnviron(os._Environ):
    """os.environ, noting the variables user code reads while an Observer is active."""

    def __getitem__(self, key):
        observer = Observer._active
        if observer is not None and isinstance(key, str) and _unless_observing(_user_caller, sys._getframe(1)):
            observer.add("env", key)
        return super().__getitem__(key)


def listed(path: Path) -> bool:
    """Whether the file `path` exists, found by listing its directory: an existence check alone is
    invisible to an Observer, a listing is recorded, so a missing file that appears re-plans."""
    try:
        return path.name in os.listdir(path.parent) and path.is_file()
    except OSError:
        return False


def _file_state(path: str):
    try:
        return digest_file(Path(path)) if os.path.isfile(path) else None
    except OSError:
        return None


def listing_digest(path: str):
    """The digest of a folder's listing (its names), None when it cannot be listed."""
    try:
        return digest_bytes("\0".join(sorted(os.listdir(path))).encode())
    except OSError:
        return None


def _stat(path: str):
    """What says a file or directory may have changed without reading it: size, mtime and inode (None: absent)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


_CONTENT = {"files": _file_state, "dirs": listing_digest}
# A file modified within RACY_NS of the snapshot may change again within its timestamp's granularity
# without its stat showing it: its content is compared (git's racy-clean rule).


def snapshot(files=(), dirs=(), env=()) -> dict:
    """{"taken": ns, "files": {path: {"stat", "digest"}}, "dirs": {path: {"stat", "digest": of its listing}},
    "env": {name: value}}; None marks a file, directory or variable that does not exist (its appearing
    is a change too)."""
    taken = time.time_ns()
    record = {kind: {name: {"stat": _stat(name), "digest": _CONTENT[kind](name)} for name in sorted(names)}
              for kind, names in (("files", files), ("dirs", dirs))}
    return {"taken": taken, **record, "env": {name: os.environ.get(name) for name in sorted(env)}}


def changed(record: dict, memo: dict) -> str:
    """The first thing in a `snapshot` record that differs now (e.g. "file /p/table.npy"), or None. A file
    or directory is read only when its stat differs from the recorded one or was racy (RACY_NS). `memo`
    caches current states across the records of one check."""
    for name, then in record["env"].items():
        if os.environ.get(name) != then:
            return f"variable {name}"
    for kind in ("files", "dirs"):
        for name, then in record[kind].items():
            if ("stat", name) not in memo:
                memo["stat", name] = _stat(name)
            stat = memo["stat", name]
            if stat == then["stat"] and (stat is None or stat[1] < record["taken"] - RACY_NS):
                continue
            if (kind, name) not in memo:
                memo[kind, name] = _CONTENT[kind](name)
            if memo[kind, name] != then["digest"]:
                return f"{kind[:-1]} {name}"
    return None
