"""The pipeline's stages, one module each, and the helpers they share.

Every stage module exposes `run(case, plan, workdir, upstream) -> Outputs`,
where `plan` is its view of the plan (plan.StagePlan) and `upstream` holds the
Outputs of each stage it reads (model.outputs.Upstream; pipeline.stage_table
declares what each stage reads and which module computes it). A
stage knows nothing about doit or the store; a FAIL verdict is a raised
StageFailed.

Imports: model, storage, project, forms, planning.
"""
import dataclasses
import time
from pathlib import Path

from ..model.errors import StageFailed  # the stages' failure type, for their callers
from ..model.outputs import Outputs  # what they return
from ..model.plan import BenchSettings
from ..model.records import Timing
from ..model.rows import ParamRow


def adaptive_rounds(call, rule: BenchSettings, before=None, agree=None, clock=time.perf_counter, timer=None,
                    after=None, marked=None) -> tuple:
    """Time `call` as `rule` says: (round times in microseconds, why it stopped: "noise", "budget" or
    "rounds", the warmup calls made). `before(i)` runs before every call and `after(i)` after it (i:
    the timed round's index, None for a warmup call), then `agree(us, elapsed_s)`, all outside its
    time; `agree` returns the values every rank decides on (the slowest rank's round and elapsed time,
    for several ranks), so that all ranks make the same calls. `timer(call)` times one call in
    microseconds when the clock cannot (a GPU's events); the budget is kept on `clock`. `marked("start")`
    and `marked("end")` bracket the timed rounds."""
    least, most, target, budget = rule.bounds
    start, warmed = clock(), 0
    while warmed < rule.warmup:
        if before:
            before(None)
        call()
        if after:
            after(None)
        warmed += 1
        _, elapsed = agree(0.0, clock() - start) if agree else (0.0, clock() - start)
        if elapsed > budget / 4:
            break
    if marked:
        marked("start")
    times, decided, start, stopped = [], _RunningMean(), clock(), "rounds"
    while len(times) < most:
        if before:
            before(len(times))
        if timer:
            times.append(timer(call))
        else:
            t0 = clock()
            call()
            times.append((clock() - t0) * 1e6)
        if after:
            after(len(times) - 1)
        us, elapsed = agree(times[-1], clock() - start) if agree else (times[-1], clock() - start)
        decided.add(us)
        if decided.count >= least and (decided.rse <= target or elapsed >= budget):
            stopped = "noise" if decided.rse <= target else "budget"
            break
    if marked:
        marked("end")
    return times, stopped, warmed


def cuda_timer():
    """Times one call with CUDA events (the GPU's own clock), in microseconds."""
    import torch  # noqa: PLC0415

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timer(call) -> float:
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3
    return timer


class _RunningMean:
    """The mean and relative standard error of a growing series, updated in O(1) per value (Welford),
    so that testing the stopping rule after every round costs no more at round 10000 than at round 10
    (recomputing them over all rounds made the test, not the kernel, fill the budget)."""

    def __init__(self):
        self.count, self.mean, self._squares = 0, 0.0, 0.0

    def add(self, value: float):
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self._squares += delta * (value - self.mean)

    @property
    def rse(self) -> float:
        """As model.records.relative_standard_error."""
        if self.count < 2 or self.mean <= 0:
            return float("inf")
        return (self._squares / (self.count - 1)) ** 0.5 / self.count ** 0.5 / self.mean


# A rank is persistently slower when it is the slowest in this share of at least this many rounds and
# its median exceeds the fastest rank's by this factor (noise alone rarely does all three).
IMBALANCE_SHARE, IMBALANCE_ROUNDS, IMBALANCE_RATIO = 0.75, 10, 1.10


def rank_stats(per_rank: list, placed: list) -> Timing:
    """The timing of the rounds (the slowest rank's time in each), where rank 0 measured it and, for several
    ranks, each rank's own timing, how many rounds it was the slowest in and the tensors it placed, and a
    load imbalance (or None). `per_rank`: time_kernel's answer of each rank."""
    first = per_rank[0]
    rounds = [max(times) for times in zip(*(r["times"] for r in per_rank))]
    timing = dataclasses.replace(Timing.of_rounds(rounds, first["stopped"], first["warmup"]), cpu=first["cpu"],
                                 **first["where"])
    if len(per_rank) == 1:
        return timing
    slowest = [max(range(len(per_rank)), key=lambda r: times[r]) for times in zip(*(r["times"] for r in per_rank))]
    ranks = [dataclasses.replace(Timing.of_rounds(r["times"], r["stopped"], r["warmup"]),
                                 slowest_rounds=slowest.count(i), placed=placed[i]) for i, r in enumerate(per_rank)]
    return dataclasses.replace(timing, ranks=ranks, imbalance=imbalance(ranks))


def imbalance(ranks: list) -> str:
    """Why the ranks (rank_stats' Timing of each) look imbalanced (one is persistently the slowest), or None."""
    medians = [r.median for r in ranks]
    worst = max(range(len(ranks)), key=lambda r: ranks[r].slowest_rounds)
    share = ranks[worst].slowest_rounds / ranks[worst].rounds
    ratio = medians[worst] / max(min(medians), 1e-9)
    if share >= IMBALANCE_SHARE and ranks[worst].rounds >= IMBALANCE_ROUNDS and ratio >= IMBALANCE_RATIO:
        return (f"rank {worst} was the slowest in {share:.0%} of the rounds; "
                f"its median is {ratio:.2f}x the fastest rank's")
    return None


def measure(call, rule: BenchSettings, before=None) -> Timing:
    """The timing of `call`, timed as `rule` says (adaptive_rounds)."""
    return Timing.of_rounds(*adaptive_rounds(call, rule, before))


def _last_level_cache_bytes() -> int:
    """The CPU's largest cache (sysfs), or 64 MiB when it cannot be read."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 * 2**20)


def cache_flush(device: str):
    """A function that evicts the last-level cache of `device` ("cpu": the CPU's; "cuda": the GPU's L2)
    by writing a buffer twice its size, for a timing whose every round should start cold."""
    import torch  # noqa: PLC0415

    if device == "cuda":
        size = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    else:
        size = _last_level_cache_bytes()
    buffer = torch.zeros(2 * size // 4, dtype=torch.int32, device=device)
    return lambda: buffer.add_(1)


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
    from ..model.specs import stamp_all  # noqa: PLC0415

    return stamp_all(case.specs, abi.meta.table)


def load_checked(compiled: Outputs, abi: Outputs):
    """The artifact, refused if its embedded parameter table is not the checked one."""
    from ..forms.base import Artifact  # noqa: PLC0415

    meta = compiled.meta
    artifact = Artifact.restore(meta.backend, meta.table, compiled.files, meta.module)
    if len(artifact.table) != len(abi.meta.table) or not all(map(ParamRow.serves, artifact.table, abi.meta.table)):
        diffs = [f"{a.to_json()} != {b.to_json()}" for a, b in zip(artifact.table, abi.meta.table) if not a.serves(b)]
        raise StageFailed("artifact parameter table differs from the ABI-checked one:\n  "
                          + "\n  ".join(diffs or ["different parameter count"]))
    return artifact


