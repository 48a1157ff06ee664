"""Compile: the kernel form builds its artifact for the specs stamped with the directions of the table it is
compiled for (Plan.compiled_for; a multi-rank kernel: for what each rank receives, Spec.rank_view)."""
from ..model.errors import CompileError
from ..model.outputs import CompileMeta, Upstream
from ..model.specs import stamp_all
from . import Outputs, StageFailed


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    options = {**plan.options, "backend": plan.backend, "ranks": plan.ranks}
    try:
        artifact = case.kernel.compile([s.rank_view() for s in stamp_all(case.specs, plan.compiled_for)], options,
                                       workdir)
    except CompileError as exc:
        raise StageFailed(f"compile failed for {plan.case}: {exc}") from exc
    return Outputs(files=artifact.files, meta=CompileMeta(backend=artifact.backend, module=type(artifact).__module__,
                                                          table=artifact.table, device=artifact.device,
                                                          config=artifact.config()))
