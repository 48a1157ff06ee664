"""Bench: time the kernel on work it really does, in a child process per rank, and judge again what it
did while timed.

The argument sets. Timed rounds alternate between two sets of buffers, so consecutive rounds never see
the same addresses: the inputs (seed), and the second input set (inputs2, seed + 1) when its golden can
be checked, else a second copy of the inputs. A few rounds, at positions drawn for this run, use an
input set of their own (seeds beyond those), which the kernel meets there for the first time: a kernel
much faster on inputs it has seen than on new ones remembers its results (by shape, address or
content), and fails, saying so. Every call starts as dispatch's call did: before it, outside its time,
InOut buffers are restored to their inputs and Out buffers to their initial content, so each round
does the same work and must write its outputs again.

What is judged again, with the validation policy, against the golden of its set: the outputs of the
last round on each of the two sets, and of rounds drawn at random as they run (a reservoir), copied
out as soon as the call returns. A kernel right only on its first call, returning a result cached
from another call, or writing its outputs after it returned, fails.

What its clock cannot hide. Each rank tells the caller when its timed loop starts and ends, and the
caller reads, from the system, how much CPU time the rank's main thread used in between, while the rank
waits for it (the kernel can only make that span longer). The rounds must add up to at least WALL_SHARE
of it, less the harness's own steps between rounds, measured by the same loop around a call that does
nothing: a patched clock, rewritten round times or work moved into the untimed steps fail. So does a
Python thread or a process the kernel starts during a timed call and leaves running when it returns
(work done after the call is not timed). Nor can its median be below the least time this machine takes to
write its outputs and do the work its case declares as a minimum (calibrate.beats_floor).

A multi-rank kernel's calls are bracketed by barriers; each rank times its own call, a round takes as
long as its slowest rank (the critical path), and a rank that is the slowest round after round is
reported as a load imbalance.
"""
import collections
import dataclasses
import functools
import gc
import os
import random
import secrets
import statistics
import threading
import time

import torch

from ..forms import isolate, ranks
from ..model.outputs import POLICY_FILE, BenchMeta, Stats, Upstream
from ..model.work import Work
from ..storage.tensors import same_bits
from . import BenchSettings, Outputs, StageFailed, adaptive_rounds, cache_flush, cuda_timer, load_checked, rank_stats
from .calibrate import beats_floor
from .inputs2 import unseen_sets
from .validate import blank

SAMPLES = 2  # rounds per checked set whose outputs are kept and judged, drawn as they run
SEEN_RATIO = 3.0  # slower than this on new inputs than on seen ones (their upper quartile): it remembers results
# The rounds must add up to WALL_SHARE of the CPU time the rank's main thread used over them, less
# HARNESS_FACTOR times the harness's steps (a no-op loop's, which run slower after a real kernel's calls have
# used the caches) and WALL_SLACK_S (what else the harness does in the loop: an unseen set's first read, the
# reservoir's copies). The rank waits at each mark until the caller has read its CPU time, so the span is exact.
WALL_SHARE, HARNESS_FACTOR, WALL_SLACK_S = 0.5, 2.0, 0.002
MARK_WAIT_S = 10.0  # how long a rank waits for the caller to read its CPU time at a mark
NOOP_ROUNDS = 20  # rounds of the no-op call that measure the harness's own steps (CPU time, in the rank)
_thread_time = time.thread_time  # bound before any kernel is loaded
PROCESS_ROUNDS = 64  # timed rounds after each of which processes the kernel left running are looked for
# The benchmark of a kernel whose timings are no performance figures (Artifact.timing_caveat: an emulator runs
# it), whatever the settings: its rechecks (the sampled rounds, an unseen input set) but no more rounds
EMULATED = {"warmup": 1, "rounds": 4}


class _Fresh:
    """Before a call: each Out and InOut argument back to what it held when placed (its initial content)."""

    def __init__(self, args: list, table: list):
        self.restore = [(a, a.clone()) for a, row in zip(args, table) if row.is_output]

    def __call__(self) -> None:
        for arg, initial in self.restore:
            arg.copy_(initial)


def _device(device: str) -> dict:
    """Where the rounds ran, as Timing's fields: the CPU threads; a GPU's name and clocks (MHz, where NVML can
    tell)."""
    found = {"device": device, "threads": torch.get_num_threads()}
    if device == "cuda":
        found["name"] = torch.cuda.get_device_name()
        try:
            found["sm_clock_mhz"] = torch.cuda.clock_rate()
        except Exception:  # noqa: BLE001 -- NVML (pynvml) is optional: the clock is then not recorded
            found["sm_clock_mhz"] = None
    return found


def unseen_rounds(draw: int, rule: BenchSettings, sets: int) -> dict:
    """Timed round -> the unseen set (2, 3, ...) it uses, at positions drawn from `draw` among the least
    rounds (every rank and the caller draw the same); at most one in three of them."""
    least = rule.bounds[0]
    count = min(sets, (least - 1) // 3)
    return dict(zip(random.Random(draw).sample(range(1, least), count), range(2, 2 + count)))


def _children() -> set:
    """The pids of the children of this process's main thread (a thread's own are its children)."""
    with open(f"/proc/self/task/{threading.main_thread().native_id}/children") as f:
        return set(f.read().split())


class _Watch:
    """Python threads started during a call and still running when it returned, and processes alive after
    a call (the rank process starts none of its own). Reading /proc costs ~20 us, so processes are looked
    for after every warmup call, the first PROCESS_ROUNDS rounds and one round in 8 after them (a
    process kept running is found at the next look)."""

    def __init__(self):
        self.found = None

    def before(self) -> None:
        self.threads = set(threading.enumerate())

    def after(self, round_) -> None:
        threads = [t.name for t in threading.enumerate() if t not in self.threads and t.is_alive()]
        look = round_ is None or round_ < PROCESS_ROUNDS or round_ % 8 == 0
        children = sorted(_children()) if look else []
        if (threads or children) and self.found is None:
            left = ([f"thread {', '.join(threads)}"] if threads else []) + (
                [f"process {', '.join(children)}"] if children else [])
            when = "a warmup call" if round_ is None else f"timed round {round_}"
            self.found = (f"it left {' and '.join(left)} running when {when} returned: work done after a call "
                          "returns is not timed, and its outputs may change after they are read")


class _Reservoir:
    """Copies of the outputs of up to SAMPLES rounds per checked set, drawn uniformly from its rounds as
    they run (reservoir sampling, from `draw`: every rank keeps the same rounds). `slots[k][j]`: the
    output buffers (argument index -> tensor) of set k's j-th sample."""

    def __init__(self, draw: int, slots: list):
        self.random, self.slots = random.Random(draw), slots
        self.seen = [0] * len(slots)  # timed rounds on each set so far
        self.rounds = [[None] * len(kept) for kept in slots]  # which round each slot holds

    def offer(self, k: int, round_: int, args: list) -> None:
        self.seen[k] += 1
        j = self.seen[k] - 1 if self.seen[k] <= SAMPLES else self.random.randrange(self.seen[k])
        if j < SAMPLES:
            for i, slot in self.slots[k][j].items():
                slot.copy_(args[i])
            self.rounds[k][j] = round_


def time_kernel(kernel, args: list, rank, rule: BenchSettings, table: list, device: str, sets: int, draw: int,
                slots: dict, marks, read: dict) -> dict:
    """Runs in each rank. `args` holds the arguments of each of the `sets` argument sets in turn (the two
    checked ones, then the unseen ones); `slots[rank]`: _Reservoir's buffers; `marks`: where the rank tells
    the caller that its timed loop starts and ends, `read[rank]`: where the caller answers once it has read
    the rank's CPU time (_Witness). The rounds' times and how they ended, where they ran ("where": _device),
    and the CPU time this process spent in each of the first rounds, those `remembers` reads ("cpu",
    microseconds)."""
    n = len(table)
    per_set = [args[k * n:(k + 1) * n] for k in range(sets)]
    fresh = [_Fresh(a, table) for a in per_set]
    flush = cache_flush(device) if rule.flush else None
    unseen, watch = unseen_rounds(draw, rule, sets - 2), _Watch()
    reservoir = _Reservoir(draw, slots[rank.rank])
    several = rank.world > 1
    now = {"set": 1, "checked": 1}  # the set of the call, the checked set used last
    cpu, first = [], rule.bounds[0]  # the CPU time of each of the first rounds: load on the machine leaves it be

    def before(round_, noop=False):
        if noop:
            spare()
        else:  # the two checked sets in turn, warmup included, but for the rounds that meet an unseen set
            k = unseen.get(round_)
            if k is None:
                k = now["checked"] = 1 - now["checked"]
            now["set"] = k
            fresh[k]()
        # An unseen set's pages and cache as warm as the seen sets', so only its content is new: read here, in
        # this thread (a torch reduction would spread it over other cores' caches and wake their threads).
        if not noop and now["set"] >= 2:
            for a in per_set[now["set"]]:
                if isinstance(a, torch.Tensor) and a.device.type == "cpu":
                    a.view(-1).view(torch.uint8).numpy().sum()
        if flush:
            flush()
        if several:
            rank.sync()
        watch.before()
        if round_ is not None and round_ < first:
            now["cpu"] = time.process_time()

    def after(round_):
        if round_ is not None and round_ < first:
            cpu.append((time.process_time() - now["cpu"]) * 1e6)
        watch.after(round_)
        if round_ is not None and now["set"] < 2:
            reservoir.offer(now["set"], round_, per_set[now["set"]])

    timer = cuda_timer() if device == "cuda" else None
    agree = rank.agree if several else None

    def mark(what: str) -> None:
        marks.send_bytes(f"{rank.rank} {what} {os.getpid()}".encode())
        if read[rank.rank].poll(MARK_WAIT_S):
            read[rank.rank].recv_bytes(8)

    # No collection in the loop: a pause of the garbage collector between rounds would be CPU time no round
    # holds (timeit's rule too).
    collecting = gc.isenabled()
    gc.disable()
    try:
        times, stopped, warmed = adaptive_rounds(lambda: kernel(*per_set[now["set"]]), rule, before, agree,
                                                 timer=timer, after=after, marked=mark)
    finally:
        if collecting:
            gc.enable()
    for k in (0, 1):  # too few rounds to meet both checked sets: the one left out is called once, untimed
        if not reservoir.seen[k]:
            fresh[k]()
            watch.before()
            kernel(*per_set[k])
            watch.after(None)
    # the harness's steps alone: the same loop around a call that does nothing, after the rounds (nothing in it
    # is a first time), restoring copies (the outputs of the last rounds are judged)
    spare = _Fresh([a.clone() if isinstance(a, torch.Tensor) else a for a in per_set[0]], table)
    used = _thread_time()
    adaptive_rounds(lambda: None, BenchSettings(warmup=0, rounds=NOOP_ROUNDS), functools.partial(before, noop=True),
                    agree, timer=timer, after=lambda i: watch.after(PROCESS_ROUNDS + i))  # looks as in late rounds
    harness = (_thread_time() - used) / NOOP_ROUNDS
    return {"times": times, "stopped": stopped, "warmup": warmed, "left_running": watch.found, "harness": harness,
            "sampled": reservoir.rounds, "cpu": cpu, "where": _device(device)}


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


def _cpu_seconds(pid: str) -> float:
    """The CPU time the main thread of process `pid` has used, by the scheduler's own account
    (/proc/<pid>/schedstat): no code in that process can change it, and a loaded machine's waits are
    not in it."""
    try:
        with open(f"/proc/{int(pid)}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class _Witness:
    """What the caller sees of each of `world` ranks' loops: the ranks send (rank, mark, pid) through
    `writer` and wait for `read[rank]`; a thread here keeps, for each mark, the CPU time the rank's main
    thread had used when it arrived, then answers. A kernel can send marks too, but only ever make the
    span it is judged by longer (`span` takes the first start and the last end) or end a rank's wait
    early (its later work then counts)."""

    def __init__(self, world: int):
        self.reader, self.writer = isolate.pipe()
        answers = {r: isolate.pipe() for r in range(world)}
        self.read, self.answer = {r: p[0] for r, p in answers.items()}, {r: p[1] for r, p in answers.items()}
        self.arrived = collections.defaultdict(list)
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    def _keep(self) -> None:
        while True:
            try:
                rank, mark, pid = self.reader.recv_bytes(64).decode().split()
                self.arrived[int(rank), mark].append(_cpu_seconds(pid))
                self.answer[int(rank)].send_bytes(b"read")
            except EOFError:
                return
            except (OSError, ValueError, KeyError):  # not a rank's mark: sent by a kernel, which loses its window
                continue

    def close(self) -> None:
        self.writer.close()
        self.thread.join(timeout=5.0)
        for connection in (self.reader, *self.read.values(), *self.answer.values()):
            connection.close()

    def span(self, rank: int, start: str, end: str) -> float:
        """CPU seconds of `rank`'s main thread from `start` to `end`, or None."""
        starts, ends = self.arrived.get((rank, start)), self.arrived.get((rank, end))
        return max(ends) - min(starts) if starts and ends else None


def clock_check(per_rank: list, witness: _Witness) -> tuple:
    """(rank 0's figures: its rounds' sum, the CPU time its main thread used over them and the harness's
    steps' share of it, in ms; why the rounds of a rank cannot be what its clock says, or None). The
    rounds must add up to at least WALL_SHARE of that CPU time less HARNESS_FACTOR times the harness's
    steps (measured around a no-op call) and WALL_SLACK_S."""
    figures, why = None, None
    for r, result in enumerate(per_rank):
        used = witness.span(r, "start", "end")
        if used is None:
            return figures, f"rank {r} did not report its timed loop to the caller"
        steps = result["harness"] * len(result["times"])
        total = sum(result["times"]) / 1e6
        if figures is None:
            figures = {"rounds_ms": total * 1e3, "cpu_ms": used * 1e3, "harness_ms": steps * 1e3}
        if why is None and total < WALL_SHARE * (used - HARNESS_FACTOR * steps) - WALL_SLACK_S:
            why = (f"its rounds{ranks.on_rank(r, len(per_rank))} add up to {total * 1e3:.3g} ms, but its process "
                   f"worked {used * 1e3:.3g} ms over them by the system's account, {steps * 1e3:.3g} ms of it the "
                   "harness's own steps between rounds: the time was not measured on the work (a patched "
                   "clock, rewritten round times, or work moved between the rounds)")
    return figures, why


def remembers(rounds: list, unseen: dict) -> str:
    """Why the kernel looks like it remembers results (its rounds on new inputs are SEEN_RATIO times
    slower than its rounds on inputs it has seen among the same first rounds), or None."""
    new = [rounds[i] for i in unseen if i < len(rounds)]
    seen = [t for i, t in enumerate(rounds[:max(unseen, default=0) + 2]) if i not in unseen]
    if not new or len(seen) < 2:
        return None
    slow = statistics.quantiles(seen, n=4, method="inclusive")[2]  # a noisy round of the seen ones
    if min(new) > SEEN_RATIO * slow:
        return (f"its rounds on inputs it had never seen cost at least {min(new):.4g} us ({len(new)} rounds; CPU "
                "time for a kernel on the CPU), "
                f"{min(new) / slow:.1f}x its slower rounds on inputs it had seen before (upper quartile "
                f"{slow:.4g} us): a kernel that remembers results (by shape, address or content) is timed on "
                "work it did not do")
    return None


def _unseen_sets(inputs, inputs2) -> list:
    """The input sets the kernel is to meet once each (inputs2.unseen_sets), or none when they equal the
    inputs (the specs ignore the seed) or there are none (inputs from a data directory)."""
    made = unseen_sets(inputs2)
    if not made or all(same_bits(t, made[0].tensors[n]) for n, t in inputs.tensors.items()):
        return []
    return made


def _slots(placement) -> dict:
    """rank -> per checked set, SAMPLES output buffers (argument index -> shared tensor) for _Reservoir."""
    return {r: [[{i: torch.empty_like(g.tensor).share_memory_() for i, g in guards.items()}
                 for _ in range(SAMPLES)] for _ in range(2)] for r, guards in placement.guards.items()}


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    abi, inputs, golden, inputs2, golden2 = upstream.abi, upstream.inputs, upstream.golden, upstream.inputs2, \
        upstream.golden2
    artifact = load_checked(upstream.compile, abi)
    if reason := artifact.unavailable() or ranks.unavailable(artifact, plan.ranks):
        return Outputs(meta=BenchMeta(skipped=reason))
    rule, table = BenchSettings(**plan.bench), abi.meta.table
    if artifact.timing_caveat():  # an emulated kernel's time is no figure: enough rounds for its rechecks
        rule = dataclasses.replace(rule, **EMULATED)
    what = f"the kernel of {plan.case} (in its benchmark)"
    judged = not upstream.validate.skipped  # a case without a golden is timed, with nothing to judge against
    second = second_set(inputs, inputs2, golden2) if judged else "not checked: the case has no golden"
    checked = second.startswith("checked")
    used = [(inputs, golden), (inputs2, golden2) if checked else (inputs, golden)]
    used += [(made, None) for made in _unseen_sets(inputs, inputs2)]
    # A busy machine can slow every round that meets an unseen set of an honest kernel (a few in a hundred
    # pools with the cores shared three ways), and a fresh process can do a few ms of work its rounds do not
    # show (once in 1,000 trivial cases at -n 2 on two cores), so a kernel that looks as if it remembers, or
    # whose rounds do not add up to its process's work, is timed again by a new pool, whose processes have
    # never seen any input either; only a kernel that looks so twice fails.
    for _ in range(2):
        # buffers placed anew for each pool: the rounds of the last left the InOut buffers as its calls did
        sets = [ranks.Placement(table, abi.meta.placement, given, plan.ranks) for given, _ in used]
        draw, slots, witness = secrets.randbits(32), _slots(sets[0]), _Witness(plan.ranks)
        # each call may take up to the case's timeout; one more for loading, the no-op loop's is the harness's
        try:
            results = ranks.run(functools.partial(time_kernel, rule=rule, table=table, device=artifact.device,
                                                  sets=len(sets), draw=draw, slots=slots, marks=witness.writer,
                                                  read=witness.read),
                                artifact, sets[0], plan.timeout, rule.longest(plan.timeout) / plan.timeout + 2,
                                f"the benchmark of {plan.case}", also=sets[1:])
        finally:
            witness.close()
        # once, after every round: a write to an input in any round persists (unless the kernel undoes it)
        for placement, (given, _) in zip(sets, used):
            placement.check_inputs_untouched(given, what)
            placement.check_guards(what)
        per_rank = [r.value for r in results]
        timing, (clock, forged) = rank_stats(per_rank, [r.placed for r in results]), clock_check(per_rank, witness)
        if left := next((r["left_running"] for r in per_rank if r["left_running"]), None):
            raise StageFailed(f"{what} FAILED its timing: {left}")
        if not artifact.timing_caveat() and (faster := beats_floor(Work.from_json(plan.work), upstream.calibrate,
                                                                   timing)):
            raise StageFailed(f"{what} FAILED its timing: faster than this machine does the work it must: {faster}")
        unseen = unseen_rounds(draw, rule, len(sets) - 2)
        # judged by CPU time where the kernel runs on the CPU: a busy machine stretches the wall time of any
        # round, seen or not, but not the work the process did in it
        judged_by = "cpu" if artifact.device == "cpu" else "times"
        if not (doubt := forged or remembers([max(t) for t in zip(*(r[judged_by] for r in per_rank))], unseen)):
            break
    else:
        raise StageFailed(f"{what} FAILED its timing (twice, in two pools of new processes): {doubt}")
    if judged:
        checks = {}
        for k, label in enumerate(("on the inputs", "on the second input set (seed + 1)" if checked
                                   else "on a second copy of the inputs")):
            expected = _copies(used[k][1].tensors)  # copies: a stored file's map cannot cross to the child
            checks[f"the outputs of its last timed round {label}"] = (sets[k].outputs(what), expected)
            for j, round_ in enumerate(per_rank[0]["sampled"][k]):
                if round_ is not None:
                    for r in sets[k].guards:
                        sets[k].receive(r, slots[r][k][j])
                    checks[f"the outputs of timed round {round_} ({label})"] = (sets[k].outputs(what), expected)
        failures = isolate.call(judge_again, (upstream.policy.files[POLICY_FILE].read_bytes(), checks, plan.case,
                                              abi.meta.placement, blank(golden, inputs)),
                                2 * plan.timeout, f"the benchmark's recheck of {plan.case}")
        if failures:
            raise StageFailed(f"{plan.case} passed validation, but its benchmark's recheck FAILED (a kernel right "
                              "only on its first call, or returning a cached result?):\n" + "\n".join(failures))
    return Outputs(meta=BenchMeta(second_set=second, caveat=artifact.timing_caveat()),
                   stats=Stats(kernel_us=dataclasses.replace(timing, clock=clock, unseen_rounds=len(unseen))))
