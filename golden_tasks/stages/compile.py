"""Compile: the kernel form builds its artifact for the stamped specs (a multi-rank kernel: for
what each rank receives, Spec.rank_view)."""
from ..model.errors import CompileError
from ..model.outputs import CompileMeta, Upstream
from . import Outputs, StageFailed, stamped_specs


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi = upstream.abi
    options = {**plan.options, "backend": plan.backend, "ranks": plan.ranks}
    try:
        artifact = case.kernel.compile([s.rank_view() for s in stamped_specs(case, abi)], options, workdir)
    except CompileError as exc:
        raise StageFailed(f"compile failed for {plan.case}: {exc}") from exc
    return Outputs(files=artifact.files, meta=CompileMeta(backend=artifact.backend, module=type(artifact).__module__,
                                                          table=artifact.table, device=artifact.device,
                                                          config=artifact.config()))
