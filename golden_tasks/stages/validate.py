"""Validate: every output against its golden, with the case's policy.

The policy is also saved (cloudpickle, user code by value) so that a
runtime dir can be re-validated without importing the kernel module.
"""
from ..compare import Policy
from ..fingerprint import dumps_by_value
from . import Outputs, StageFailed


def save_policy(policy: Policy, path):
    path.write_bytes(dumps_by_value(policy))  # comparators defined beside the kernel travel with it
    return path


def judge(policy: Policy, actual: dict, expected: dict, case: str, nonfinite: dict = None) -> dict:
    """The validation report; raises StageFailed naming every mismatching output, and every
    input that holds NaN/Inf (`nonfinite`: name -> description), a likely cause."""
    results = policy.check(actual, expected)
    failed = [r.message for r in results if not r.passed]
    if failed:
        causes = [f"note: input {name!r} holds {what}; it may propagate to the outputs"
                  for name, what in (nonfinite or {}).items()]
        raise StageFailed(f"validation FAILED for {case}:\n" + "\n".join(failed + causes))
    return {"status": "pass", "outputs": [r.to_json() for r in results],
            "max_abs": max((r.max_abs for r in results), default=0.0)}


def run(case, plan, workdir, dispatch, golden, inputs):
    for upstream in (golden, dispatch):  # no golden, or no device to dispatch on
        if "skipped" in upstream.meta:
            return Outputs(meta={"status": "skipped", "reason": upstream.meta["skipped"]})
    unknown = sorted(set(case.compare) - set(golden.tensors))
    if unknown:
        raise StageFailed(f"{plan['case']}: compare names {', '.join(unknown)}, which are not outputs "
                          f"(outputs: {', '.join(golden.tensors)})")
    policy = Policy(case.rtol, case.atol, case.ignore_nan, case.compare)
    meta = judge(policy, dispatch.tensors, golden.tensors, plan["case"], inputs.meta.get("nonfinite"))
    return Outputs(files={"policy.pkl": save_policy(policy, workdir / "policy.pkl")}, meta=meta)
