"""The pipeline's stages, one module each.

Every stage module exposes `run(case, plan, workdir, **upstream) -> Outputs`,
where `upstream` maps each stage it reads to that stage's Outputs. A stage
knows nothing about doit or the store; a FAIL verdict is a raised StageFailed.
"""
import dataclasses

from ..errors import StageFailed  # noqa: F401 -- the stages' failure type


@dataclasses.dataclass
class Outputs:
    """What a stage produces: tensors and files (stored as objects), `meta`
    (deterministic, read by downstream keys) and `stats` (timings, informational)."""
    tensors: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)
    meta: dict = dataclasses.field(default_factory=dict)
    stats: dict = dataclasses.field(default_factory=dict)


def kernel_args(table: list, inputs: Outputs) -> list:
    """Fresh positional arguments in table order: clones of In/InOut tensors,
    zeros for pure Outs (their init_value reaches only the golden), scalar values."""
    import torch  # noqa: PLC0415

    from ..specs import dtype_of  # noqa: PLC0415

    args = []
    for row in table:
        if row["kind"] == "scalar":
            args.append(inputs.meta["scalars"][row["name"]])
        elif row["direction"] == "out":
            args.append(torch.zeros(row["shape"], dtype=dtype_of(row["dtype"])))
        else:
            args.append(inputs.tensors[row["name"]].clone())
    return args
