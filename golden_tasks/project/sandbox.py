"""Confinement, by the operating system, of a process about to run untrusted code (a kernel).

A freshly forked, single-threaded child calls confine() before it loads the code; from then on the
kernel holds it, and every thread and process it starts, whatever the code does (ctypes, a compiled
extension, a subprocess), irreversibly. Linux only; support() says whether this machine can.

What is defended, and how:

- Reading: Landlock handles every filesystem right the running ABI knows and allows only reading and
  executing beneath the `readable` paths (base_readable(): the interpreter, its packages, the system)
  and everything beneath the one `writable` directory. Elsewhere an open is EACCES: the project's
  cache store, runs/, other caches under /tmp, the home directory, the current directory. A rule
  cannot deny inside an allowed directory, so the list must be precise.
- Writing, creating, removing, truncating: only beneath `writable`. A file outside cannot be linked
  (EXDEV) or moved (EACCES) into it, and a symlink to it leads nowhere. Character devices in
  `readable` (/dev/null, a GPU's) may also be opened for writing, with ioctls (handled from ABI 5).
- Network: a new network namespace (a down loopback and nothing else: no route, no DNS), Landlock's
  TCP bind and connect with no rule (ABI >= 4), abstract unix sockets scoped to the domain (ABI >= 6),
  and a seccomp filter failing connect(2), datagram unix sockets and io_uring with EPERM. The filter
  is needed: a pathname unix socket is a file that neither Landlock (up to ABI 7) nor the namespace
  keeps the code from, so it would reach every listener on the host this user may write to -- the
  multiprocessing forkserver's among them, which forks an unconfined process for whoever connects
  (tried: a child confined without the filter read the cache that way), an ssh agent, docker.sock.
  Connected sockets and socketpairs keep working, and listening does: a tensor sent over a
  multiprocessing connection is fetched by the receiver, outside, from a listener of the sender's.
- The ranks of a pool, which meet over TCP, share one network namespace of their own (PoolNetwork:
  a loopback up, nothing else), held by a small process that made it, and connect(2) there; they
  cannot make a unix socket at all (socket(linux.AF_UNIX) fails; socketpairs work), so no listener of the
  host's is reachable by its name, and the rendezvous listens on a socket made inside the namespace.
- Other processes: Landlock forbids ptrace-class access to processes outside the domain, so another
  process's /proc/<pid>/environ, mem, maps, fd/, cwd, root are EACCES; and (ABI >= 6) signals to
  them are EPERM. Signals to and /proc of the process's own descendants still work (they inherit its
  domain), and signals from outside, a parent-death signal too, still arrive.
- Privileges: a new user namespace (a pool's, nested) takes every capability in the initial
  one away (this matters when run as root); uid and gid map to themselves, so ownership reads as
  before. The namespace's own capabilities are dropped too (its CAP_NET_ADMIN and CAP_SYS_ADMIN are
  kernel attack surface), and no_new_privs keeps setuid and file capabilities from giving any back.
- /dev/shm: a new mount namespace has a private, writable tmpfs there. glibc's shm_open(3) and
  sem_open(3) use /dev/shm alone, and torch does: share_memory_(), a tensor sent over a
  multiprocessing connection (file_descriptor strategy), multiprocessing.Lock() and Queue() all fail
  without it. The host's /dev/shm, where other processes keep segments by name, is out of sight;
  segments cross to other processes as descriptors (the file_system strategy, which passes names and
  needs a daemon reached by connect(2), does not work).

Known gaps. Landlock (ABI 7) does not check stat(2), access(2), chmod(2), chown(2), utime(2),
setxattr(2): the metadata of a file outside whose name is known can be read and changed (a cache
entry's size, mtime, or a mode that locks its owner out), never its content. Files and directories
open before confine() keep their access: close what the code must not have (a directory descriptor
gives nothing beneath it: every open's path is checked). The forked memory (objects, os.environ) is
the code's to read: scrub secrets before forking. Other processes' /proc/<pid>/cmdline and status
stay readable, and all of /etc (/etc/shadow too, for root). Below ABI 6 signals to the
user's other processes are not stopped, below ABI 5 device ioctls are not.

A process that uses a GPU is confined without Landlock (see confine): GPU_GAPS.
"""
import ctypes
import dataclasses
import errno
import fcntl
import functools
import glob
import os
import platform
import shlex
import shutil
import site
import socket
import stat
import struct
import sys
import warnings
from pathlib import Path

from . import linux

MIN_ABI = 3  # the first to handle truncation: below it a file outside `writable` could be emptied

GPU_GAPS = ("a kernel that runs on the GPU is confined without Landlock, which stops the CUDA driver: the "
            "store and runs/ are covered by empty mounts, but the rest of what the user may read or write "
            "(other checkouts' caches, the home directory), other processes' /proc and signals stay open to it")


class SandboxError(Exception):
    """A confinement step failed; the process may be partly confined and must exit, not run the code."""


def _fail(step: str, err: int | None = None) -> SandboxError:
    err = ctypes.get_errno() if err is None else err
    return SandboxError(f"{step}: {errno.errorcode.get(err, err)} ({os.strerror(err)})")


def _syscall(number: int, *args: int) -> int:
    """syscall(2) with every argument (a struct as its address) a full register, not ctypes' 32-bit int."""
    return linux.libc.syscall(*(ctypes.c_long(a) for a in (number, *args)))


def _abi() -> int:
    """The running Landlock ABI, or -errno (ENOSYS: not built in; EOPNOTSUPP: not enabled at boot)."""
    if not linux.LINUX:
        return -errno.ENOSYS
    abi = _syscall(linux.SYS_landlock_create_ruleset, 0, 0, linux.LANDLOCK_CREATE_RULESET_VERSION)
    return abi if abi >= 0 else -ctypes.get_errno()


def _unsupported(abi: int) -> str | None:
    if not linux.LINUX:
        return f"confinement needs Linux (Landlock, namespaces, seccomp); this is {sys.platform}"
    if platform.machine() not in linux.ARCHES:
        return f"the seccomp filter knows the system calls of {' and '.join(linux.ARCHES)}, not of {platform.machine()}"
    if abi == -errno.ENOSYS:
        return "Landlock is not available (kernel without CONFIG_SECURITY_LANDLOCK)"
    if abi == -errno.EOPNOTSUPP:
        return "Landlock is built in but not enabled (landlock is missing from the lsm= kernel parameter)"
    if abi < 0:
        return f"Landlock's version query failed: {os.strerror(-abi)}"
    if abi < MIN_ABI:
        return f"Landlock ABI {abi} is too old: confinement needs ABI {MIN_ABI} (Linux 6.2), which handles truncation"
    return None


@functools.cache
def support() -> str | None:
    """None when this machine can confine a process (Landlock ABI >= MIN_ABI; user, network and mount
    namespaces, a tmpfs mounted in one; seccomp), else one line saying why not. The whole of confine()
    is tried in a forked child, which exits: this process is left as it was. Call it before forking
    the children that confine themselves, so that they inherit the answer."""
    if problem := _unsupported(_abi()):
        return problem
    read, write = os.pipe()
    with warnings.catch_warnings():  # the child makes system calls and exits: safe in a threaded parent
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            confine(Path("/"), [])
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 -- whatever it is, the parent reports it
            os.write(write, str(exc).encode()[:1000])
        os._exit(1)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    os.set_blocking(read, False)  # a fork by another thread meanwhile may hold the write end: no waiting for EOF
    try:
        why = os.read(read, 1000).decode(errors="replace")
    except BlockingIOError:
        why = ""
    finally:
        os.close(read)
    return None if os.waitstatus_to_exitcode(status) == 0 else f"confinement failed: {why or 'the probe died'}"


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise _fail(f"writing {text.strip()!r} to {path}", exc.errno) from None


def _map_ids(uid: int, gid: int) -> None:
    """In a user namespace just made: uid and gid map to themselves."""
    _write("/proc/self/setgroups", "deny")  # an unprivileged gid_map requires it
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")


def _join(holder: int) -> None:
    """Enter the user and network namespaces of process `holder` (hold_pool_network): the network namespace
    belongs to that user namespace, where this process, made by the same user, has the right to join."""
    for kind, flag in (("user", linux.CLONE_NEWUSER), ("net", linux.CLONE_NEWNET)):
        try:
            fd = os.open(f"/proc/{holder}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _fail(f"opening the pool's {kind} namespace (process {holder})", exc.errno) from None
        try:
            if linux.libc.setns(fd, flag) != 0:
                raise _fail(f"setns (joining the pool's {kind} namespace)")
        finally:
            os.close(fd)


def _enter_namespaces(pool: int | None, hidden=()) -> None:
    """A new user namespace owning a new mount namespace, with a private tmpfs on /dev/shm and an empty
    read-only one on each folder of `hidden`, and a new network namespace, or the pool's (`pool`: the
    pid of the process holding it, whose user namespace the new one nests in; its loopback named in
    /etc/hosts: _name_loopback)."""
    uid, gid = os.geteuid(), os.getegid()
    if pool is not None:
        _join(pool)
    alone = pool is None
    if linux.libc.unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNS | (linux.CLONE_NEWNET if alone else 0)) != 0:
        raise _fail("unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNS" + (" | linux.CLONE_NEWNET)" if alone else ")"))
    _map_ids(uid, gid)
    if linux.libc.mount(None, b"/", None, linux.MS_REC | linux.MS_PRIVATE, None) != 0:  # no mount propagates out, or in
        raise _fail("making the mounts private")
    if os.path.isdir("/dev/shm") and linux.libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", linux.MS_NOSUID | linux.MS_NODEV,
                                                   b"mode=1777") != 0:
        raise _fail("mounting a private tmpfs on /dev/shm")
    if pool is not None and os.path.isdir("/dev/shm") and os.path.isfile("/etc/hosts"):
        _name_loopback()
    for folder in hidden:
        read_only = linux.MS_RDONLY | linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        if os.path.isdir(folder) and linux.libc.mount(b"tmpfs", os.fsencode(folder), b"tmpfs", read_only,
                                                      b"size=4k") != 0:
            raise _fail(f"covering {folder}")


LOOPBACK_NAMES = "127.0.0.1 localhost\n::ffff:127.0.0.1 localhost\n"


def _name_loopback() -> None:
    """/etc/hosts, as this mount namespace sees it, with the loopback's addresses named (LOOPBACK_NAMES), its
    IPv4-mapped IPv6 one among them: torch's store resolves that name as a pool's ranks connect, and in the
    pool's network namespace no DNS server answers (err=-3: a c10d warning on the user's terminal, per rank).
    The file lies in this namespace's private /dev/shm."""
    try:
        known = Path("/etc/hosts").read_text()
    except OSError:
        known = ""
    named = Path("/dev/shm/golden-tasks-hosts")
    named.write_text(known.rstrip("\n") + "\n" + LOOPBACK_NAMES)
    if linux.libc.mount(os.fsencode(named), b"/etc/hosts", None, linux.MS_BIND, None) != 0:
        raise _fail("naming the pool's loopback in /etc/hosts")


def _drop_capabilities() -> None:
    """Effective, permitted and inheritable sets emptied (the ambient set follows)."""
    header, data = linux.CapUserHeader(linux.LINUX_CAPABILITY_VERSION_3, 0), (linux.CapUserData * 2)()
    if linux.libc.capset(ctypes.byref(header), data) != 0:
        raise _fail("capset (dropping capabilities)")


def _assemble(program: list) -> list:
    """A classic BPF program from (code, k, if true, if false) steps, where a jump names its targets (a
    label, or "next"), and ("label", name) marks the step that follows: the (code, jt, jf, k) tuples."""
    where, steps = {}, []
    for step in program:
        if step[0] == "label":
            where[step[1]] = len(steps)
        else:
            steps.append(step)
    where_next = lambda i, target: where[target] - i - 1 if target != "next" else 0  # noqa: E731
    return [(code, where_next(i, yes), where_next(i, no), k) for i, (code, k, yes, no) in enumerate(steps)]


def _forbid_dialing(pool: bool, unix: bool) -> None:
    """seccomp: EPERM for io_uring (which connects past seccomp) and any call of a foreign ABI (i386 on
    x86_64, x32); for connect(2) but in a pool (`pool`: its own network namespace); and, unless `unix`
    (NCCL's ranks need them), for datagram unix sockets (sendto an address), and in a pool for any
    socket(linux.AF_UNIX) (alone, a stream one cannot connect, and listens to pass a tensor on)."""
    arch, nr_socket, nr_socketpair, nr_connect = linux.ARCHES[platform.machine()]
    domain, kind = ("ld", 16, "next", "next"), ("ld", 24, "next", "next")  # args[0], args[1]: their low halves
    program = [("ld", 4, "next", "next"), ("jeq", arch, "next", "deny"),  # seccomp_data.arch
               ("ld", 0, "next", "next"), ("jge", linux.__X32_SYSCALL_BIT, "deny", "next"),  # seccomp_data.nr
               *([] if pool else [("jeq", nr_connect, "deny", "next")]),
               ("jeq", linux.__NR_io_uring_setup, "deny", "next")]
    if not unix:
        program += [("jeq", nr_socket, "socket", "next"), ("jeq", nr_socketpair, "pair", "allow"),
                    ("label", "socket"), domain, ("jeq", linux.AF_UNIX, "deny" if pool else "type", "allow"),
                    ("label", "pair"), domain, ("jeq", linux.AF_UNIX, "type", "allow"),
                    ("label", "type"), kind, ("and", linux.SOCK_TYPE_MASK, "next", "next"),  # less CLOEXEC, NONBLOCK
                    ("jeq", linux.SOCK_DGRAM, "deny", "allow")]
    program += [("label", "allow"), ("ret", linux.SECCOMP_RET_ALLOW, "next", "next"),
                ("label", "deny"), ("ret", linux.SECCOMP_RET_ERRNO | errno.EPERM, "next", "next")]
    codes = {"ld": linux.BPF_LD_W_ABS, "jeq": linux.BPF_JEQ_K, "jge": linux.BPF_JGE_K, "and": linux.BPF_AND_K,
             "ret": linux.BPF_RET_K}
    steps = _assemble([step if step[0] == "label" else (codes[step[0]], *step[1:]) for step in program])
    filters = (linux.SockFilter * len(steps))(*(linux.SockFilter(code, jt, jf, k) for code, jt, jf, k in steps))
    fprog = linux.SockFprog(len(steps), filters)
    if linux.libc.prctl(linux.PR_SET_SECCOMP, linux.SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise _fail("prctl(linux.PR_SET_SECCOMP)")


def _leave_host(pool: int | None, hidden, unix: bool) -> None:
    """Namespaces (_enter_namespaces), no capabilities, no_new_privs and the seccomp filter (_forbid_dialing)."""
    _enter_namespaces(pool, hidden)
    _drop_capabilities()
    if linux.libc.prctl(linux.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(linux.PR_SET_NO_NEW_PRIVS)")
    _forbid_dialing(pool is not None, unix)


def _add_rule(ruleset: int, path: Path, rights: int, handled: int) -> None:
    """Allow `rights` beneath `path` (skipped if it does not exist)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _fail(f"opening {path}", exc.errno) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISCHR(mode):
            rights = linux.DEVICE
        elif not stat.S_ISDIR(mode):  # the kernel refuses directory rights on a file
            rights &= linux.FILE_RIGHTS
        attr = linux.PathBeneathAttr(rights & handled, fd)
        rule = linux.LANDLOCK_RULE_PATH_BENEATH
        if _syscall(linux.SYS_landlock_add_rule, ruleset, rule, ctypes.addressof(attr), 0) != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def confine(writable: Path, readable: list[Path], pool: int | None = None, listable: list[Path] = (),
            hidden: list[Path] = (), landlock: bool = True) -> None:
    """Confine the calling process, irreversibly, with every thread and process it starts later: it
    reads and executes only beneath `readable` (a path that does not exist is skipped; a character
    device there may also be written, with ioctls), lists (names only, never content) the directories
    beneath `listable`, does anything beneath the directory `writable`, and reaches no network and no
    unix socket by name. In a `pool` (the pid of the process holding its network namespace:
    hold_pool_network) it connects over TCP within that namespace alone, and makes no unix socket (but
    socketpairs). Only a single-threaded
    process can be confined (right after a fork). SandboxError names the step that failed; the
    process may then be partly confined, and must exit rather than run the code.

    The folders of `hidden` are covered by empty read-only mounts in the process's mount namespace
    (whatever Landlock allows: a listener's socket there cannot be reached by its path either).
    A process that uses a GPU passes landlock=False: the CUDA driver does not start under these Landlock
    rules (cudaGetDeviceCount: error 304, seen on an H200 with driver 580, Linux 6.18, where it starts
    with everything else here). `readable` and `listable` are then not enforced, and everything the
    user may read or write but `hidden` stays open to it (GPU_GAPS); in a pool it also makes unix
    sockets (NCCL's ranks use datagram ones), so its caller must cover what listens where it can reach."""
    abi = _abi()
    if problem := _unsupported(abi):
        raise SandboxError(problem)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise SandboxError(f"the process has {threads} threads: Landlock and unshare(linux.CLONE_NEWUSER) act on "
                           "the calling thread alone, so only a single-threaded process (just forked) can be confined")
    if not os.path.isdir(writable):
        raise SandboxError(f"the writable directory {writable} is not a directory")
    if not landlock:
        _leave_host(pool, hidden, unix=pool is not None)
        return
    handled = sum(rights for since, rights in linux.FS_RIGHTS.items() if abi >= since)
    attr = linux.RulesetAttr(handled, 0, 0)
    if abi >= 4 and pool is None:  # a pool's namespace is the pool's alone: it binds and connects there
        # no rule: none
        attr.handled_access_net = linux.LANDLOCK_ACCESS_NET_BIND_TCP | linux.LANDLOCK_ACCESS_NET_CONNECT_TCP
    if abi >= 6:
        attr.scoped = linux.LANDLOCK_SCOPE_SIGNAL | linux.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # an older kernel refuses fields it does not know
    ruleset = _syscall(linux.SYS_landlock_create_ruleset, ctypes.addressof(attr), size, 0)
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    try:  # the rules first: until unshare() a failure leaves the process as it was
        for path in readable:
            _add_rule(ruleset, Path(path), linux.DIR_READ, handled)
        for path in listable:
            _add_rule(ruleset, Path(path), linux.FsAccess.READ_DIR, handled)
        _add_rule(ruleset, Path(writable), handled, handled)
        _leave_host(pool, hidden, unix=False)
        _add_rule(ruleset, Path("/dev/shm"), handled, handled)  # the private tmpfs just mounted
        if _syscall(linux.SYS_landlock_restrict_self, ruleset, 0) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)


@dataclasses.dataclass
class PoolNetwork:
    """A network namespace for the ranks of one pool (isolate.pool_network makes one): `holder`, the pid of
    the process keeping it (what confine(pool=) joins), and `listener`, a TCP socket bound to its loopback
    on a port the system picked, for the pool's rendezvous (whichever process serves from it, it accepts
    only from inside)."""
    holder: int
    listener: socket.socket

    @classmethod
    def received(cls, answer: socket.socket, holder: int) -> "PoolNetwork":
        """The namespace process `holder` made (hold_pool_network), its listener read from `answer`;
        SandboxError, saying why, if it could not."""
        message, fds, _, _ = socket.recv_fds(answer, 1000, 1)
        if not fds:
            why = message.decode(errors="replace").removeprefix("!") or "its process died"
            raise SandboxError(f"making a network namespace for a pool of ranks: {why}")
        return cls(holder, socket.socket(fileno=fds[0]))


def hold_pool_network(answer: socket.socket) -> None:
    """Run by the process that holds a pool's network namespace, single-threaded (a forkserver's child:
    a plain fork may carry a thread that a library's fork handler started): make a user namespace owning
    a network namespace, bring its loopback up, send a TCP socket bound to a loopback port there over
    `answer` (PoolNetwork.received) and wait until the other end closes. A failure is sent instead."""
    try:
        uid, gid = os.geteuid(), os.getegid()
        if linux.libc.unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNET) != 0:
            raise _fail("unshare(linux.CLONE_NEWUSER | linux.CLONE_NEWNET)")
        _map_ids(uid, gid)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as control:  # struct ifreq: a name, its flags
            asked = fcntl.ioctl(control, linux.SIOCGIFFLAGS, struct.pack("16s24x", b"lo"))
            flags = struct.unpack_from("16sH", asked)[1]
            fcntl.ioctl(control, linux.SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | linux.IFF_UP))
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            socket.send_fds(answer, [b"ok"], [listener.fileno()])
    except Exception as exc:  # noqa: BLE001 -- reported by the receiver
        answer.sendall(f"!{exc}".encode()[:1000])
        return
    answer.recv(1)


def _linked(folder: str) -> list:
    """Where the symbolic links directly in `folder` lead (a package tree made of links to packages
    elsewhere): a rule holds for the file a path resolves to, not for the link."""
    try:
        with os.scandir(folder) as entries:
            return [Path(os.path.realpath(e.path)) for e in entries if e.is_symlink()]
    except OSError:
        return []


def _compiler_trees() -> list[Path]:
    """Where the compilers that @cpp and AOTInductor run live when not under /usr ($CXX's words, c++, nvcc,
    as found on PATH, links followed): the bin, lib, lib64, libexec and include folders beside their
    own, which hold the tools and headers they run and read (never the whole prefix: a home directory's
    ~/bin would open the home directory)."""
    found = []
    for name in (*shlex.split(os.environ.get("CXX", "")), "c++", "nvcc"):
        if path := shutil.which(name):
            for tool in (Path(path), Path(os.path.realpath(path))):
                found += [tool.parent.parent / part for part in ("bin", "lib", "lib64", "libexec", "include")]
    return found


def base_readable() -> list[Path]:
    """What any confined Python + torch process reads: the Python prefixes and the import path (not ''
    nor the current directory or one above it: a project's own sources are the caller's to add),
    golden_tasks' own package (wherever it is imported from: a checkout on $PYTHONPATH that is the current
    directory too), the system (/usr, /lib*, /bin, /sbin, /etc, /proc, /sys), the compilers' trees,
    harmless devices and the GPU's, when present."""
    cwd = Path(os.getcwd())
    found = [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)] + [Path(__file__).resolve().parents[1]]
    user_site = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    for entry in [*sys.path, *site.getsitepackages(), *user_site]:
        if entry and os.path.isabs(entry) and os.path.exists(entry) and not cwd.is_relative_to(entry):
            found.append(Path(entry))
            found += _linked(entry)
    found += map(Path, ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys",
                        "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"])
    found += _compiler_trees()
    found += map(Path, sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/nvidia-caps/*") + glob.glob("/run/nvidia*")))
    return [p for p in dict.fromkeys(found) if p != cwd and os.path.exists(p)]
