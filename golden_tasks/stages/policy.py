"""Policy: the case's validation policy (`case.policy()`: a comparator and tolerances per output), saved.

It is saved with its user code by value (cloudpickle: comparators defined beside
the kernel travel with it) as a stage of its own, so that its entry exists
whatever the validation found: validate and the benchmark's recheck judge with
it, a runtime dir keeps it for replays, and a report draws a case's error
figures with it without importing the kernel module.
"""
from ..model.compare import Policy
from ..model.origin import dumps_by_value
from ..model.outputs import POLICY_FILE, Upstream
from . import Outputs


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    saved = workdir / POLICY_FILE
    saved.write_bytes(dumps_by_value(case.policy()))
    return Outputs(files={POLICY_FILE: saved})


def saved_policy(outputs: Outputs) -> Policy:
    """The policy a policy stage's outputs hold. It runs the comparators' user code as it unpickles: only in a
    process that may (an isolated stage, a report's own process)."""
    import cloudpickle  # noqa: PLC0415

    return cloudpickle.loads(outputs.files[POLICY_FILE].read_bytes())
