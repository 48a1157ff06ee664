"""The pipeline's stages, one module each.

Every stage module exposes `run(case, plan, workdir, **upstream) -> Outputs`,
where `upstream` maps each stage it reads to that stage's Outputs. A stage
knows nothing about doit or the store; a FAIL verdict is a raised StageFailed.
"""
import dataclasses

from ..errors import StageFailed  # the stages' failure type, for their callers


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


def same_bits(a, b) -> bool:
    """Bitwise equality of two tensors of one dtype and shape (a NaN equals itself)."""
    import torch  # noqa: PLC0415

    return a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


def check_inputs_untouched(table: list, args: list, inputs: Outputs, what: str) -> None:
    """Raise StageFailed naming every In tensor in `args` that no longer holds its input: the kernel
    wrote a parameter it may only read (through a view, a raw pointer, ...)."""
    written = [row["name"] for row, arg in zip(table, args) if row["kind"] == "tensor" and row["direction"] == "in"
               and not same_bits(arg, inputs.tensors[row["name"]])]
    if written:
        raise StageFailed(f"{what} wrote its In parameter {', '.join(map(repr, written))}: inputs are read-only")
