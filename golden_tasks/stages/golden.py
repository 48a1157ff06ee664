"""Golden: the reference function fills its own output buffers from the inputs.

It receives a dict keyed by spec name: clones of the inputs, its own output
buffers (InOut initial values; Out from init_value or zeros), scalars as Python
values (a scalar is In: the ABI stage refuses any other direction, so it is never
an output). A golden that leaves a pure Out untouched fails here, rather than as a
kernel mismatch against the untouched buffer. golden_bench times it on the same
inputs, for the report's speedup.
"""
from ..model.origin import described
from ..model.outputs import GoldenMeta, Upstream
from ..planning import data
from ..storage.tensors import same_bits
from . import Outputs, StageFailed, make, stamped_specs

NO_GOLDEN = "no golden: validation skipped, not a correctness check"


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi, inputs = upstream.abi, upstream.inputs
    if case.golden_from is not None:  # saved goldens take precedence over the function
        return Outputs(tensors={s.name: data.read(case.golden_from, "out", s.name).contiguous()
                                for s in stamped_specs(case, abi) if s.is_output})
    if case.golden is None:
        return Outputs(meta=GoldenMeta(skipped=NO_GOLDEN))
    with flop_counter() as counted:
        tensors = outputs_of(case, plan.case, plan.seed, abi, inputs)
    return Outputs(tensors=tensors, meta=GoldenMeta(flops=counted.get_total_flops()))


def flop_counter():
    """torch's FLOP counter, knowing the attention a CPU runs too (torch counts the GPU's kernels only)."""
    import torch  # noqa: PLC0415
    from torch.utils import flop_counter  # noqa: PLC0415

    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs):
        return flop_counter.sdpa_flop_count(query, key, value)
    return flop_counter.FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention})


def arguments(case, seed: int, abi, inputs) -> dict:
    """The golden's argument dict: clones of the inputs, its own output buffers (InOut from the
    inputs, Out from init_value, as the kernel's, or zeros), scalars as Python values."""
    def tensor_for(s):
        return inputs.tensors[s.name].clone() if s.name in inputs.tensors else make(s, seed)
    return {s.name: s.argument(tensor_for) for s in stamped_specs(case, abi)}


def outputs_of(case, name: str, seed: int, abi, inputs) -> dict:
    """The golden's output tensors: the golden of case `name` run once on `inputs` (Out buffers made
    under `seed`); StageFailed if it raises or leaves a pure Out untouched."""
    specs = stamped_specs(case, abi)
    args = arguments(case, seed, abi, inputs)
    buffers = {s.name: (args[s.name], args[s.name]._version, args[s.name].clone())
               for s in specs if s.direction == "out"}
    try:
        case.golden(args)
    except Exception as exc:
        raise StageFailed(f"golden of {name} raised {described(exc)}") from exc
    untouched = [out for out, (buffer, version, initial) in buffers.items()
                 if args[out] is buffer and buffer._version == version and same_bits(buffer, initial)]
    if untouched:
        raise StageFailed(f"golden of {name} never wrote its output {', '.join(map(repr, untouched))}: "
                          "it still holds its initial value (write it in place, e.g. t['out'].copy_(...))")
    return {s.name: args[s.name].clone() for s in specs if s.is_output}
