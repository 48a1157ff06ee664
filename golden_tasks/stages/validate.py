"""Validate: every output against its golden, with the case's comparators."""
from ..compare import Policy, allclose
from . import Outputs, StageFailed


def run(case, plan, workdir, dispatch, golden):
    if "skipped" in golden.meta:
        return Outputs(meta={"status": "skipped", "reason": golden.meta["skipped"]})
    unknown = sorted(set(case.compare) - set(golden.tensors))
    if unknown:
        raise StageFailed(f"{plan['case']}: compare names {', '.join(unknown)}, which are not outputs "
                          f"(outputs: {', '.join(golden.tensors)})")
    policy = Policy(case.rtol, case.atol, case.ignore_nan)
    results = [case.compare.get(name, allclose)(name, dispatch.tensors[name], expected, policy)
               for name, expected in golden.tensors.items()]
    failed = [r.message for r in results if not r.passed]
    if failed:
        raise StageFailed(f"validation FAILED for {plan['case']}:\n" + "\n".join(failed))
    return Outputs(meta={"status": "pass", "outputs": [r.to_json() for r in results],
                         "max_abs": max((r.max_abs for r in results), default=0.0)})
