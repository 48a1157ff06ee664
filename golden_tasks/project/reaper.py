"""Processes that end with their owner: no process a kernel starts outlives its case.

Linux gives the tools, through prctl(2): a *subreaper* adopts the orphans of its
descendants (a daemon a kernel starts with a double fork or a new session
re-parents to it, not to init, so it can still be found and killed), and a
*parent-death signal* is sent to a process when the thread that created it dies.
The process tree is read from /proc (each process's parent). Elsewhere these are
no-ops: isolation then still fails a crashing or hanging case, but cannot
promise that nothing it started is left.
"""
import contextlib
import ctypes
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_LINUX = sys.platform.startswith("linux")
_libc = ctypes.CDLL(None, use_errno=True) if _LINUX else None


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants."""
    if _LINUX:
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have `sig` sent to this process when its parent dies (and now, if it already has)."""
    if _LINUX:
        parent = os.getppid()
        _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # died before the request took effect
            os.kill(os.getpid(), sig)


# A Ctrl-C is sent to every process of the terminal's foreground group: a Python helper still starting up
# (site, imports) would die of it with a traceback, though the process that started it handles the Ctrl-C
# and ends the helper anyway. So helpers start without it: python_module in a session of its own, and a
# long-lived server (the isolation forkserver) under sigint_ignored.
@contextlib.contextmanager
def sigint_ignored():
    """SIGINT ignored meanwhile, so that a process started meanwhile ignores it for its life (an ignored
    signal stays ignored across exec, and Python then raises no KeyboardInterrupt; a mask would not do: the
    start of a subprocess clears it). A Ctrl-C meanwhile is lost to this process: those that start servers
    are ended by their caller (doit's parent ends its workers). Only the main thread sets handlers: in another
    one it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def python_module(module: str, *args: str, **options) -> subprocess.CompletedProcess:
    """`python -m module args` run to its end, with its output captured as text; a Ctrl-C reaches this
    process only, which kills the module's process as it leaves (subprocess.run)."""
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          start_new_session=True, **options)


# Temporary folders of this process (make_temp) that a signal ending it removes: their owners' `finally`
# blocks do not run then, since the process exits at once (unwinding a doit worker deadlocks on its queue).
_folders = set()
SHORT_TEMP = 48  # a temporary folder's path up to this long leaves room for a unix socket's below it


def make_temp(prefix: str) -> str:
    """A new temporary folder, in /tmp when the temporary folder's path is long (a unix socket's path
    inside it must fit in 107 bytes); its owner removes it with remove_temp, and a signal that ends this
    process first removes it too (own_tree_until_parent_dies)."""
    short = len(tempfile.gettempdir()) <= SHORT_TEMP or not os.path.isdir("/tmp")
    path = tempfile.mkdtemp(prefix=prefix, dir=None if short else "/tmp")
    _folders.add(path)
    return path


def remove_temp(path: str) -> None:
    """Remove a make_temp folder."""
    shutil.rmtree(path, ignore_errors=True)
    _folders.discard(path)


def own_tree_until_parent_dies() -> None:
    """Adopt the orphans below, and when the parent dies (SIGTERM, or a SIGTERM from anyone),
    kill everything below, remove the folders given to remove_if_ended and exit: for long-lived
    processes that start others (doit workers, the isolation forkserver), whose children may be
    compilers or kernels that ignore signals."""
    adopt_orphans()

    def end(signum, frame):
        kill_descendants()
        # and multiprocessing's own (pymp-*), which its exit handler would have removed
        for path in [*_folders, multiprocessing.current_process()._config.get("tempdir")]:
            if path:
                shutil.rmtree(path, ignore_errors=True)
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, end)
    die_with_parent(signal.SIGTERM)


def _parent(pid: int | str) -> int | None:
    """The parent pid of `pid` as /proc says, or None (gone meanwhile)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def _parents() -> dict:
    """pid -> parent pid of every process visible in /proc."""
    found = {int(entry): parent for entry in os.listdir("/proc")
             if entry.isdigit() and (parent := _parent(entry)) is not None}
    return found


def parent_of(pid: int) -> int:
    """The parent of `pid`, or None (gone, or not Linux)."""
    return _parent(pid) if _LINUX else None


def children(pid: int) -> set:
    """The direct children of `pid` now."""
    return {p for p, parent in _parents().items() if parent == pid} if _LINUX else set()


def descendants(pid: int) -> set:
    """Every process below `pid` in the tree now (not `pid` itself)."""
    if not _LINUX:
        return set()
    parents, found, todo = _parents(), set(), [pid]
    while todo:
        above = todo.pop()
        below = {p for p, parent in parents.items() if parent == above and p not in found}
        found |= below
        todo.extend(below)
    return found


def kill(pids, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to each of `pids` (already gone is fine)."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def reap() -> None:
    """Collect every exited child of this process (adopted orphans included)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(pid: int = None) -> int:
    """Kill everything below `pid` (default: this process) until nothing is left, reaping what was
    this process's; returns how many processes were killed. Orphans of a killed process re-parent
    to the nearest subreaper, so with this process one, a second pass finds them."""
    pid = pid or os.getpid()
    killed = 0
    for _ in range(100):  # a fork bomb outruns no bound; give up rather than spin forever
        found = descendants(pid)
        if not found:
            break
        kill(found)
        killed += len(found)
        if pid == os.getpid():
            for child in found & children(pid):
                try:
                    os.waitpid(child, 0)
                except ChildProcessError:
                    pass
        reap()
    return killed
