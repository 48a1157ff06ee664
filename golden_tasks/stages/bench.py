"""Bench: time the kernel on the cached inputs (stages.Rounds), then recheck it, in a child process per rank.

Every call starts as dispatch's call did: before it, outside its time, InOut buffers are restored to
the inputs and Out buffers to their initial content, so each round does the same work and must write
its outputs again (a kernel that leaves them alone after its first call leaves the canary). After the rounds the same
processes call the kernel once on the second input set (inputs2), and the outputs of the last timed
round and of that call are judged again with the validation policy: a kernel right only on its first
call, or one that returns a result it cached, fails here. A multi-rank kernel's calls are bracketed by
barriers; each rank times its own call, a round takes as long as its slowest rank (the critical path),
and a rank that is the slowest round after round is reported as a load imbalance.
"""
import functools

import torch

from .. import isolate, ranks
from ..outputs import POLICY_FILE, BenchMeta, Stats
from . import Outputs, Rounds, StageFailed, adaptive_rounds, cache_flush, load_checked, same_bits, summary
from .validate import blank

# A rank is persistently slower when it is the slowest in this share of at least this many rounds and
# its median exceeds the fastest rank's by this factor (noise alone rarely does all three).
IMBALANCE_SHARE, IMBALANCE_ROUNDS, IMBALANCE_RATIO = 0.75, 10, 1.10


class _Fresh:
    """Before a call: each Out and InOut argument back to what it held when placed (its initial content)."""

    def __init__(self, args: list, table: list):
        self.restore = [(a, a.clone()) for a, row in zip(args, table) if row.get("direction") in ("out", "inout")]

    def __call__(self) -> None:
        for arg, initial in self.restore:
            arg.copy_(initial)


def _cuda_timer():
    """Times one call with CUDA events (the GPU's own clock), in microseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timer(call) -> float:
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3
    return timer


def _device(device: str) -> dict:
    """Where the rounds ran: the CPU threads; a GPU's name and clocks (MHz, where NVML can tell)."""
    found = {"device": device, "threads": torch.get_num_threads()}
    if device == "cuda":
        found["name"] = torch.cuda.get_device_name()
        try:
            found["sm_clock_mhz"] = torch.cuda.clock_rate()
        except Exception:  # noqa: BLE001 -- NVML (pynvml) is optional: the clock is then not recorded
            found["sm_clock_mhz"] = None
    return found


def time_kernel(kernel, args: list, rank, rule: Rounds, table: list, device: str) -> dict:
    """Runs in each rank. `args` holds the arguments of the timed rounds, then (when there is a second
    input set) those of the recheck call. The rounds' times and how they ended, with `_device`."""
    first, second = args[:len(table)], args[len(table):]
    several = rank.world > 1
    fresh, flush = _Fresh(first, table), cache_flush(device) if rule.flush else None

    def before():
        fresh()
        if flush:
            flush()
        if several:
            rank.sync()

    times, stopped, warmed = adaptive_rounds(lambda: kernel(*first), rule, before, rank.agree if several else None,
                                             timer=_cuda_timer() if device == "cuda" else None)
    if second:
        rank.sync()
        kernel(*second)
    return {"times": times, "stopped": stopped, "warmup": warmed, **_device(device)}


def rank_stats(per_rank: list, placed: list) -> dict:
    """The timing of the rounds (the slowest rank's time in each) and, for several ranks, each
    rank's own timing, how many rounds it was the slowest in and the tensors it placed, and a
    load imbalance (or None). `per_rank`: time_kernel's answer of each rank."""
    first = per_rank[0]
    rounds = [max(times) for times in zip(*(r["times"] for r in per_rank))]
    where = {k: v for k, v in first.items() if k not in ("times", "stopped", "warmup")}
    stats = {**summary(rounds, first["stopped"], first["warmup"]), **where}
    if len(per_rank) == 1:
        return stats
    slowest = [max(range(len(per_rank)), key=lambda r: times[r]) for times in zip(*(r["times"] for r in per_rank))]
    stats["ranks"] = [{**summary(r["times"], r["stopped"], r["warmup"]), "slowest_rounds": slowest.count(i),
                       "placed": placed[i]} for i, r in enumerate(per_rank)]
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


def judge_again(policy: bytes, checks: dict, case: str, placement: dict, blank: list) -> list:
    """Runs isolated (the policy's comparators are user code): the mismatch report of each check
    (label -> (kernel outputs, golden outputs)) that fails (`placement`, `blank`: as validate.judge
    takes them)."""
    import cloudpickle  # noqa: PLC0415

    from .validate import judge  # noqa: PLC0415

    failures = []
    for label, (actual, expected) in checks.items():
        try:
            judge(cloudpickle.loads(policy), actual, expected, case, {}, placement, blank)
        except StageFailed as exc:
            failures.append(f"{label}:\n{exc}")
    return failures


def _copies(tensors: dict) -> dict:
    return {name: t.clone() for name, t in tensors.items()}


def second_set(inputs, inputs2, golden2) -> str:
    """Whether the second input set can be checked: "checked", or why not."""
    if reason := inputs2.skipped or golden2.skipped:
        return f"not checked: {reason}"
    if all(same_bits(t, inputs2.tensors[n]) for n, t in inputs.tensors.items()):
        return ("checked, but it equals the first (the specs' init_values ignore the seed): "
                "a result the kernel cached would not be caught")
    return "checked"


def run(case, plan, workdir, abi, compile, inputs, golden, validate, inputs2, golden2):
    artifact = load_checked(compile, abi)
    if reason := artifact.unavailable() or ranks.unavailable(artifact, plan.ranks):
        return Outputs(meta=BenchMeta(skipped=reason))
    rule, table = Rounds(**plan.bench), abi.meta.table
    what = f"the kernel of {plan.case} (in its benchmark)"
    judged = not validate.skipped  # a case without a golden is timed, with nothing to judge against
    second = second_set(inputs, inputs2, golden2) if judged else "not checked: the case has no golden"
    timed = ranks.Placement(table, abi.meta.placement, inputs, plan.ranks)
    again = (ranks.Placement(table, abi.meta.placement, inputs2, plan.ranks) if second.startswith("checked")
             else None)
    # each call may take up to the case's timeout; one more for loading, one for the second set
    results = ranks.run(functools.partial(time_kernel, rule=rule, table=table, device=artifact.device),
                        artifact, timed, plan.timeout, rule.longest(plan.timeout) / plan.timeout + 2,
                        f"the benchmark of {plan.case}", also=again)
    # once, after every round: a write to an input in any round persists (unless the kernel undoes it)
    for placement, used in ((timed, inputs), (again, inputs2)):
        if placement:
            placement.check_inputs_untouched(used, what)
            placement.check_guards(what)
    if judged:
        # copies: a tensor mapped from a stored file cannot cross into the isolated child
        checks = {"the outputs of its last timed round": (timed.outputs(what), _copies(golden.tensors))}
        if again:
            checks["its outputs on the second input set (seed + 1), in the same process"] = (
                again.outputs(what), _copies(golden2.tensors))
        failures = isolate.call(judge_again, (validate.files[POLICY_FILE].read_bytes(), checks, plan.case,
                                              abi.meta.placement, blank(golden, inputs)),
                                2 * plan.timeout, f"the benchmark's recheck of {plan.case}")
        if failures:
            raise StageFailed(f"{plan.case} passed validation, but its benchmark's recheck FAILED (a kernel right "
                              "only on its first call, or returning a cached result?):\n" + "\n".join(failures))
    stats = rank_stats([r.value for r in results], [r.placed for r in results])
    return Outputs(meta=BenchMeta(second_set=second), stats=Stats(kernel_us=stats))
