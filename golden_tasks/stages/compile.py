"""Compile: the kernel form builds its artifact for the stamped specs."""
from ..errors import CompileError
from ..outputs import CompileMeta
from . import Outputs, StageFailed, stamped_specs


def run(case, plan, workdir, abi):
    options = {**plan.options, "backend": plan.backend}
    try:
        artifact = case.kernel.compile(stamped_specs(case, abi), options, workdir)
    except CompileError as exc:
        raise StageFailed(f"compile failed for {plan.case}: {exc}") from exc
    return Outputs(files=artifact.files, meta=CompileMeta(backend=artifact.backend,
                                                          module=type(artifact).__module__, table=artifact.table))
