"""Inputs: In and InOut tensors from their init_value, each under its own seed.

Each spec's seed derives from the case seed and the spec's name, so a tensor
is bitwise identical in any process and independent of the other specs.
"""
import torch
import xxhash

from .. import data
from ..specs import stamp_all
from . import Outputs


def spec_seed(seed: int, name: str) -> int:
    return xxhash.xxh64_intdigest(f"{seed}:{name}".encode()) & 0x7FFF_FFFF_FFFF_FFFF


def make(spec, seed: int) -> torch.Tensor:
    """The spec's initial tensor, seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec_seed(seed, spec.name))
        return spec.make()


def run(case, plan, workdir, abi):
    specs = stamp_all(case.specs, abi.meta["table"])
    if case.inputs_from is not None:  # checked against the specs when planned
        tensors = {s.name: data.read(case.inputs_from, "in", s.name).contiguous()
                   for s in specs if s.kind == "tensor" and s.is_input}
    else:
        tensors = {s.name: make(s, plan["seed"]) for s in specs if s.kind == "tensor" and s.is_input}
    scalars = {s.name: s.value for s in specs if s.kind == "scalar"}
    return Outputs(tensors=tensors, meta={"scalars": scalars, "nonfinite": nonfinite(tensors)})


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
