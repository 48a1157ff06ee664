"""Golden: the reference function fills its own output buffers from the inputs.

It receives a dict keyed by spec name: clones of the inputs, its own output
buffers (InOut initial values; Out from init_value or zeros), scalars as Python
values. A golden that leaves a pure Out untouched fails here, rather than as a
kernel mismatch against the untouched buffer. It is timed on the same inputs
for the report's speedup.
"""
from .. import data
from ..outputs import Meta, Stats
from . import Outputs, StageFailed, make, measure, same_bits, stamped_specs


def run(case, plan, workdir, abi, inputs):
    if case.golden_from is not None:  # saved goldens take precedence over the function
        return Outputs(tensors={s.name: data.read(case.golden_from, "out", s.name).contiguous()
                                for s in stamped_specs(case, abi) if s.kind == "tensor" and s.is_output})
    if case.golden is None:
        return Outputs(meta=Meta(skipped="no golden: validation skipped, not a correctness check"))
    specs = stamped_specs(case, abi)
    args = {}
    for s in specs:
        if s.kind == "scalar":
            args[s.name] = inputs.meta.scalars[s.name]
        elif s.is_input:
            args[s.name] = inputs.tensors[s.name].clone()
        else:
            args[s.name] = make(s, plan.seed)
    buffers = {s.name: (args[s.name], args[s.name]._version, args[s.name].clone())
               for s in specs if s.kind == "tensor" and s.direction == "out"}
    try:
        case.golden(args)
    except Exception as exc:
        raise StageFailed(f"golden of {plan.case} raised {type(exc).__name__}: {exc}") from exc
    untouched = [name for name, (buffer, version, initial) in buffers.items()
                 if args[name] is buffer and buffer._version == version and same_bits(buffer, initial)]
    if untouched:
        raise StageFailed(f"golden of {plan.case} never wrote its output {', '.join(map(repr, untouched))}: "
                          "it still holds its initial value (write it in place, e.g. t['out'].copy_(...))")
    outputs = {s.name: args[s.name].clone() for s in specs if s.kind == "tensor" and s.is_output}
    timing = measure(lambda: case.golden(args), **plan.bench)
    return Outputs(tensors=outputs, stats=Stats(golden_us=timing))
