"""Dispatch: run the compiled artifact once on fresh copies of the inputs, in a child process per rank.

A crash or a hang fails this stage only (golden_tasks.forms.isolate); outputs come
back through shared memory between canary guards, so an out-of-bounds write
that does not crash is caught too. A multi-rank kernel runs as one pool of rank
processes (golden_tasks.forms.ranks), each with its view of the parameters. An
artifact this machine cannot run (a CUDA kernel without a GPU) is skipped with
the reason, never passed.
"""
from ..forms import ranks
from ..model.outputs import Meta
from . import Outputs, load_checked


def call_kernel(kernel, args: list, rank) -> None:
    """Runs in each rank: call the kernel once."""
    kernel(*args)


def run(case, plan, workdir, abi, compile, inputs):
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable() or ranks.unavailable(artifact, plan.ranks):
        return Outputs(meta=Meta(skipped=reason))
    what = f"the kernel of {plan.case}"
    placement = ranks.Placement(abi.meta.table, abi.meta.placement, inputs, plan.ranks)
    ranks.run(call_kernel, artifact, placement, plan.timeout, 1, what)
    placement.check_inputs_untouched(inputs, what)
    placement.check_guards(what)
    return Outputs(tensors=placement.outputs(what))
