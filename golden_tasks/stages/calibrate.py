"""Calibrate: measure what this machine can do, once per machine class (its key holds the toolchain, the hardware
and the threads a stage gets, and nothing of a case, so every case shares its entry).

Memory bandwidth at working-set sizes from cache-resident to well beyond the last-level cache, each moved four
ways (model.machine.KINDS): a STREAM triad (a = b + s * c), a copy, a read (a sum) and a write (torch's fill,
and the C library's memset, whose large writes bypass the caches where the CPU allows), with the threads the
benchmark gives a kernel. FLOP rates: torch's matmul at each floating dtype. Each figure is the best of repeated
calls over a short span, with the median's shortfall from it as its uncertainty. On a GPU the same with device
tensors timed by CUDA events, beside the device's datasheet figures where they are known. A project's own
figures (`[tool.golden-tasks.machine]`, carried in the plan) replace the measured ones where it gives them.
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

from ..model.machine import Bandwidth, Limits, datasheet
from ..model.outputs import MachineMeta, Upstream
from . import Outputs

SPAN_S = 0.01  # seconds of calls each figure is the best of (at least CALLS calls)
CALLS = 3
MATMUL_N = {"float64": 384, "float32": 512, "bfloat16": 512, "float16": 512}  # square matmuls per dtype
FLOAT = torch.float32


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    limits = [_cpu()]
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


def bandwidth(size: int, device: str, timer: Callable[[Callable[[], object]], float], threads: int) -> Bandwidth:
    """The four kinds' best GB/s at a working set of `size` bytes, each the best with `threads` threads and with
    one (on a busy machine a parallel loop waits for its slowest thread: one thread alone is then faster)."""
    n = size // FLOAT.itemsize
    a, b, c = (torch.ones(n // 3, dtype=FLOAT, device=device) for _ in range(3))
    src, dst = torch.ones(n // 2, dtype=FLOAT, device=device), torch.empty(n // 2, dtype=FLOAT, device=device)
    whole = torch.ones(n, dtype=FLOAT, device=device)
    moves = {  # kind -> (calls, bytes each moves)
        "triad": ([lambda: torch.add(b, c, alpha=3.0, out=a)], 3 * a.nbytes),
        "copy": ([lambda: dst.copy_(src)], 2 * src.nbytes),
        "read": ([lambda: whole.sum()], whole.nbytes),
        "write": ([lambda: whole.fill_(1.0)] + ([_memset(whole, threads)] if device == "cpu" else []), whole.nbytes),
    }
    timed: dict[str, list[tuple[float, float]]] = {kind: [] for kind in moves}
    for width in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(width)
        for kind, (calls, _) in moves.items():
            timed[kind] += [best_of(call, timer) for call in calls]
    torch.set_num_threads(threads)
    best = {kind: min(found) for kind, found in timed.items()}
    return Bandwidth(size=size, gbps={kind: moves[kind][1] / t / 1e9 for kind, (t, _) in best.items()},
                     spread=max(shortfall for _, shortfall in best.values()))


def flop_rates(device: str, timer: Callable[[Callable[[], object]], float]) -> tuple[dict, dict]:
    """({dtype: best TFLOP/s of torch's matmul}, {dtype: its uncertainty})."""
    rates, spreads = {}, {}
    for name, n in MATMUL_N.items():
        dtype = getattr(torch, name)
        x, y = torch.ones(n, n, dtype=dtype, device=device), torch.ones(n, n, dtype=dtype, device=device)
        out = torch.empty(n, n, dtype=dtype, device=device)
        best, spreads[name] = best_of(functools.partial(torch.mm, x, y, out=out), timer)
        rates[name] = 2 * n ** 3 / best / 1e12
    return rates, spreads


def _cpu() -> Limits:
    start, threads = time.perf_counter(), torch.get_num_threads()
    found = [bandwidth(size, "cpu", _cpu_timer, threads) for size in sizes(last_level_cache())]
    rates, spreads = flop_rates("cpu", _cpu_timer)
    return Limits(device="cpu", name=_cpu_name(), threads=threads, bandwidth=found, tflops=rates,
                  tflops_spread=spreads, measured=time.time(), seconds=time.perf_counter() - start)


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return os.uname().machine


def _cuda_timer(call: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _cuda() -> Limits:
    start = time.perf_counter()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    found = [bandwidth(size, "cuda", _cuda_timer, 1) for size in sizes(l2) if size >= 1 << 20]
    rates, spreads = flop_rates("cuda", _cuda_timer)
    name = torch.cuda.get_device_name()
    return Limits(device="cuda", name=name, bandwidth=found, tflops=rates, tflops_spread=spreads,
                  datasheet=datasheet(name), measured=time.time(), seconds=time.perf_counter() - start)
