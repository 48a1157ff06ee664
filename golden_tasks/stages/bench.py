"""Bench: warmup then timed rounds of the kernel on the cached inputs, in a child process per rank.

Runs after validate: rounds mutate Out/InOut buffers in place. A multi-rank
kernel's rounds are bracketed by barriers; each rank times its own call, a
round takes as long as its slowest rank (the critical path), and a rank that is
the slowest round after round is reported as a load imbalance.
"""
import functools

from .. import ranks
from ..outputs import Meta, Stats
from . import Outputs, adaptive_rounds, load_checked, summary

# A rank is persistently slower when it is the slowest in this share of at least this many rounds and
# its median exceeds the fastest rank's by this factor (noise alone rarely does all three).
IMBALANCE_SHARE, IMBALANCE_ROUNDS, IMBALANCE_RATIO = 0.75, 10, 1.10


def time_kernel(kernel, args: list, rank, warmup: int, rounds: int) -> list:
    """Runs in each rank: the kernel's time in each round, in microseconds (several ranks: a barrier
    before each round, and after it an all-reduce that gives every rank the round's slowest time)."""
    several = rank.world > 1
    times, _ = adaptive_rounds(lambda: kernel(*args), warmup, rounds, rounds, 0.0, float("inf"),
                               before=rank.sync if several else None, agree=rank.agree if several else None)
    return times


def rank_stats(per_rank: list, warmup: int, placed: list) -> dict:
    """The timing of the rounds (the slowest rank's time in each) and, for several ranks, each
    rank's own timing, how many rounds it was the slowest in and the tensors it placed, and a
    load imbalance (or None)."""
    rounds = [max(times) for times in zip(*per_rank)]
    stats = summary(rounds, warmup)
    if len(per_rank) == 1:
        return stats
    slowest = [max(range(len(per_rank)), key=lambda r: times[r]) for times in zip(*per_rank)]
    stats["ranks"] = [{**summary(times, warmup), "slowest_rounds": slowest.count(r), "placed": placed[r]}
                      for r, times in enumerate(per_rank)]
    stats["imbalance"] = imbalance(stats["ranks"])
    return stats


def imbalance(ranks_stats: list) -> str:
    """Why the ranks look imbalanced (one is persistently the slowest), or None."""
    medians = [r["median"] for r in ranks_stats]
    worst = max(range(len(ranks_stats)), key=lambda r: ranks_stats[r]["slowest_rounds"])
    share = ranks_stats[worst]["slowest_rounds"] / ranks_stats[worst]["rounds"]
    ratio = medians[worst] / max(min(medians), 1e-9)
    if share >= IMBALANCE_SHARE and ranks_stats[worst]["rounds"] >= IMBALANCE_ROUNDS and ratio >= IMBALANCE_RATIO:
        return (f"rank {worst} was the slowest in {share:.0%} of the rounds; "
                f"its median is {ratio:.2f}x the fastest rank's")
    return None


def run(case, plan, workdir, abi, compile, inputs):
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable() or ranks.unavailable(artifact, plan.ranks):
        return Outputs(meta=Meta(skipped=reason))
    placement = ranks.Placement(abi.meta.table, abi.meta.placement, inputs, plan.ranks)
    calls = plan.bench["warmup"] + plan.bench["rounds"]
    # each call may take up to the case's timeout, plus one for loading
    results = ranks.run(functools.partial(time_kernel, **plan.bench), artifact, placement, plan.timeout, calls + 1,
                        f"the benchmark of {plan.case}")
    # once, after every round: a write to an input in any round persists (unless the kernel undoes it)
    placement.check_inputs_untouched(inputs, f"the kernel of {plan.case} (in its benchmark)")
    stats = rank_stats([r.value for r in results], plan.bench["warmup"], [r.placed for r in results])
    return Outputs(stats=Stats(kernel_us=stats))
