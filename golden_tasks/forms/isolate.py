"""Kernel calls in a child process: a crash or a hang fails one stage, never the run.

Children fork from a forkserver that imported torch once, so each call costs
a fork, not an interpreter start. No process a call starts outlives it: the
child and the forkserver adopt the orphans of their descendants and die with
their parent (golden_tasks.project.reaper); a child kills whatever is left below it
before it answers, and the caller kills the child's whole tree on a hang, and
any process it left behind on a crash. A call given a Confinement runs confined by the operating
system (golden_tasks.project.sandbox) before it unpickles or loads anything of the kernel's: it reads the
system, the interpreter and what it is allowed, writes one private directory, which is removed
after it, and (unless allowed) reaches no network. What it sends back is read as data only
(_Returned): a pickle names what it calls to rebuild objects, and a kernel could send one that runs
code in its caller. Tensors cross in shared memory: the kernel
writes its outputs where the parent reads them. Output buffers sit between
two guard regions filled with a canary; a kernel that writes past either end
without crashing clobbers one, and the call fails naming the tensor and side.
"""
import builtins
import collections
import contextlib
import dataclasses
import enum
import glob
import io
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.util
import os
import pathlib
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing  # registers shared-memory pickling of tensors

from ..model import origin
from ..model.errors import StageFailed, VerificationFailure
from ..project import config, reaper, sandbox
from . import headers

GUARD_BYTES = 4096  # a page each side; keeps the output 4 KiB-aligned like a fresh allocation
CANARY = bytes.fromhex("deadbeef") * (GUARD_BYTES // 4)
# Around an input: all ones, a NaN in every floating type (and -1 in the integer ones), so that a read past
# either end poisons what it computes, where a read that faults nothing would otherwise pass (an emulator,
# such as Triton's interpreter, checks no bounds).
POISON = b"\xff" * GUARD_BYTES
_PRELOAD = ["golden_tasks.pipeline._forkserver", "golden_tasks.forms.isolate"]


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


class Guarded:
    """A tensor in shared memory between two guard regions filled with `fill` (CANARY, or POISON)."""

    def __init__(self, name: str, like: torch.Tensor, fill: bytes = CANARY):
        self.name, self.fill = name, fill
        nbytes = like.numel() * like.element_size()
        self.buffer = torch.empty(nbytes + 2 * GUARD_BYTES, dtype=torch.uint8).share_memory_()
        guard = torch.frombuffer(bytearray(fill), dtype=torch.uint8)
        self.buffer[:GUARD_BYTES] = guard
        self.buffer[GUARD_BYTES + nbytes:] = guard
        self.tensor = self.buffer[GUARD_BYTES:GUARD_BYTES + nbytes].view(like.dtype).view(like.shape)
        self.tensor.copy_(like)

    def clobbered(self) -> list:
        """(side, what changed) for each side whose guard changed, "before" and/or "after" the tensor: how
        many of its bytes, and the one nearest the tensor, in bytes and elements of the tensor's dtype (a
        write one element past the end: "... at byte 0 past the last element (element 0 past it)")."""
        found, size, fill = [], self.tensor.element_size(), torch.frombuffer(bytearray(self.fill), dtype=torch.uint8)
        for side, guard in (("before", self.buffer[:GUARD_BYTES]), ("after", self.buffer[-GUARD_BYTES:])):
            changed = (guard != fill).nonzero().reshape(-1)
            if not changed.numel():
                continue
            nearest, where = ((int(changed[0]), "past the last") if side == "after"
                              else (GUARD_BYTES - 1 - int(changed[-1]), "below the first"))
            found.append((side, f"{changed.numel()} of its {GUARD_BYTES} bytes changed, the nearest at byte {nearest} "
                                f"{where} element (element {nearest // size} {where.partition(' ')[0]} it, of "
                                f"{str(self.tensor.dtype).removeprefix('torch.')})"))
        return found


@dataclasses.dataclass(frozen=True)
class Confinement:
    """What a confined call may reach besides the system and the interpreter (sandbox.base_readable):
    `readable` files and folders, and no network but, for a rank of a pool, the pool's own (`pool`: the
    pid holding its namespace, sandbox.PoolNetwork). It writes `writable` (a directory its caller owns),
    else a private one removed after it. A call that uses the GPU (`gpu`) is confined as sandbox.confine
    says of one; any other sees no GPU (its CUDA driver is never started)."""
    readable: tuple = ()
    pool: int = None
    writable: str = None
    listable: tuple = ()  # folders whose names it may list (to import from them), never read
    gpu: bool = False
    hidden: tuple = ()  # folders covered by empty mounts (sandbox.confine)
    headers: str = None  # the pool of precompiled headers it reads, linked into its private folder (headers.py)


# What a confined call must not inherit of the caller's environment: the run's journal, whose lines
# the run trusts. Its caches and temporary files go to its private directory.
_WITHHELD = (config.JOURNAL_ENV,)
_PRIVATE = ("TMPDIR", "HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME",
            "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH", "MPLCONFIGDIR")


def _beside(folder: Path, withheld: set, listed: list) -> list:
    """`folder`, or, when it holds a folder of `withheld`, everything beneath it but those (the folders
    passed on the way appended to `listed`)."""
    if not any(folder in w.parents for w in withheld):
        return [folder]
    listed.append(folder)
    return [p for child in sorted(folder.iterdir()) if child not in withheld for p in _beside(child, withheld, listed)]


def confinement(files, pool: int = None, writable: str = None, gpu: bool = False) -> Confinement:
    """How a call that runs the kernel's code is confined: reading `files` and the user's source folders
    (never the store or the runs: the answers are there); None with sandbox=off, or where this machine
    cannot confine a process, unless the run requires it (config.sandbox), which is then a StageFailed.
    `gpu`: the call runs the kernel on a GPU (sandbox.GPU_GAPS): the store, the runs and the run's journal
    are covered. For a rank of a pool (`pool`) on a GPU, which keeps unix sockets (NCCL's), so are the
    multiprocessing forkservers' folders in the temporary folder, whose sockets would fork an
    unconfined process for whoever connects."""
    mode = config.current().sandbox
    if mode == "off":
        return None
    if reason := sandbox.support():
        if mode == "required":
            raise StageFailed(f"sandbox=required, but this machine cannot confine the kernel's process: {reason}")
        return None
    withheld, listed = config.Project.answer_folders(), []
    if journal := config.current().journal:  # the run's journal, in a folder of its own
        withheld.add(Path(journal).parent)
    sources = [p for f in origin.user_folders() if os.path.isdir(f) for p in _beside(Path(f), withheld, listed)]
    hidden = [*withheld] if gpu else []
    shared = headers.pool()
    if gpu and pool:
        hidden += sorted({Path(p) for base in (tempfile.gettempdir(), "/tmp")
                          for p in glob.glob(os.path.join(base, "pymp-*"))})
    if gpu and shared:  # what it could write, never what another call reads
        hidden.append(shared)
    return Confinement((*map(str, files), *map(str, sources)), pool, writable, tuple(map(str, listed)), gpu,
                       tuple(map(str, hidden)), None if gpu or shared is None else str(shared))


HEADERS = "precompiled_headers"  # Inductor's header folder in a confined call's private folder
_confined = False  # whether this process is a confined child (set by _confine, never unset)


def confined_here() -> bool:
    """Whether this process is confined, so that it may load an untrusted kernel (golden_tasks.forms.untrusted)."""
    return _confined


def _confine(confinement: Confinement, private: str) -> None:
    """Confine this process (just forked: one thread) to `confinement`, writing only `private`."""
    global _confined
    for name in _WITHHELD:
        os.environ.pop(name, None)
    for name in _PRIVATE:
        os.environ[name] = private
    os.environ["NCCL_SHM_DISABLE"] = "1"  # /dev/shm is each rank's own: NCCL's ranks meet by sockets instead
    if confinement.pool:  # the pool's namespace has a loopback alone (gloo would bind the host name's address)
        os.environ.update(GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo")
    if not confinement.gpu:  # no GPU, and torch counts none without asking a driver (torch.cuda.device_count)
        os.environ.update(CUDA_VISIBLE_DEVICES="", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    sys.dont_write_bytecode = True
    tempfile.tempdir = private
    multiprocessing.current_process()._config.pop("tempdir", None)  # private: multiprocessing's own temp dir
    codecache = sys.modules.get("torch._inductor.codecache")
    readable = [*sandbox.base_readable(), *map(Path, confinement.readable)]
    if codecache is not None and hasattr(codecache, "_HEADER_DIR"):  # fixed when the forkserver imported it
        codecache._HEADER_DIR = os.path.join(private, HEADERS)
        codecache._HEADER_LOCK_DIR = os.path.join(codecache._HEADER_DIR, "locks")
        if confinement.headers:
            headers.link(Path(confinement.headers), Path(codecache._HEADER_DIR))
            readable.append(Path(confinement.headers))
    sandbox.confine(Path(private), readable,
                    pool=confinement.pool, listable=list(map(Path, confinement.listable)),
                    hidden=list(map(Path, confinement.hidden)), landlock=not confinement.gpu)
    _confined = True


def _child(target, args, conn, environ, cwd, confinement=None, private=None):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the forkserver's: this process is a leaf to it
    reaper.adopt_orphans()
    reaper.die_with_parent()
    # The forkserver kept the environment and directory it started with; the call sees the caller's.
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    if confinement:
        try:
            _confine(confinement, private)
        except sandbox.SandboxError as exc:  # never run the code unconfined once asked to confine it
            conn.send((False, StageFailed(f"could not confine the kernel's process: {exc}")))
            os._exit(1)
    try:
        result = (True, target(*args))
    except VerificationFailure as exc:  # a verdict: its message is the report
        result = (False, exc)
    except BaseException as exc:  # noqa: BLE001 -- reported by the parent as the stage's failure, with its traceback
        result = (False, origin.described(exc))
    reaper.kill_descendants()  # background processes the call started end with it
    conn.send(result)
    conn.close()


_live = set()  # children of this process's calls now running (their forkserver's other children are strays)
_live_lock = threading.Condition()  # notified when _live changes
_server_environ = None  # the environment the forkserver was started with, less _READ_AT_CALL
# Variables nothing reads as the forkserver imports (each call's child is handed the caller's whole environment,
# _child): a change of them needs no new forkserver. pytest's names the test running; the cache, runs folder and
# profile are read by each call (config.Project.at, config.profile).
_READ_AT_CALL = (config.CACHE_ENV, config.RUNS_ENV, config.PROFILE_ENV, "PYTEST_CURRENT_TEST")


def _start(child) -> None:
    """Start `child` from a forkserver that has this process's environment. What torch read from
    the environment when the forkserver imported it (CXX, TORCHINDUCTOR_* settings) stays fixed
    there, so after a change of environment the forkserver is restarted, once no call runs."""
    global _server_environ
    with _live_lock:
        imported_with = {k: v for k, v in os.environ.items() if k not in _READ_AT_CALL}
        if _server_environ is not None and _server_environ != imported_with:
            _live_lock.wait_for(lambda: not _live)
            multiprocessing.forkserver._forkserver._stop()  # private, but the only way to restart it
        _server_environ = imported_with
        _short_socket_folder()
        with _main_not_reimported():
            with reaper.sigint_ignored():  # only while the server's process starts, not while it imports
                multiprocessing.forkserver.ensure_running()
            child.start()
        _live.add(child.pid)


def _short_socket_folder() -> None:
    """multiprocessing makes the forkserver's unix socket in a folder of its own in the temporary folder,
    and a socket's path must fit in 107 bytes: under a deep $TMPDIR (76 characters are enough) starting
    it failed with "AF_UNIX path too long". Its folder is then a short one (reaper.make_temp), removed
    as multiprocessing removes its own, when the process ends."""
    settings = multiprocessing.current_process()._config  # private: where multiprocessing keeps its temp dir
    if "tempdir" not in settings and len(tempfile.gettempdir()) > reaper.SHORT_TEMP:
        folder = settings["tempdir"] = reaper.make_temp("gt-mp-")
        multiprocessing.util.Finalize(None, reaper.remove_temp, args=(folder,), exitpriority=-100)


def _sweep(forkserver: int) -> None:
    """Kill what a dead child left: its orphans were adopted by the forkserver."""
    with _live_lock:
        strays = reaper.children(forkserver) - _live
    for pid in strays:
        reaper.kill_descendants(pid)
    reaper.kill(strays)


@contextlib.contextmanager
def _main_not_reimported():
    """multiprocessing re-imports a script's __main__ in every child, running its top-level
    code (a script that calls golden_tasks.run() unguarded would recurse); the children
    need nothing from it (kernels travel by value), so hide it while one starts."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None  # multiprocessing reads it unconditionally
    try:
        yield
    finally:
        main.__dict__.update(saved)


def pipe():
    """(reader, writer): a one-way pipe whose writer can be handed to a child of `call`/`call_all`."""
    return _context().Pipe(duplex=False)


class Ended(enum.Enum):
    """How an isolated call ended, and what its Outcome's value is then."""
    RETURNED = "returned"  # its result
    RAISED = "raised"  # the VerificationFailure, or origin.described's text
    CRASHED = "crashed"  # how its process died
    HUNG = "hung"  # the seconds it was given


@dataclasses.dataclass
class Outcome:
    """How an isolated call ended, and with what."""
    kind: Ended
    value: object = None

    def result(self, what: str):
        """The returned value, or StageFailed (a VerificationFailure as is) naming `what`."""
        if self.kind is Ended.RETURNED:
            return self.value
        if isinstance(self.value, VerificationFailure):
            raise self.value
        if self.kind is Ended.RAISED:
            raise StageFailed(f"{what} raised {self.value}")
        if self.kind is Ended.CRASHED:
            raise StageFailed(f"{what} crashed: {self.value}")
        raise StageFailed(f"{what} hung: no result after {self.value:g} s (the case's timeout); "
                          "its process and every process it started were killed")


class _Returned(pickle.Unpickler):
    """Reads what a confined call sent back as data: a pickle may name only classes whose rebuilding runs
    no code of consequence (golden_tasks' dataclasses, exceptions and enums, builtins' exceptions and
    containers, paths, torch's sizes, dtypes and devices); anything else (os.system, a module's function,
    torch's rebuilders of a tensor, which would fetch a descriptor from wherever the pickle says) is
    refused. Tensors cross in shared memory the caller made (Guarded), never in an answer."""
    _DATA = {builtins.set, builtins.frozenset, builtins.bytearray, builtins.complex, builtins.slice,
             builtins.range, collections.OrderedDict, pathlib.PosixPath, pathlib.PurePosixPath, torch.Size,
             torch.device}

    def find_class(self, module: str, name: str):
        found = getattr(sys.modules.get(module), name, None) if "." not in name else None
        if isinstance(found, torch.dtype) or found in self._DATA or isinstance(found, type) and (
                module == "builtins" and issubclass(found, BaseException) or module.startswith("golden_tasks.")
                and (dataclasses.is_dataclass(found) or issubclass(found, (BaseException, enum.Enum)))):
            return found
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not data a kernel's process may send")


class _Call:
    """target(*args) running in a child process; its answer arrives on `connection`."""

    def __init__(self, target, args: tuple, confinement: Confinement = None):
        ctx = _context()
        self.connection, send = ctx.Pipe(duplex=False)
        self.private = (confinement.writable or reaper.make_temp("gt-")) if confinement else None
        self.owned = bool(confinement and not confinement.writable)  # removed by close()
        self.headers = confinement.headers if confinement else None
        self.built_headers = False  # whether it precompiled a header the pool lacks (close)
        self.process = ctx.Process(target=_child, args=(target, args, send, dict(os.environ), os.getcwd(),
                                                        confinement, self.private), daemon=True)
        _start(self.process)
        send.close()
        self.forkserver = reaper.parent_of(self.process.pid)

    def receive(self) -> Outcome:
        try:
            if self.private is None:
                ok, value = self.connection.recv()
            else:
                ok, value = _Returned(io.BytesIO(self.connection.recv_bytes())).load()
        except EOFError:  # the child died before answering
            self.process.join()
            return Outcome(Ended.CRASHED, _death(self.process.exitcode))
        except (pickle.UnpicklingError, ValueError, TypeError) as exc:  # forged: refused, never run
            return Outcome(Ended.RAISED, f"its process sent back what is not a result: {exc}")
        return Outcome(Ended.RETURNED if ok else Ended.RAISED, value)

    def kill(self) -> None:
        reaper.kill_descendants(self.process.pid)
        self.process.kill()

    def close(self) -> None:
        self.connection.close()
        self.process.join()
        with _live_lock:
            _live.discard(self.process.pid)
            _live_lock.notify_all()
        if self.forkserver:
            _sweep(self.forkserver)
        if self.headers:
            self.built_headers = headers.built_privately(Path(self.private, HEADERS))
        if self.owned:
            reaper.remove_temp(self.private)


def call_all(jobs: list, timeout: float, grace: float = 1.0, failed=lambda outcome: outcome.kind is not Ended.RETURNED,
             confinement: Confinement = None) -> list:
    """Run each (target, args) of `jobs` in its own child, all at once (each confined to `confinement`, if
    given); their Outcomes in order. A call with no answer after `timeout` seconds, or `grace` seconds
    after another call `failed` (its peers in a collective may wait for it forever), is killed with its
    tree and HUNG."""
    calls, outcomes = [], [None] * len(jobs)
    try:
        for target, args in jobs:
            calls.append(_Call(target, args, confinement))
        deadline = time.monotonic() + timeout
        pending = {c.connection: i for i, c in enumerate(calls)}
        while pending:
            ready = multiprocessing.connection.wait(list(pending), max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for connection in ready:
                i = pending.pop(connection)
                outcomes[i] = calls[i].receive()
                if failed(outcomes[i]):
                    deadline = min(deadline, time.monotonic() + grace)
        for i in pending.values():
            calls[i].kill()
            outcomes[i] = Outcome(Ended.HUNG, timeout)
    finally:
        for c, outcome in zip(calls, outcomes):
            if outcome is None:  # interrupted: nothing it started may outlive it
                c.kill()
            c.close()
    if confinement and confinement.headers and any(c.built_headers for c in calls):
        headers.fill(Path(confinement.headers))  # the next call reads what this one precompiled
    return outcomes


def call(target, args: tuple, timeout: float, what: str, confinement: Confinement = None):
    """target(*args) in a child process (confined to `confinement`, if given); its return value, or
    StageFailed on a crash, a hang past `timeout` seconds, or an exception (named `what` in the message)."""
    return call_all([(target, args)], timeout, confinement=confinement)[0].result(what)


@contextlib.contextmanager
def pool_network():
    """A network namespace of a pool of ranks' own (sandbox.PoolNetwork) while the block runs, held by a
    helper child (a forkserver's: single-threaded, as unshare(CLONE_NEWUSER) needs), which is killed after
    the block; sandbox.SandboxError, saying why, if it cannot be made."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        helper = _Call(sandbox.hold_pool_network, (theirs,))
        try:
            network = sandbox.PoolNetwork.received(ours, helper.process.pid)
            with network.listener:
                yield network
        finally:
            helper.kill()
            helper.close()


def _death(exitcode: int) -> str:
    if exitcode is not None and exitcode < 0:
        sig = signal.Signals(-exitcode)
        return f"killed by signal {sig.name} ({-exitcode}: {signal.strsignal(sig)})"
    return f"its process exited with code {exitcode} without a result"
