"""Dispatch: run the compiled artifact once on fresh copies of the inputs."""
from ..forms import Artifact
from . import Outputs, StageFailed, kernel_args


def load_checked(compiled, abi) -> Artifact:
    """The artifact, refused if its embedded parameter table is not the checked one."""
    artifact = Artifact.restore(compiled.meta["backend"], compiled.meta["table"], compiled.files,
                                compiled.meta["module"])
    if artifact.table != abi.meta["table"]:
        diffs = [f"{a} != {b}" for a, b in zip(artifact.table, abi.meta["table"]) if a != b]
        raise StageFailed("artifact parameter table differs from the ABI-checked one:\n  "
                          + "\n  ".join(diffs or ["different parameter count"]))
    return artifact


def run(case, plan, workdir, abi, compile, inputs):
    table = abi.meta["table"]
    kernel = load_checked(compile, abi).load()
    args = kernel_args(table, inputs)
    kernel(*args)
    return Outputs(tensors={row["name"]: arg for row, arg in zip(table, args)
                            if row["kind"] == "tensor" and row["direction"] != "in"})
