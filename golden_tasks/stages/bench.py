"""Bench: warmup then timed rounds of the kernel on the cached inputs.

Runs after validate: rounds mutate Out/InOut buffers in place.
"""
import statistics
import time

from . import Outputs, kernel_args
from .dispatch import load_checked


def measure(call, warmup: int, rounds: int) -> dict:
    """min / median / mean / max wall time of `call` in microseconds."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return {"min": min(times), "median": statistics.median(times), "mean": statistics.fmean(times),
            "max": max(times), "rounds": rounds, "warmup": warmup}


def run(case, plan, workdir, abi, compile, inputs):
    kernel = load_checked(compile, abi).load()
    args = kernel_args(abi.meta["table"], inputs)
    return Outputs(stats={"kernel_us": measure(lambda: kernel(*args), **plan["bench"])})
