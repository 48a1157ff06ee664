"""Bench: warmup then timed rounds of the kernel on the cached inputs, in a child process.

Runs after validate: rounds mutate Out/InOut buffers in place.
"""
import statistics
import time

from .. import isolate
from . import Outputs, check_inputs_untouched, kernel_args
from .dispatch import back_to_host, load_checked, on_device


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


def measure_kernel(artifact, args: list, bench: dict) -> dict:
    """Runs in the child: load the artifact there and time it, its arguments already on its device
    (a CUDA launcher returns when its kernels are done); then what the rounds left goes back to `args`."""
    kernel, moved = artifact.load(), on_device(artifact, args)
    stats = measure(lambda: kernel(*moved), **bench)
    back_to_host(args, moved)
    return stats


def run(case, plan, workdir, abi, compile, inputs):
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable():
        return Outputs(meta={"skipped": reason})
    args = kernel_args(abi.meta["table"], inputs)
    calls = plan["bench"]["warmup"] + plan["bench"]["rounds"]
    # each call may take up to the case's timeout, plus one for loading
    stats = isolate.call(measure_kernel, (artifact, args, plan["bench"]), plan["timeout"] * (calls + 1),
                         f"the benchmark of {plan['case']}")
    # once, after every round: a write to an input in any round persists (unless the kernel undoes it)
    check_inputs_untouched(abi.meta["table"], args, inputs, f"the kernel of {plan['case']} (in its benchmark)")
    return Outputs(stats={"kernel_us": stats})
