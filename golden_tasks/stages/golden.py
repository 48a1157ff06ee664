"""Golden: the reference function fills its own output buffers from the inputs.

It receives a dict keyed by spec name: clones of the inputs, its own output
buffers (InOut initial values; Out from init_value or zeros), scalars as Python
values. It is timed on the same inputs for the report's speedup.
"""
from .. import data
from ..specs import stamp_all
from . import Outputs, StageFailed
from .bench import measure
from .inputs import make


def run(case, plan, workdir, abi, inputs):
    if case.golden_from is not None:  # saved goldens take precedence over the function
        specs = stamp_all(case.specs, abi.meta["table"])
        return Outputs(tensors={s.name: data.read(case.golden_from, "out", s.name).contiguous()
                                for s in specs if s.kind == "tensor" and s.is_output})
    if case.golden is None:
        return Outputs(meta={"skipped": "no golden: validation skipped, not a correctness check"})
    specs = stamp_all(case.specs, abi.meta["table"])
    args = {}
    for s in specs:
        if s.kind == "scalar":
            args[s.name] = inputs.meta["scalars"][s.name]
        elif s.is_input:
            args[s.name] = inputs.tensors[s.name].clone()
        else:
            args[s.name] = make(s, plan["seed"])
    try:
        case.golden(args)
    except Exception as exc:
        raise StageFailed(f"golden of {plan['case']} raised {type(exc).__name__}: {exc}") from exc
    outputs = {s.name: args[s.name].clone() for s in specs if s.kind == "tensor" and s.is_output}
    timing = measure(lambda: case.golden(args), **plan["bench"])
    return Outputs(tensors=outputs, stats={"golden_us": timing})
