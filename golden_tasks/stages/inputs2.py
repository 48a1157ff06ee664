"""Inputs2: the input sets the benchmark adds (bench): a second set, the first's specs under seed + 1,
for its recheck; and UNSEEN_SETS more (seeds + 2, ...), each met by the kernel once, to time it on
inputs it has never seen. The extra sets' tensors are held as `unseen<j>.<name>` (a spec name is an
identifier, so they never collide); `unseen_sets` reads them back.

Cases whose inputs come from a data directory have no second set: skipped, with the reason.
"""
import dataclasses

from ..model.outputs import InputsMeta, Upstream
from . import Outputs, stamped_specs
from .inputs import generated

UNSEEN_SETS = 3


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi = upstream.abi
    if case.inputs_from is not None:
        return Outputs(meta=InputsMeta(skipped="its inputs come from a data directory, so there is no second set"))
    specs = stamped_specs(case, abi)
    second = generated(specs, plan.seed + 1)
    unseen = {f"unseen{j}.{name}": t for j in range(UNSEEN_SETS)
              for name, t in generated(specs, plan.seed + 2 + j).tensors.items()}
    return dataclasses.replace(second, tensors={**second.tensors, **unseen})


def unseen_sets(inputs2: Outputs) -> list:
    """The sets of `inputs2` the kernel is to meet once each, as Outputs like the inputs stage's."""
    found = []
    for j in range(UNSEEN_SETS):
        prefix = f"unseen{j}."
        tensors = {n.removeprefix(prefix): t for n, t in inputs2.tensors.items() if n.startswith(prefix)}
        if tensors:
            found.append(Outputs(tensors=tensors, meta=inputs2.meta))
    return found
