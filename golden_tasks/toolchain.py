"""What the machine contributes to every output: interpreter, torch, C++ compiler, CPU ISA, GPUs.

Read without importing torch (package metadata, `c++ --version`, /proc/cpuinfo,
/dev/nvidia*), so the doit parent process can compute keys cheaply.
"""
import functools
import glob
import importlib.metadata
import os
import platform
import subprocess
import sys

from .hashing import digest_bytes


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return f"{cxx}: unavailable"
    return out.stdout.splitlines()[0] if out.stdout else f"{cxx}: unavailable"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return digest_bytes(" ".join(sorted(line.split(":", 1)[1].split())).encode())
    except OSError:
        pass
    return "unknown"


def _gpus() -> str:
    """NVIDIA devices present (and the visibility mask): a CUDA kernel skipped on a machine
    without one must run, not hit that cache entry, on a machine with one."""
    return f"{len(glob.glob('/dev/nvidia[0-9]*'))} visible={os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}"


@functools.cache
def toolchain() -> dict:
    """The toolchain components that enter every stage key."""
    return {
        "python": f"{sys.implementation.name}-{platform.python_version()}",
        "torch": importlib.metadata.version("torch"),
        "cxx": _compiler(),
        "isa": f"{platform.machine()}:{_cpu_flags()}",
        "gpus": _gpus(),
    }
