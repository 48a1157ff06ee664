"""Dispatch: run the compiled artifact once on fresh copies of the inputs, in a child process.

A crash or a hang fails this stage only (golden_tasks.isolate); outputs come
back through shared memory between canary guards, so an out-of-bounds write
that does not crash is caught too. An artifact this machine cannot run (a CUDA
kernel without a GPU) is skipped with the reason, never passed.
"""
from .. import isolate
from ..outputs import Meta
from . import Outputs, StageFailed, back_to_host, check_inputs_untouched, kernel_args, load_checked, on_device


def call_kernel(artifact, args: list) -> None:
    """Runs in the child: load the artifact there, call it once, outputs back into `args`."""
    moved = on_device(artifact, args)
    artifact.load()(*moved)
    back_to_host(args, moved)


def run(case, plan, workdir, abi, compile, inputs):
    if plan.ranks > 1:  # never run a multi-rank kernel as one process: that could pass wrongly
        raise StageFailed(f"{plan.case}: multi-rank dispatch (ranks={plan.ranks}) is not available yet")
    table = abi.meta.table
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable():
        return Outputs(meta=Meta(skipped=reason))
    args = kernel_args(table, inputs)
    guarded = {i: isolate.Guarded(row["name"], args[i]) for i, row in enumerate(table)
               if row["kind"] == "tensor" and row["direction"] != "in"}
    for i, g in guarded.items():
        args[i] = g.tensor
    isolate.call(call_kernel, (artifact, args), plan.timeout, f"the kernel of {plan.case}")
    check_inputs_untouched(table, args, inputs, f"the kernel of {plan.case}")
    clobbered = [f"{g.name} ({side})" for g in guarded.values() for side in g.clobbered()]
    if clobbered:
        raise StageFailed(f"the kernel of {plan.case} wrote outside its outputs: the guard region "
                          f"{' and '.join(clobbered)} lost its canary "
                          "(before: below the first element, after: past the last)")
    return Outputs(tensors={g.name: g.tensor.clone() for g in guarded.values()})
