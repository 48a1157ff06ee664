"""Dispatch: run the compiled artifact once on fresh copies of the inputs, in a child process per rank.

A crash or a hang fails this stage only (golden_tasks.forms.isolate); outputs come
back through shared memory between canary guards, so an out-of-bounds write
that does not crash is caught too. A multi-rank kernel runs as one pool of rank
processes (golden_tasks.forms.ranks), each with its view of the parameters. An
artifact this machine cannot run (a CUDA kernel without a GPU) is skipped with
the reason, never passed.
"""
import torch

from ..forms import ranks
from ..model.outputs import DispatchMeta, Upstream
from . import Outputs, load_checked


def call_kernel(kernel, args: list, rank) -> str | None:
    """Runs in each rank: call the kernel once; what it returned that is none of its arguments, described
    (a launcher that returns its result, as Triton's tutorials' wrappers do), else None."""
    return returned_anew(kernel(*args), args)


def returned_anew(value, args: list) -> str | None:
    """`value` (what a kernel call returned), described where it holds a tensor that shares no storage
    with any of `args`."""
    tensors = [value] if isinstance(value, torch.Tensor) else [v for v in value if isinstance(v, torch.Tensor)] \
        if isinstance(value, (tuple, list)) else []
    ours = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    new = [t for t in tensors if t.untyped_storage().data_ptr() not in ours]
    return ", ".join(f"a new {str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"
                     for t in new) or None


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi, compile, inputs = upstream.abi, upstream.compile, upstream.inputs
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable() or ranks.unavailable(artifact, plan.ranks):
        return Outputs(meta=DispatchMeta(skipped=reason))
    what = f"the kernel of {plan.case}"
    placement = ranks.Placement(abi.meta.table, abi.meta.placement, inputs, plan.ranks)
    results = ranks.run(call_kernel, artifact, placement, plan.timeout, 1, what)
    placement.check_inputs_untouched(inputs, what)
    placement.check_guards(what)
    returned = next((r.value for r in results if r.value), None)
    return Outputs(tensors=placement.outputs(what), meta=DispatchMeta(returned=returned))
