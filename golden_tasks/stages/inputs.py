"""Inputs: In and InOut tensors from their init_value, each under its own seed (stages.spec_seed),
or read from the case's data directory."""
import torch

from .. import data
from ..outputs import InputsMeta
from . import Outputs, make, stamped_specs


def run(case, plan, workdir, abi):
    specs = stamped_specs(case, abi)
    if case.inputs_from is not None:  # checked against the specs when planned
        tensors = {s.name: data.read(case.inputs_from, "in", s.name).contiguous()
                   for s in specs if s.kind == "tensor" and s.is_input}
    else:
        tensors = {s.name: make(s, plan.seed) for s in specs if s.kind == "tensor" and s.is_input}
    scalars = {s.name: s.value for s in specs if s.kind == "scalar"}
    return Outputs(tensors=tensors, meta=InputsMeta(scalars=scalars, nonfinite=nonfinite(tensors)))


def nonfinite(tensors: dict) -> dict:
    """name -> "N NaN/Inf, first at (i, j)" for each floating tensor that holds any: validation
    names them when outputs mismatch, since NaN in an input propagates to the outputs."""
    found = {}
    for name, t in tensors.items():
        if t.is_floating_point() or t.is_complex():
            where = (~torch.isfinite(t)).nonzero()
            if len(where):
                found[name] = f"{len(where)} NaN/Inf, first at {tuple(where[0].tolist())}"
    return found
