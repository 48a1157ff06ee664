"""golden_tasks.project.sandbox: what a confined process tries and must fail at, each beside a control that must
work. Every confinement happens in a forked child (never this process), which reports back through a pipe."""
import ctypes
import errno
import functools
import multiprocessing
import os
import pickle
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import cloudpickle
import pytest
import torch

from golden_tasks.forms import isolate
from golden_tasks.project import config, sandbox

pytestmark = pytest.mark.skipif(sandbox.support() is not None, reason=f"no confinement: {sandbox.support()}")


def _run_pickled(data: bytes):
    """In a child of the isolation forkserver: the work cloudpickled in `data`, as (ok, value or exception)."""
    work = cloudpickle.loads(data)
    try:
        outcome = (True, work())
    except BaseException as exc:  # noqa: BLE001 -- reported to the parent
        outcome = (False, exc)
    try:
        pickle.dumps(outcome)
    except Exception as exc:  # noqa: BLE001 -- an unpicklable result or exception
        outcome = (False, RuntimeError(repr(exc)))
    return outcome


def in_child(work):
    """work() in a child of the isolation forkserver (one thread, as a kernel's process; a plain fork of
    this process may carry a thread that a library's fork handler started): its return value, or the
    exception it raised, raised here."""
    ok, value = isolate.call(_run_pickled, (cloudpickle.dumps(work),), 60.0, "the probe")
    if not ok:
        raise value
    return value


def confined(tmp_path: Path, probes: dict, pool: int = None, hidden=(), landlock=True) -> dict:
    """Each probe run in one child confined to write tmp_path/"private" and read base_readable(), `hidden`
    covered (with landlock=False, as a process that uses a GPU), in `pool`'s network namespace if given
    (as a rank): name -> what it returned, or the exception it raised."""
    private = tmp_path / "private"
    private.mkdir(exist_ok=True)

    def work():
        sandbox.confine(private, sandbox.base_readable(), pool=pool, hidden=hidden, landlock=landlock)
        results = {}
        for name, probe in probes.items():
            try:
                results[name] = probe()
            except Exception as exc:  # noqa: BLE001 -- the outcome under test
                results[name] = exc
        return results
    return in_child(work)


def a_socketpair() -> bytes:
    """What crosses a socketpair (which a confined process keeps: it reaches no one else)."""
    a, b = socket.socketpair()
    with a, b:
        a.send(b"ok")
        return b.recv(2)


@pytest.fixture
def cache(tmp_path):
    """A file in another directory, like an object of the cache store."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "obj").write_text("the golden answer")
    return tmp_path / "cache"


def test_reads_only_beneath_readable_and_writable(tmp_path, cache):
    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "mine").write_text("mine")

    def fresh_json():
        for name in [m for m in sys.modules if m == "json" or m.startswith("json.")]:
            del sys.modules[name]
        import json  # the import under test: its files are read now
        return json.dumps([1])

    r = confined(tmp_path, {
        "cache": lambda: (cache / "obj").read_text(),
        "cache listing": lambda: os.listdir(cache),
        "checkout": lambda: os.listdir(os.getcwd()),
        "home": lambda: os.listdir(Path.home()),
        "mine": lambda: (tmp_path / "private" / "mine").read_text(),
        "stdlib": lambda: Path(os.__file__).read_text()[:20],
        "import json": fresh_json,
        "torch": lambda: (torch.randn(64, 64) @ torch.randn(64, 64)).shape,
        "subprocess": lambda: subprocess.run(["true"]).returncode,
    })
    for attack in ("cache", "cache listing", "checkout", "home"):
        assert isinstance(r[attack], PermissionError), (attack, r[attack])
    assert r["mine"] == "mine" and "OS routines" in r["stdlib"] and r["import json"] == "[1]"
    assert r["torch"] == (64, 64) and r["subprocess"] == 0


def test_writes_only_beneath_writable(tmp_path, cache):
    private = tmp_path / "private"
    r = confined(tmp_path, {
        "create": lambda: (cache / "new").write_text("x"),
        "overwrite": lambda: (cache / "obj").write_text("forged"),
        "truncate": lambda: os.truncate(cache / "obj", 0),
        "remove": lambda: os.unlink(cache / "obj"),
        "link in": lambda: os.link(cache / "obj", private / "linked"),
        "rename in": lambda: os.rename(cache / "obj", private / "moved"),
        "symlink, then read": lambda: (os.symlink(cache / "obj", private / "sym"), (private / "sym").read_text()),
        "write /tmp": lambda: Path(tempfile.gettempdir(), f"golden-sandbox-{os.getpid()}").write_text("x"),
        "write mine": lambda: (private / "new").write_text("x"),
        "mkdir mine": lambda: (private / "dir").mkdir(),
    })
    for attack in ("create", "overwrite", "truncate", "remove", "rename in", "symlink, then read", "write /tmp"):
        assert isinstance(r[attack], PermissionError), (attack, r[attack])
    assert isinstance(r["link in"], OSError) and r["link in"].errno == errno.EXDEV  # Landlock's REFER rule
    assert r["write mine"] == 1 and r["mkdir mine"] is None
    assert (cache / "obj").read_text() == "the golden answer" and os.listdir(cache) == ["obj"]
    assert (private / "new").read_text() == "x"


@pytest.mark.gpu  # also here: what the GPU sandbox covers, without a GPU
def test_a_gpu_process_finds_the_store_covered_and_no_network(tmp_path, cache):
    """Without Landlock (the CUDA driver does not start under it), the withheld folders are covered by
    empty read-only mounts; the files beneath them are untouched, and what is not withheld stays open
    (sandbox.GPU_GAPS)."""
    (tmp_path / "elsewhere").write_text("open")
    r = confined(tmp_path, {
        "cache listing": lambda: os.listdir(cache),
        "cache": lambda: (cache / "obj").read_text(),
        "overwrite": lambda: (cache / "obj").write_text("forged"),
        "create": lambda: (cache / "new").write_text("x"),
        "network": lambda: socket.create_connection(("127.0.0.1", 9), timeout=2),
        "elsewhere": lambda: (tmp_path / "elsewhere").read_text(),
        "write mine": lambda: (tmp_path / "private" / "new").write_text("x"),
        "torch": lambda: (torch.randn(8, 8) @ torch.randn(8, 8)).shape,
    }, hidden=[cache], landlock=False)
    assert r["cache listing"] == []
    assert isinstance(r["cache"], FileNotFoundError)
    for attack in ("overwrite", "create"):
        assert isinstance(r[attack], OSError) and r[attack].errno == errno.EROFS, (attack, r[attack])
    assert isinstance(r["network"], OSError)
    assert r["elsewhere"] == "open" and r["write mine"] == 1 and r["torch"] == (8, 8)
    assert (cache / "obj").read_text() == "the golden answer" and os.listdir(cache) == ["obj"]


def test_the_runs_journal_folder_is_withheld(tmp_path, monkeypatch):
    """A kernel's process never sees the run's journal, whose lines the run trusts: its variable is
    withheld, and its folder is among those a GPU process finds covered."""
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("GOLDEN_TASKS_JOURNAL", str(tmp_path / "run" / "journal.jsonl"))
    assert str(tmp_path / "run") in isolate.confinement((), gpu=True).hidden


def test_every_store_this_process_opened_is_withheld(tmp_path, monkeypatch):
    """A store given to golden_tasks.run (cache_dir=) inside the user's source folder is kept from the
    kernel as the project's own is: covered for a GPU process, and left out of the folders a CPU one reads.
    The control: the folder's other files stay readable."""
    source, store = tmp_path / "src", tmp_path / "src" / "given-store"
    store.mkdir(parents=True)
    (source / "mine.py").write_text("")
    monkeypatch.setattr(isolate.origin, "user_folders", lambda: [str(source)])
    config.Project.at(tmp_path, cache=store).store  # noqa: B018 -- opened, as run() opens it
    assert str(store) in isolate.confinement((), gpu=True).hidden
    readable = isolate.confinement(()).readable
    assert str(store) not in readable and str(source / "mine.py") in readable


def test_a_pools_ranks_meet_in_their_own_network_and_reach_no_other(tmp_path):
    """Ranks of a pool share a network namespace of its own: they reach the pool's rendezvous over TCP,
    not the host's loopback, and make no unix socket, so no listener is reachable by its name (not a
    forkserver's, which would fork them an unconfined process, nor any other); socketpairs work."""
    server_dir = Path(tempfile.mkdtemp(prefix="pymp-golden-test-"))
    try:
        with socket.socket(socket.AF_UNIX) as forkserver, socket.socket(socket.AF_UNIX) as other, \
                socket.create_server(("127.0.0.1", 0)) as host, isolate.pool_network() as network:
            forkserver.bind(str(server_dir / "listener"))
            other.bind(str(tmp_path / "other"))
            forkserver.listen()
            other.listen()
            network.listener.listen()
            rendezvous, host_address = network.listener.getsockname(), host.getsockname()

            def unix(address):
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(address)
                    return "connected"

            def tcp(address):
                with socket.create_connection(address, timeout=2):
                    return "connected"

            r = confined(tmp_path, {
                "rendezvous": lambda: tcp(rendezvous), "host": lambda: tcp(host_address),
                "forkserver": lambda: unix(str(server_dir / "listener")), "other": lambda: unix(str(tmp_path / "other")),
                "interfaces": lambda: [name for _, name in socket.if_nameindex()], "socketpair": a_socketpair,
            }, pool=network.holder)
            accepted, _ = network.listener.accept()
            accepted.close()
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
    assert r["rendezvous"] == "connected" and r["interfaces"] == ["lo"] and r["socketpair"] == b"ok"
    for attack in ("host", "forkserver", "other"):
        assert isinstance(r[attack], OSError), (attack, r[attack])
    assert r["forkserver"].errno == r["other"].errno == errno.EPERM  # socket(AF_UNIX) itself


def test_a_pools_loopback_has_names_though_no_name_server_answers_there(tmp_path):
    """torch's store looks up the name of its ranks' (IPv4-mapped) loopback address; a pool's network has no
    name server, so /etc/hosts names it there, and the lookup answers instead of failing (EAI_AGAIN: a c10d
    warning per rank). Only the pool's mount namespace sees that /etc/hosts."""
    with isolate.pool_network() as network:
        r = confined(tmp_path, {"mapped": lambda: socket.getnameinfo(("::ffff:127.0.0.1", 80), socket.NI_NAMEREQD),
                                "hosts": lambda: Path("/etc/hosts").read_text()}, pool=network.holder)
    assert r["mapped"] == ("localhost", "http"), r["mapped"]
    assert r["hosts"].endswith(sandbox.LOOPBACK_NAMES) and not Path("/etc/hosts").read_text().endswith(
        sandbox.LOOPBACK_NAMES)


@pytest.mark.gpu  # also here: what the GPU sandbox covers, without a GPU
def test_a_gpu_pools_ranks_keep_unix_sockets_but_find_the_forkservers_covered(tmp_path):
    """A GPU pool's ranks (no Landlock; NCCL's unix sockets) find the multiprocessing forkservers'
    folders covered; the user's other pathname listeners stay reachable (a known gap, GPU_GAPS)."""
    server_dir = Path(tempfile.mkdtemp(prefix="pymp-golden-test-"))
    try:
        with socket.socket(socket.AF_UNIX) as forkserver, socket.socket(socket.AF_UNIX) as other, \
                isolate.pool_network() as network:
            forkserver.bind(str(server_dir / "listener"))
            other.bind(str(tmp_path / "other"))
            forkserver.listen()
            other.listen()
            confinement = isolate.confinement((), pool=network.holder, writable=str(tmp_path), gpu=True)
            assert str(server_dir) in confinement.hidden

            def reach():
                outcomes = []
                for address in (str(server_dir / "listener"), str(tmp_path / "other")):
                    with socket.socket(socket.AF_UNIX) as s:
                        try:
                            s.connect(address)
                            outcomes.append("connected")
                        except OSError as exc:
                            outcomes.append(type(exc).__name__)
                return outcomes
            ok, outcomes = isolate.call(_run_pickled, (cloudpickle.dumps(reach),), 60.0, "the probe", confinement)
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
    assert ok and outcomes == ["FileNotFoundError", "connected"], outcomes


@pytest.mark.gpu  # also here: what the GPU sandbox covers, without a GPU
def test_a_confined_cpu_kernel_sees_no_gpu(tmp_path):
    """A process confined for a CPU kernel has no GPU: torch counts none without starting a CUDA driver."""
    def probe():
        return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count()
    work = (cloudpickle.dumps(probe),)
    cpu = isolate.call(_run_pickled, work, 60.0, "the probe", isolate.Confinement(writable=str(tmp_path)))
    gpu = isolate.call(_run_pickled, work, 60.0, "the probe", isolate.Confinement(writable=str(tmp_path), gpu=True))
    assert cpu == (True, ("", 0))
    assert gpu[1][0] == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_metadata_outside_is_landlocks_known_gap(tmp_path, cache):
    """stat, utime and chmod are not checked (up to ABI 7): metadata is seen and changed, content never."""
    os.chmod(cache / "obj", 0o644)
    r = confined(tmp_path, {
        "stat": lambda: os.stat(cache / "obj").st_size,
        "utime": lambda: os.utime(cache / "obj", (1, 1)),
        "chmod": lambda: os.chmod(cache / "obj", 0o640),
        "read": lambda: (cache / "obj").read_text(),
    })
    assert isinstance(r["read"], PermissionError)
    if sandbox._abi() <= 7:
        assert r == {"stat": len("the golden answer"), "utime": None, "chmod": None, "read": r["read"]}
        assert os.stat(cache / "obj").st_mtime == 1 and os.stat(cache / "obj").st_mode & 0o777 == 0o640
    assert (cache / "obj").read_text() == "the golden answer"


def test_no_network(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_UNIX) as unix, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unix_dgram:
        udp.bind(("127.0.0.1", 0))
        unix.bind(str(tmp_path / "listener"))  # like the forkserver's: a pathname socket this user may write
        unix.listen()
        unix_dgram.bind(str(tmp_path / "datagrams"))  # like /dev/log
        tcp_address, udp_address = tcp.getsockname(), udp.getsockname()  # the probes travel by value

        def tcp_connect():
            with socket.create_connection(tcp_address, timeout=2):
                return "connected"

        def udp_send():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                return s.sendto(b"leak", udp_address)

        def unix_connect():
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(tmp_path / "listener"))
                return "connected"

        def unix_datagram():
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                return s.sendto(b"leak", str(tmp_path / "datagrams"))

        r = confined(tmp_path, {
            "tcp": tcp_connect, "udp": udp_send, "unix": unix_connect, "unix datagram": unix_datagram,
            "dns": lambda: socket.getaddrinfo("example.com", 443),
            "interfaces": lambda: [name for _, name in socket.if_nameindex()],
            "localhost": lambda: socket.getaddrinfo("localhost", 80, socket.AF_INET)[0][4][0],
            "socketpair": a_socketpair,
        })
        for attack in ("tcp", "udp", "unix", "unix datagram", "dns"):
            assert isinstance(r[attack], OSError), (attack, r[attack])
        assert r["interfaces"] == ["lo"] and r["localhost"] == "127.0.0.1" and r["socketpair"] == b"ok"
        assert not select.select([udp, unix, unix_dgram], [], [], 0.1)[0]  # nothing arrived
        with socket.create_connection(tcp.getsockname()):  # the control: the listener works
            pass


def test_a_tensor_still_reaches_the_parent_over_a_connection():
    """A connection passes a tensor as a descriptor of a /dev/shm segment (the private one) that the
    receiver fetches from the sender's resource sharer: a unix socket listening in the sender's temporary
    directory, which must be writable, and short (a socket's path holds at most 107 bytes)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    private = Path(tempfile.mkdtemp(prefix="sandbox-"))  # not tmp_path: too long under pytest-xdist

    def child():
        sandbox.confine(private, sandbox.base_readable())
        # Read once per process, and inherited: TMPDIR set now would change neither
        tempfile.tempdir = str(private)
        multiprocessing.current_process()._config.pop("tempdir", None)  # made by a forkserver's parent
        send.send(torch.arange(4.0))
        time.sleep(10)  # serves the descriptor until the parent has it (and kills this process)

    process = ctx.Process(target=child)
    process.start()
    try:
        assert receive.poll(5)
        assert receive.recv().tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        process.kill()
        process.join()
        shutil.rmtree(private)


def test_shared_memory_is_private(tmp_path):
    host_segment = Path("/dev/shm", f"golden-sandbox-{os.getpid()}")
    host_segment.write_text("another process's segment")
    try:
        r = confined(tmp_path, {
            "listing": lambda: os.listdir("/dev/shm"),
            "open": lambda: host_segment.read_text(),
            "share_memory_": lambda: torch.ones(10).share_memory_().sum().item(),
            "lock": lambda: multiprocessing.Lock().acquire(),
        })
    finally:
        host_segment.unlink()
    assert host_segment.name not in r["listing"] and isinstance(r["open"], FileNotFoundError)
    assert r["share_memory_"] == 10.0 and r["lock"] is True


def test_other_processes_are_out_of_reach(tmp_path):
    other = subprocess.Popen(["sleep", "30"], env={"GOLDEN_SECRET": "hunter2", "PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 10  # the control; the environment is sleep's once it has been exec'd
        while b"GOLDEN_SECRET=hunter2" not in Path(f"/proc/{other.pid}/environ").read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)

        def signal_own_child():
            pid = os.fork()
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            os.kill(pid, signal.SIGTERM)
            return os.waitpid(pid, 0)[1]

        target = other.pid  # the probes travel by value
        r = confined(tmp_path, {
            "environ": lambda: Path(f"/proc/{target}/environ").read_bytes(),
            "parent's environ": lambda: Path(f"/proc/{os.getppid()}/environ").read_bytes(),
            "mem": lambda: os.open(f"/proc/{target}/mem", os.O_RDONLY),
            "own status": lambda: Path("/proc/self/status").read_text().splitlines()[0],
            "own environ": lambda: len(Path("/proc/self/environ").read_bytes()) > 0,
            "signal 0": lambda: os.kill(target, 0),
            "SIGKILL": lambda: os.kill(target, signal.SIGKILL),
            "own child": signal_own_child,
            "capabilities": lambda: [line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                                     if line.startswith(("CapEff", "CapPrm"))],
            "uid": os.getuid,
        })
        for attack in ("environ", "parent's environ", "mem"):
            assert isinstance(r[attack], PermissionError), (attack, r[attack])
        assert r["own status"].startswith("Name:") and r["own environ"] is True
        if sandbox._abi() >= 6:  # signal scoping
            assert isinstance(r["signal 0"], PermissionError) and isinstance(r["SIGKILL"], PermissionError)
            assert other.poll() is None  # still alive
        assert os.WIFSIGNALED(r["own child"]) and os.WTERMSIG(r["own child"]) == signal.SIGTERM
        assert r["capabilities"] == ["0000000000000000"] * 2 and r["uid"] == os.getuid()
    finally:
        other.kill()
        other.wait()


def test_a_parent_death_signal_still_arrives(tmp_path):
    """golden_tasks.project.reaper has a child killed when its parent dies: the kernel sends that signal, and the
    domain's signal scope (which stops the child signalling out) does not stop it coming in."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        if os.fork() == 0:
            ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG, as reaper.die_with_parent
            sandbox.confine(tmp_path, [])
            signal.signal(signal.SIGTERM, lambda *_: (os.write(write, b"arrived"), os._exit(0)))
            os.write(write, b"ready ")
            time.sleep(10)
            os._exit(1)
        os.read(read, 6)  # the child is confined and waits: its parent ends now
        os._exit(0)
    os.close(write)
    os.waitpid(middle, 0)
    assert select.select([read], [], [], 10)[0] and os.read(read, 100) == b"arrived"
    os.close(read)


def test_confine_refuses_a_threaded_process_and_changes_nothing(tmp_path, cache):
    def work():
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            sandbox.confine(tmp_path, sandbox.base_readable())
        except sandbox.SandboxError as exc:
            return str(exc), (cache / "obj").read_text()
        finally:
            stop.set()
            thread.join()
    message, still_read = in_child(work)
    assert "2 threads" in message and still_read == "the golden answer"
    with pytest.raises(sandbox.SandboxError, match="not a directory"):
        in_child(lambda: sandbox.confine(tmp_path / "missing", []))


def test_support(monkeypatch):
    assert sandbox.support() is None and sandbox.support.cache_info().hits > 0
    monkeypatch.setattr(sandbox, "_abi", lambda: -errno.ENOSYS)
    assert sandbox.support.__wrapped__() == "Landlock is not available (kernel without CONFIG_SECURITY_LANDLOCK)"
    monkeypatch.setattr(sandbox, "_abi", lambda: 2)
    assert "Landlock ABI 2 is too old" in sandbox.support.__wrapped__()

    def on_an_old_kernel():
        sandbox._abi = lambda: 2  # in the child
        sandbox.confine(Path("/"), [])
    with pytest.raises(sandbox.SandboxError, match="ABI 2 is too old"):
        in_child(on_an_old_kernel)


def test_base_readable_leaves_out_the_checkout(tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    (checkout / "src").mkdir(parents=True)
    monkeypatch.chdir(checkout)
    monkeypatch.setattr(sys, "path", ["", str(checkout), str(tmp_path), str(checkout / "src"), *sys.path])
    readable = sandbox.base_readable()
    assert checkout not in readable and tmp_path not in readable and Path("") not in readable
    assert checkout / "src" in readable  # beneath the checkout is the caller's business (a venv's site-packages)
    assert Path(sys.prefix) in readable and Path("/usr") in readable and Path("/dev/null") in readable
    assert Path(sandbox.__file__).resolve().parents[1] in readable  # golden_tasks itself, from wherever it comes


def test_a_compiler_installed_elsewhere_runs_confined(tmp_path, monkeypatch):
    """A compiler outside /usr (a toolchain under /opt, say) is found on PATH, and its tree beside its
    bin/ is readable and runnable, never the folder above it."""
    tree = tmp_path / "toolchain"
    (tree / "bin").mkdir(parents=True)
    (tree / "libexec").mkdir()
    (tree / "libexec" / "cc1").write_text("#!/bin/sh\necho compiled\n")
    (tree / "bin" / "c++").write_text(f"#!/bin/sh\nexec {tree / 'libexec' / 'cc1'}\n")
    for tool in (tree / "libexec" / "cc1", tree / "bin" / "c++"):
        tool.chmod(0o755)
    (tmp_path / "beside").write_text("not the compiler's")
    monkeypatch.setenv("PATH", f"{tree / 'bin'}:{os.environ['PATH']}")
    r = confined(tmp_path, {
        "compile": lambda: subprocess.run(["c++"], capture_output=True, text=True).stdout,
        "beside": lambda: (tmp_path / "beside").read_text(),
    })
    assert r["compile"] == "compiled\n"
    assert isinstance(r["beside"], PermissionError)


def test_the_sandbox_mode_enters_every_key_and_required_refuses_to_run_unconfined(monkeypatch):
    from golden_tasks.model.errors import StageFailed
    from golden_tasks.project import toolchain

    assert toolchain.toolchain()["sandbox"] == "confined" and isolate.confinement([]) is not None
    monkeypatch.setenv("GOLDEN_TASKS_SANDBOX", "off")
    assert toolchain.toolchain()["sandbox"] == "off" and isolate.confinement([]) is None
    monkeypatch.setattr(sandbox, "support", lambda: "Landlock is not available (kernel without it)")
    # what support() says is fixed for a process: a fresh cache of toolchains, as in another one (for this test)
    monkeypatch.setattr(toolchain, "_toolchain_of", functools.cache(toolchain._toolchain_of.__wrapped__))
    monkeypatch.setenv("GOLDEN_TASKS_SANDBOX", "auto")
    assert toolchain.toolchain()["sandbox"] == "Landlock is not available (kernel without it)"
    assert isolate.confinement([]) is None  # runs unconfined, and the run says so
    monkeypatch.setenv("GOLDEN_TASKS_SANDBOX", "required")
    with pytest.raises(StageFailed, match="sandbox=required, but this machine cannot confine"):
        isolate.confinement([])
    monkeypatch.setenv("GOLDEN_TASKS_SANDBOX", "sometimes")
    with pytest.raises(ValueError, match="sandbox='sometimes' is not one of auto, required, off"):
        isolate.confinement([])


def test_what_a_confined_call_sends_back_is_read_as_data(tmp_path):
    """A confined call's answer may not name a function to run where it is read (here os.system, in a pickle
    the kernel's code sends in place of its process's answer), nor a tensor (whose rebuilding fetches a
    descriptor from wherever the pickle says); the control: a golden_tasks dataclass, an exception, a size
    and a dtype cross."""
    marker = tmp_path / "ran"

    def forge():
        class RunsCode:
            def __reduce__(self):
                return os.system, (f"touch {marker}",)
        frame = sys._getframe()
        while "conn" not in frame.f_locals:  # isolate's child, which sends the answer
            frame = frame.f_back
        frame.f_locals["conn"].send((True, RunsCode()))
        os._exit(0)

    def honest():
        return isolate.Outcome("returned", 1), ValueError("mine"), torch.Size([2, 3]), torch.float16

    def tensor():
        return torch.arange(6.0)

    confinement = isolate.Confinement()  # a private directory of its own, with a short path (a socket's name)
    with pytest.raises(Exception, match="sent back what is not a result: it names posix.system"):
        isolate.call(_run_pickled, (cloudpickle.dumps(forge),), 60.0, "the probe", confinement)
    assert not marker.exists()
    with pytest.raises(Exception, match="it names torch.multiprocessing.reductions.rebuild_tensor"):
        isolate.call(_run_pickled, (cloudpickle.dumps(tensor),), 60.0, "the probe", confinement)
    ok, (outcome, error, size, dtype) = isolate.call(_run_pickled, (cloudpickle.dumps(honest),), 60.0, "the probe",
                                                     confinement)
    assert ok and outcome == isolate.Outcome("returned", 1) and str(error) == "mine"
    assert size == (2, 3) and dtype == torch.float16
