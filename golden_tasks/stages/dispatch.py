"""Dispatch: run the compiled artifact once on fresh copies of the inputs, in a child process.

A crash or a hang fails this stage only (golden_tasks.isolate); outputs come
back through shared memory between canary guards, so an out-of-bounds write
that does not crash is caught too. An artifact this machine cannot run (a CUDA
kernel without a GPU) is skipped with the reason, never passed.
"""
from .. import isolate
from ..forms import Artifact
from . import Outputs, StageFailed, check_inputs_untouched, kernel_args


def load_checked(compiled, abi) -> Artifact:
    """The artifact, refused if its embedded parameter table is not the checked one."""
    artifact = Artifact.restore(compiled.meta["backend"], compiled.meta["table"], compiled.files,
                                compiled.meta["module"])
    if artifact.table != abi.meta["table"]:
        diffs = [f"{a} != {b}" for a, b in zip(artifact.table, abi.meta["table"]) if a != b]
        raise StageFailed("artifact parameter table differs from the ABI-checked one:\n  "
                          + "\n  ".join(diffs or ["different parameter count"]))
    return artifact


def on_device(artifact: Artifact, args: list) -> list:
    """The arguments with every tensor on the artifact's device (the same tensor when already there)."""
    return [a.to(artifact.device) if hasattr(a, "to") else a for a in args]


def back_to_host(args: list, moved: list) -> None:
    """Copy what the kernel left in its device arguments back into `args` (In tensors too, so that
    a write to one is seen)."""
    for arg, result in zip(args, moved):
        if result is not arg:
            arg.copy_(result)


def call_kernel(artifact: Artifact, args: list) -> None:
    """Runs in the child: load the artifact there, call it once, outputs back into `args`."""
    moved = on_device(artifact, args)
    artifact.load()(*moved)
    back_to_host(args, moved)


def run(case, plan, workdir, abi, compile, inputs):
    table = abi.meta["table"]
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable():
        return Outputs(meta={"skipped": reason})
    args = kernel_args(table, inputs)
    guarded = {i: isolate.Guarded(row["name"], args[i]) for i, row in enumerate(table)
               if row["kind"] == "tensor" and row["direction"] != "in"}
    for i, g in guarded.items():
        args[i] = g.tensor
    isolate.call(call_kernel, (artifact, args), plan["timeout"], f"the kernel of {plan['case']}")
    check_inputs_untouched(table, args, inputs, f"the kernel of {plan['case']}")
    clobbered = [f"{g.name} ({side})" for g in guarded.values() for side in g.clobbered()]
    if clobbered:
        raise StageFailed(f"the kernel of {plan['case']} wrote outside its outputs: the guard region "
                          f"{' and '.join(clobbered)} lost its canary "
                          "(before: below the first element, after: past the last)")
    return Outputs(tensors={g.name: g.tensor.clone() for g in guarded.values()})
