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


def same_bits(a, b) -> bool:
    """Bitwise equality of two tensors of one dtype and shape (a NaN equals itself)."""
    import torch  # noqa: PLC0415

    return a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


def adaptive_rounds(call, warmup: int, min_rounds: int, max_rounds: int, target_rse: float, budget_s: float,
                    before=None, agree=None, clock=time.perf_counter) -> tuple[list, str]:
    """Time `call` after `warmup` untimed calls until the relative standard error of the mean round
    falls to `target_rse` (at least `min_rounds` rounds), or `budget_s` seconds of timing are spent,
    or `max_rounds` rounds are done: (round times in microseconds, why it stopped: "noise",
    "budget" or "rounds"). `before()` runs before each timed call and `agree(us, elapsed_s)` after it,
    both outside its time; `agree` returns the values every rank decides on (the slowest rank's round
    and elapsed time, for several ranks), so that all ranks stop after the same round."""
    for _ in range(warmup):
        call()
    times, decided, start = [], [], clock()
    while len(times) < max_rounds:
        if before:
            before()
        t0 = clock()
        call()
        times.append((clock() - t0) * 1e6)
        us, elapsed = agree(times[-1], clock() - start) if agree else (times[-1], clock() - start)
        decided.append(us)
        if len(decided) >= min_rounds:
            if relative_standard_error(decided) <= target_rse:
                return times, "noise"
            if elapsed >= budget_s:
                return times, "budget"
    return times, "rounds"


def relative_standard_error(times: list) -> float:
    """The standard error of the mean over the mean (inf for fewer than two rounds or a zero mean)."""
    mean = statistics.fmean(times)
    if len(times) < 2 or mean <= 0:
        return float("inf")
    return statistics.stdev(times) / len(times) ** 0.5 / mean


def summary(times: list, warmup: int) -> dict:
    """min / median / mean / max, std, IQR, the noise floor reached (relative standard error of the
    mean) and the outliers (beyond 1.5 IQR of the quartiles: reported, never dropped), with rounds
    and warmup."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    fence = 1.5 * (q3 - q1)
    return {"min": min(times), "median": statistics.median(times), "mean": statistics.fmean(times),
            "max": max(times), "std": statistics.stdev(times) if len(times) > 1 else 0.0, "iqr": q3 - q1,
            "rse": rse if (rse := relative_standard_error(times)) != float("inf") else None,
            "outliers": [t for t in times if t < q1 - fence or t > q3 + fence],
            "rounds": len(times), "warmup": warmup}


def measure(call, warmup: int, rounds: int) -> dict:
    """The summary of timing `call` for exactly `rounds` rounds (adaptive_rounds)."""
    return summary(adaptive_rounds(call, warmup, rounds, rounds, 0.0, float("inf"))[0], warmup)


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
