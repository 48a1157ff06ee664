"""The pipeline's stages, one module each, and the helpers they share.

Every stage module exposes `run(case, plan, workdir, **upstream) -> Outputs`,
where `plan` is its view of the plan (plan.StagePlan) and `upstream` maps each
stage it reads to that stage's Outputs (golden_tasks.outputs declares them). A
stage knows nothing about doit or the store; a FAIL verdict is a raised
StageFailed.
"""
import statistics
import time

from ..errors import StageFailed  # the stages' failure type, for their callers
from ..outputs import Outputs  # what they return


def kernel_args(table: list, inputs: Outputs) -> list:
    """Fresh positional arguments in table order: clones of In/InOut tensors,
    zeros for pure Outs (their init_value reaches only the golden), scalar values."""
    import torch  # noqa: PLC0415

    from ..specs import dtype_of  # noqa: PLC0415

    args = []
    for row in table:
        if row["kind"] == "scalar":
            args.append(inputs.meta.scalars[row["name"]])
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


def measure(call, warmup: int, rounds: int) -> dict:
    """min / median / mean / max wall time of `call` in microseconds, with rounds and warmup."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return {"min": min(times), "median": statistics.median(times), "mean": statistics.fmean(times),
            "max": max(times), "rounds": rounds, "warmup": warmup}


def spec_seed(seed: int, name: str) -> int:
    """Each spec's own seed: from the case's seed and the spec's name, so a tensor is the same in any
    process and independent of the other specs."""
    import xxhash  # noqa: PLC0415

    return xxhash.xxh64_intdigest(f"{seed}:{name}".encode()) & 0x7FFF_FFFF_FFFF_FFFF


def make(spec, seed: int):
    """The spec's initial tensor, seeded."""
    import torch  # noqa: PLC0415

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec_seed(seed, spec.name))
        return spec.make()


def stamped_specs(case, abi: Outputs) -> list:
    """The case's specs with the directions the ABI stage stamped."""
    from ..specs import stamp_all  # noqa: PLC0415

    return stamp_all(case.specs, abi.meta.table)


def load_checked(compiled: Outputs, abi: Outputs):
    """The artifact, refused if its embedded parameter table is not the checked one."""
    from ..forms import Artifact  # noqa: PLC0415

    meta = compiled.meta
    artifact = Artifact.restore(meta.backend, meta.table, compiled.files, meta.module)
    if artifact.table != abi.meta.table:
        diffs = [f"{a} != {b}" for a, b in zip(artifact.table, abi.meta.table) if a != b]
        raise StageFailed("artifact parameter table differs from the ABI-checked one:\n  "
                          + "\n  ".join(diffs or ["different parameter count"]))
    return artifact


def on_device(artifact, args: list) -> list:
    """The arguments with every tensor on the artifact's device (the same tensor when already there)."""
    return [a.to(artifact.device) if hasattr(a, "to") else a for a in args]


def back_to_host(args: list, moved: list) -> None:
    """Copy what the kernel left in its device arguments back into `args` (In tensors too, so that
    a write to one is seen)."""
    for arg, result in zip(args, moved):
        if result is not arg:
            arg.copy_(result)
