"""Inputs: the initial content of the kernel's buffers: In and InOut tensors from their init_value, each
under its own seed (stages.spec_seed), or read from the case's data directory; and Outs that declare an
init_value (an Out without one has no content: the kernel gets it filled with the canary)."""
import torch

from ..model.outputs import InputsMeta, Upstream
from ..planning import data
from . import Outputs, make, stamped_specs


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi = upstream.abi
    specs = stamped_specs(case, abi)
    if case.inputs_from is not None:  # checked against the specs when planned
        tensors = {s.name: data.read(case.inputs_from, "in", s.name).contiguous()
                   for s in specs if s.is_input and not s.by_value}
        return made(specs, tensors, plan.seed)
    return generated(specs, plan.seed)


def generated(specs: list, seed: int) -> Outputs:
    """The initial tensors of the (stamped) specs, each from its init_value under `seed`."""
    return made(specs, {s.name: make(s, seed) for s in specs if s.is_input and not s.by_value}, seed)


def made(specs: list, tensors: dict, seed: int) -> Outputs:
    """The inputs `tensors`, with the initialised Outs made under `seed` and the scalars (a scalar is In: the
    ABI stage refuses any other direction)."""
    outs = {s.name: make(s, seed) for s in specs if s.direction == "out" and s.initialised}
    scalars = {s.name: s.value for s in specs if s.by_value}
    return Outputs(tensors={**tensors, **outs}, meta=InputsMeta(scalars=scalars, nonfinite=nonfinite(tensors)))


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
