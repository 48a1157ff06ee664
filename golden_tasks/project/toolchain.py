"""What the machine contributes to every output: interpreter, torch, C++ and CUDA compilers,
CPU ISA, GPUs.

Read without importing torch (package metadata, `c++ --version`, `nvcc --version`,
/proc/cpuinfo, /dev/nvidia*), so the doit parent process can compute keys cheaply.
"""
import functools
import glob
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from ..model.hashing import digest_bytes, digest_file, digest_json
from . import config, sandbox

TRITON_INTERPRET_ENV = "TRITON_INTERPRET"
TRITON_F32_DEFAULT_ENV = "TRITON_F32_DEFAULT"  # Triton's: tf32, tf32x3 or ieee, for a float32 tl.dot that names none


def compiler() -> tuple:
    """The C++ compiler command @cpp runs and AOTInductor uses: $CXX (a command line, such as
    `ccache g++`), else c++. Read on every call: a process may change its environment."""
    return _words(os.environ.get("CXX", "c++"))


@functools.cache
def _words(command: str) -> tuple:
    return tuple(shlex.split(command))


def visible_gpus() -> str:
    """The CUDA visibility mask: $CUDA_VISIBLE_DEVICES, else all. Read on every call."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "all")


def _version(command: tuple, line: int) -> str:
    """One line of `command --version` (g++ names its release first, nvcc last)."""
    name = " ".join(command)
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return f"{name}: unavailable"
    lines = out.stdout.strip().splitlines()
    return lines[line] if lines else f"{name}: unavailable"


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU is present and not hidden by $CUDA_VISIBLE_DEVICES (no torch, no driver call)."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) and visible_gpus().strip() not in ("", "-1")


def triton_interpreted() -> bool:
    """Whether Triton kernels run under Triton's interpreter here: $TRITON_INTERPRET when set, else when no
    NVIDIA GPU is visible."""
    value = os.environ.get(TRITON_INTERPRET_ENV)
    if value is not None:
        return value.strip().lower() in ("1", "true", "yes", "on")
    return not gpu_visible()


def triton_settings() -> dict:
    """Triton's environment variables that change what a kernel computes, with their values here: its mode
    ($TRITON_INTERPRET) and the precision of a float32 `tl.dot` that names none ($TRITON_F32_DEFAULT: TF32
    on an NVIDIA GPU unless it says ieee). Planning depends on them (planning.discover), and a Triton kernel's
    fingerprint holds them."""
    return {name: os.environ.get(name) for name in (TRITON_INTERPRET_ENV, TRITON_F32_DEFAULT_ENV)}


def settle_triton_mode() -> None:
    """$TRITON_INTERPRET as triton_interpreted() decides, for this process and those it starts. Triton reads it
    as it imports its own library and as each @triton.jit function is decorated, so it is set before either
    can happen: by a process that sees this machine's devices (a confined one may not)."""
    os.environ.setdefault(TRITON_INTERPRET_ENV, "1" if triton_interpreted() else "0")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return digest_bytes(" ".join(sorted(line.split(":", 1)[1].split())).encode())
    except OSError:
        pass
    return "unknown"


def _gpus(visible: str) -> str:
    """NVIDIA devices present, their models and the visibility mask: a CUDA kernel skipped on a machine
    without one must run, not hit that cache entry, on a machine with one; an artifact built for one GPU
    architecture (the model says it) is never one another machine's key finds."""
    return f"{len(glob.glob('/dev/nvidia[0-9]*'))} visible={visible} models={','.join(_gpu_models())}"


def toolchain() -> dict:
    """The toolchain components that enter every stage key. Read from the environment on every call
    (a process that changes $CXX must not key with the compiler it had before), cached per value:
    the same values give the same dict object (graph keys its memo of keys by it)."""
    environ = os.environ
    return _toolchain_of(environ.get("CXX"), environ.get("CUDA_VISIBLE_DEVICES"), config.current().sandbox)


@functools.cache
def _toolchain_of(*variables) -> dict:
    """toolchain() for these values of its environment variables (what it reads of them is read here)."""
    return _toolchain(compiler(), visible_gpus(), confinement())


def confinement() -> str:
    """How kernels run here: "confined", "off" (sandbox=off), or why this machine cannot confine them.
    A verdict made unconfined is never one a confined run reuses."""
    mode = config.current().sandbox
    return "off" if mode == "off" else sandbox.support() or "confined"  # support(): cached, once a process


@functools.cache
def _toolchain(cxx: tuple, visible: str, confined: str) -> dict:
    return {
        "python": f"{sys.implementation.name}-{platform.python_version()}",
        "torch": importlib.metadata.version("torch"),
        "cxx": _version(cxx, 0),  # the compiler AOTInductor and @cpp use
        "nvcc": _version(("nvcc",), -1),
        "isa": f"{platform.machine()}:{_cpu_flags()}",
        "gpus": _gpus(visible),
        "sandbox": confined,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_models() -> list:
    """The NVIDIA driver's model name of each GPU (no torch, no NVML)."""
    models = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                models += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model")]
        except OSError:
            continue
    return models


def machine() -> dict:
    """The machine a measurement was made on, which enters the keys of the stages that measure (timings, the
    machine's limits) only: a measurement from another machine is never reused (the verdicts are). The
    visibility mask is read on every call, as toolchain() reads it; the same values give the same dict object
    (graph keys its memo of keys by it). On a cluster (executor=ray) a stage runs on any node of this machine's
    class (node_class), so its hardware stands for the machine, not its host name."""
    return _machine_of(visible_gpus(), config.current().executor == "ray")


@functools.cache
def _machine_of(visible: str, on_cluster: bool) -> dict:
    found = {**hardware(), "visible": visible}
    if on_cluster:
        del found["host"]
    return found


@functools.cache
def hardware() -> dict:
    """This machine: its name, CPU model, cores and GPU models."""
    return {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(), "gpus": _gpu_models()}


def node_class() -> str:
    """The class of node this machine is, as the name of a Ray custom resource: a digest of its toolchain
    and its hardware but not its name. On a cluster every stage asks for the driver's class, so it runs only
    on a node whose toolchain is the one its key holds (nodes join as their class: `golden-tasks node`)."""
    found = {"toolchain": toolchain(), **hardware()}
    del found["host"]
    return "golden_tasks_node_" + digest_json(found)[:16]


# What only presents or schedules results: editing it cannot change a stage's output.
_NOT_IN_VERSION = ("reports", "frontends")  # layers; and the entry points at the package's top


@functools.cache
def pipeline_version() -> str:
    """Digest of the package's source that shapes outputs: editing it invalidates every entry."""
    package = Path(__file__).parents[1]
    return digest_json({str(p.relative_to(package)): digest_file(p) for p in sorted(package.rglob("*.py"))
                        if len(p.relative_to(package).parts) > 1 and p.relative_to(package).parts[0]
                        not in _NOT_IN_VERSION})
