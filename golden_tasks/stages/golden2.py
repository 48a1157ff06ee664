"""Golden2: the golden on the second input set (inputs2), for the benchmark's recheck (bench).

Saved goldens (golden_from) exist for the first set only: skipped, with the reason.
"""
from ..model.outputs import Meta, Upstream
from . import Outputs
from .golden import NO_GOLDEN, outputs_of


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi, inputs2 = upstream.abi, upstream.inputs2
    if reason := inputs2.skipped or (case.golden_from is not None and "its golden comes from a data directory, "
                                     "so there is none for a second input set") or (case.golden is None and NO_GOLDEN):
        return Outputs(meta=Meta(skipped=reason))
    return Outputs(tensors=outputs_of(case, plan.case, plan.seed + 1, abi, inputs2))
