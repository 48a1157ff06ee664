"""Linux's interface for confining a process (golden_tasks.project.sandbox), from its headers: syscall numbers,
flags, the structures Landlock, capabilities and seccomp take, and libc. Nothing here decides anything."""
import ctypes
import enum
import sys

# include/uapi/linux/landlock.h; the syscall numbers are the same on every architecture (since 5.1)
SYS_landlock_create_ruleset = 444
SYS_landlock_add_rule = 445
SYS_landlock_restrict_self = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
# the filesystem access rights: bit i for the i-th name (ABI 1 up to MAKE_SYM; REFER: ABI 2, TRUNCATE: 3, IOCTL_DEV: 5)
FsAccess = enum.IntFlag("FsAccess", [(name, 1 << bit) for bit, name in enumerate((
    "EXECUTE", "WRITE_FILE", "READ_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE", "MAKE_CHAR", "MAKE_DIR", "MAKE_REG",
    "MAKE_SOCK", "MAKE_FIFO", "MAKE_BLOCK", "MAKE_SYM", "REFER", "TRUNCATE", "IOCTL_DEV"))])
LANDLOCK_ACCESS_NET_BIND_TCP = 1 << 0  # ABI 4
LANDLOCK_ACCESS_NET_CONNECT_TCP = 1 << 1  # ABI 4
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
LANDLOCK_SCOPE_SIGNAL = 1 << 1  # ABI 6

# include/uapi/linux/{sched,mount,prctl,capability,seccomp,filter,bpf_common}.h
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 1 << 12, 1 << 14, 1 << 18
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_AND_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x54, 0x06
AF_UNIX, SOCK_DGRAM, SOCK_TYPE_MASK = 1, 2, 0xF
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1  # include/uapi/linux/{sockios,if}.h
__X32_SYSCALL_BIT = 0x40000000
__NR_io_uring_setup = 425  # the same everywhere
# AUDIT_ARCH_* and __NR_socket, __NR_socketpair, __NR_connect of the architectures known here
ARCHES = {"x86_64": (0xC000003E, 41, 53, 42), "aarch64": (0xC00000B7, 198, 199, 203)}

# the filesystem rights by the ABI that brought them; later ones are not handled (so not denied) until added here
FS_RIGHTS = {1: FsAccess.MAKE_SYM * 2 - 1, 2: FsAccess.REFER, 3: FsAccess.TRUNCATE,
              5: FsAccess.IOCTL_DEV}
FILE_READ = FsAccess.READ_FILE | FsAccess.EXECUTE
DIR_READ = FILE_READ | FsAccess.READ_DIR
FILE_RIGHTS = FILE_READ | FsAccess.WRITE_FILE | FsAccess.TRUNCATE | FsAccess.IOCTL_DEV
DEVICE = FsAccess.READ_FILE | FsAccess.WRITE_FILE | FsAccess.IOCTL_DEV

LINUX = sys.platform.startswith("linux")
if LINUX:  # elsewhere support() says why not, and nothing calls libc
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.unshare.argtypes = [ctypes.c_int]
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class CapUserHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapUserData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]
