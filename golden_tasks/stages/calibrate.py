"""Calibrate: measure what this machine can do, once per machine class (its key holds the toolchain and the
hardware, and nothing of a case, so every case shares its entry).

Memory bandwidth at working-set sizes from cache-resident to well beyond the last-level cache, each moved four
ways (model.machine.KINDS): a STREAM triad (a = b + s * c), a copy, a read (a sum) and a write (torch's fill,
and the C library's memset, whose large writes bypass the caches where the CPU allows). FLOP rates: torch's
matmul at each floating dtype. Each figure is the best of repeated calls over a short span, with the median's
shortfall from it as its uncertainty, at every thread count a run gives a stage (widths): a case is held to the
limits of the threads its benchmark had. On a GPU the same with device tensors timed by CUDA events, beside the
device's datasheet figures where they are known.
"""
import ctypes
import ctypes.util
import functools
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from ..model.machine import Bandwidth, Limits, below_floor, datasheet
from ..model.outputs import MachineMeta, Upstream
from ..model.records import Timing
from ..model.work import Work
from ..project.toolchain import hardware
from . import Outputs, cuda_timer

SPAN_S = 0.02  # seconds of calls each figure is the best of (at least CALLS calls)
CALLS = 3
MATMUL_DTYPES = ("float64", "float32", "bfloat16", "float16")
MATMUL_S = 0.005  # seconds a matmul of the size measured takes
FLOAT = torch.float32


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    limits = _cpu(widths(os.cpu_count() or 1))
    if torch.cuda.is_available():
        limits.append(_cuda())
    return Outputs(meta=MachineMeta(limits=[found.to_json() for found in limits]))


def sizes(last_level: int) -> list[int]:
    """Working-set sizes in bytes: from 32 KiB by fours to at least four times the last-level cache (and 64 MiB)."""
    found, size = [], 32 << 10
    while size < max(4 * last_level, 64 << 20):
        found.append(size)
        size *= 4
    return [*found, size]


def last_level_cache() -> int:
    """The largest cache of CPU 0, in bytes (sysfs), or 32 MiB where it cannot tell."""
    found = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").exists() else ""
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            found.append(int(text.rstrip("KMG")) * scale)
    return max(found, default=32 << 20)


def best_of(call: Callable[[], object], timer: Callable[[Callable[[], object]], float]) -> tuple[float, float]:
    """(the best seconds of a call, the median's shortfall from it, relative), over SPAN_S (at least CALLS)."""
    call()
    times, start = [], time.perf_counter()
    while len(times) < CALLS or time.perf_counter() - start < SPAN_S:
        times.append(timer(call))
    best = min(times)
    return best, statistics.median(times) / best - 1


def _cpu_timer(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _memset(buffer: torch.Tensor, threads: int) -> Callable[[], object]:
    """Fill `buffer` with the C library's memset, split across `threads` (ctypes lets go of the GIL)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    total = buffer.numel() * buffer.element_size()
    step = -(-total // threads // 64) * 64
    parts = [(buffer.data_ptr() + at, min(step, total - at)) for at in range(0, total, step)]
    if len(parts) == 1:
        return lambda: libc.memset(parts[0][0], 1, parts[0][1])
    pool = ThreadPoolExecutor(len(parts))
    return lambda: list(pool.map(lambda part: libc.memset(part[0], 1, part[1]), parts))


Timed = dict[str, tuple[float, float]]  # what -> (best seconds, the median's shortfall), at one thread count


def _up_to(timed: dict[int, Timed]) -> dict[int, Timed]:
    """Thread count -> the best of each measure at that many threads or fewer (a kernel given n threads may use
    fewer: on a busy machine a parallel loop waits for its slowest thread, and one thread alone is faster)."""
    return {width: {what: min(timed[w][what] for w in timed if w <= width) for what in timed[width]}
            for width in timed}


def widths(cores: int) -> list[int]:
    """The thread counts measured: those a run gives a stage (its cores shared among doit's workers), as powers
    of two and all of them."""
    return sorted({*(1 << k for k in range(cores.bit_length()) if 1 << k <= cores), cores})


def bandwidth(size: int, device: str, timer: Callable[[Callable[[], object]], float],
              counts: list[int]) -> dict[int, Bandwidth]:
    """Thread count -> the four kinds' best GB/s at a working set of `size` bytes (_up_to)."""
    n = size // FLOAT.itemsize
    a, b, c = (torch.ones(n // 3, dtype=FLOAT, device=device) for _ in range(3))
    src, dst = torch.ones(n // 2, dtype=FLOAT, device=device), torch.empty(n // 2, dtype=FLOAT, device=device)
    whole = torch.ones(n, dtype=FLOAT, device=device)
    moved = {"triad": 3 * a.nbytes, "copy": 2 * src.nbytes, "read": whole.nbytes, "write": whole.nbytes}
    timed: dict[int, Timed] = {}
    for width in counts:
        torch.set_num_threads(width)
        calls = {"triad": [lambda: torch.add(b, c, alpha=3.0, out=a)], "copy": [lambda: dst.copy_(src)],
                 "read": [whole.sum],
                 "write": [lambda: whole.fill_(1.0)] + ([_memset(whole, width)] if device == "cpu" else [])}
        timed[width] = {kind: min(best_of(call, timer) for call in found) for kind, found in calls.items()}
    return {width: Bandwidth(size=size, gbps={kind: moved[kind] / t / 1e9 for kind, (t, _) in best.items()},
                             spread=max(shortfall for _, shortfall in best.values()))
            for width, best in _up_to(timed).items()}


def matmul_size(dtype: torch.dtype, device: str, timer: Callable[[Callable[[], object]], float]) -> int:
    """The side of a square matmul at `dtype` that takes about MATMUL_S (from 256 to 2048, by 64s), from the best
    of a few at 256: large enough to reach the rate, small enough where a dtype is emulated (float16 on most
    CPUs)."""
    x = torch.ones(256, 256, dtype=dtype, device=device)
    seconds = min(timer(functools.partial(torch.mm, x, x)) for _ in range(4))
    n = 256 * (MATMUL_S / max(seconds, 1e-9)) ** (1 / 3)
    return int(min(max(n // 64 * 64, 256), 2048))


def flop_rates(device: str, timer: Callable[[Callable[[], object]], float],
               counts: list[int]) -> tuple[dict[int, tuple[dict[str, float], dict[str, float]]], dict[str, int]]:
    """(thread count -> ({dtype: the best TFLOP/s of torch's matmul}, {dtype: its uncertainty}) (_up_to),
    {dtype: the side of the square matmul measured})."""
    sides, timed = {}, {width: {} for width in counts}
    for name in MATMUL_DTYPES:
        dtype = getattr(torch, name)
        n = sides[name] = matmul_size(dtype, device, timer)
        x, y = torch.ones(n, n, dtype=dtype, device=device), torch.ones(n, n, dtype=dtype, device=device)
        out = torch.empty(n, n, dtype=dtype, device=device)
        for width in counts:
            torch.set_num_threads(width)
            timed[width][name] = best_of(functools.partial(torch.mm, x, y, out=out), timer)
    return {width: ({name: 2 * sides[name] ** 3 / t / 1e12 for name, (t, _) in best.items()},
                    {name: shortfall for name, (_, shortfall) in best.items()})
            for width, best in _up_to(timed).items()}, sides


def beats_floor(work: Work, calibrated: Outputs | None, timing: Timing) -> str | None:
    """Why a kernel's timing is below the floor of the work it cannot avoid (model.machine.below_floor), against
    the stored limits and against limits measured again now (they may have been measured on a busier machine
    than the kernel was timed on), or None; None without stored limits (a replay's benchmark)."""
    stored = calibrated.meta.of_device(timing.device, timing.threads) if calibrated else None
    if not below_floor(work, stored, timing):
        return None
    now = _cuda() if timing.device == "cuda" else _cpu(widths(timing.threads or 1))[-1]
    return below_floor(work, now, timing)


def _cpu(counts: list[int]) -> list[Limits]:
    start, threads = time.perf_counter(), torch.get_num_threads()
    found = [bandwidth(size, "cpu", _cpu_timer, counts) for size in sizes(last_level_cache())]
    rates, sides = flop_rates("cpu", _cpu_timer, counts)
    torch.set_num_threads(threads)
    name, seconds = hardware()["cpu"], time.perf_counter() - start
    return [Limits(device="cpu", name=name, threads=width, bandwidth=[at[width] for at in found],
                   tflops=rates[width][0], tflops_spread=rates[width][1], matmul_n=sides, measured=time.time(),
                   seconds=seconds) for width in counts]


def _cuda() -> Limits:
    start = time.perf_counter()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    threads = [torch.get_num_threads()]
    events = cuda_timer()

    def timer(call: Callable[[], object]) -> float:
        return float(events(call)) / 1e6  # seconds

    found = [bandwidth(size, "cuda", timer, threads)[threads[0]] for size in sizes(l2) if size >= 1 << 20]
    rates, sides = flop_rates("cuda", timer, threads)
    name = torch.cuda.get_device_name()
    return Limits(device="cuda", name=name, bandwidth=found, tflops=rates[threads[0]][0],
                  tflops_spread=rates[threads[0]][1], matmul_n=sides, datasheet=datasheet(name), measured=time.time(),
                  seconds=time.perf_counter() - start)
