"""Compile: the kernel form builds its artifact for the stamped specs."""
from ..errors import CompileError
from ..specs import stamp_all
from . import Outputs, StageFailed


def run(case, plan, workdir, abi):
    specs = stamp_all(case.specs, abi.meta["table"])
    options = {**plan["options"], "backend": plan["backend"]}
    try:
        artifact = case.kernel.compile(specs, options, workdir)
    except CompileError as exc:
        raise StageFailed(f"compile failed for {plan['case']}: {exc}") from exc
    return Outputs(files=artifact.files, meta={"backend": artifact.backend, "module": type(artifact).__module__,
                                               "table": artifact.table})
