"""Bench: warmup then timed rounds of the kernel on the cached inputs, in a child process.

Runs after validate: rounds mutate Out/InOut buffers in place.
"""
from .. import isolate
from ..outputs import Meta, Stats
from . import Outputs, StageFailed, back_to_host, check_inputs_untouched, kernel_args, load_checked, measure, on_device


def measure_kernel(artifact, args: list, bench: dict) -> dict:
    """Runs in the child: load the artifact there and time it, its arguments already on its device
    (a CUDA launcher returns when its kernels are done); then what the rounds left goes back to `args`."""
    kernel, moved = artifact.load(), on_device(artifact, args)
    stats = measure(lambda: kernel(*moved), **bench)
    back_to_host(args, moved)
    return stats


def run(case, plan, workdir, abi, compile, inputs):
    if plan.ranks > 1:  # never run a multi-rank kernel as one process: that could pass wrongly
        raise StageFailed(f"{plan.case}: multi-rank dispatch (ranks={plan.ranks}) is not available yet")
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable():
        return Outputs(meta=Meta(skipped=reason))
    args = kernel_args(abi.meta.table, inputs)
    calls = plan.bench["warmup"] + plan.bench["rounds"]
    # each call may take up to the case's timeout, plus one for loading
    stats = isolate.call(measure_kernel, (artifact, args, plan.bench), plan.timeout * (calls + 1),
                         f"the benchmark of {plan.case}")
    # once, after every round: a write to an input in any round persists (unless the kernel undoes it)
    check_inputs_untouched(abi.meta.table, args, inputs, f"the kernel of {plan.case} (in its benchmark)")
    return Outputs(stats=Stats(kernel_us=stats))
