"""Inputs2: a second input set, the first's specs under seed + 1, for the benchmark's recheck (bench).

Cases whose inputs come from a data directory have no second set: skipped, with the reason.
"""
from ..outputs import InputsMeta
from . import Outputs, stamped_specs
from .inputs import generated


def run(case, plan, workdir, abi):
    if case.inputs_from is not None:
        return Outputs(meta=InputsMeta(skipped="its inputs come from a data directory, so there is no second set"))
    return generated(stamped_specs(case, abi), plan.seed + 1)
