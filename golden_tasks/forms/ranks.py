"""Kernel calls laid out over ranks: each rank's arguments, and one isolated process per rank.

A kernel runs as `world` ranks (one for an ordinary kernel). Each rank gets its
view of every parameter (AbiMeta.placement, TensorSpec.resident): a tensor with
no placement whole on every rank, a stacked one's slice r on rank r, a tensor
resident on rank k on rank k (the other ranks get zeros of its shape: the
buffer a broadcast or a reduce to k needs); an Out with no init_value starts as
the canary (specs.canary), so that elements the kernel leaves are named. A Placement holds those views in
shared memory, Out/InOut between guard regions, and reads the outputs back
into whole tensors. `run` starts every rank at once as an isolated call
(golden_tasks.forms.isolate) running a rank program (one call, or the benchmark's
rounds). With more than one rank they meet in a torch.distributed process group
(gloo; NCCL for CUDA artifacts) through a TCPStore rank 0 hosts on a loopback
port the caller had the system pick for this pool alone, so concurrent pools
never collide; confined ranks share a network namespace of the pool's own
(sandbox.PoolNetwork), where that port is, and nothing else. Each rank
(Rank: also what a launched process runs, golden_tasks.pipeline.launched) places its
tensors on its device once, runs the program, copies back once and leaves the
group.

A fault names its rank. Collective errors name no rank, and a crash makes every
peer fail too (connection reset), so the caller judges from all the ranks'
outcomes: a rank that crashed; else one that raised an error of its own, not a
failed collective; else one that hung (silent, or stuck in a collective inside
its kernel after its peers had finished theirs); else every failing rank.
"""
import contextlib
import dataclasses
import datetime
import os
import re
import socket
import traceback

import torch
import torch.distributed as dist

from ..model.errors import StageFailed
from ..model.rows import STACKED, ParamRow
from ..model.specs import canary, dtype_of
from ..project import sandbox
from ..storage.tensors import back_to_host, on_device, same_bits
from . import isolate
from .isolate import Ended

LOOPBACK = "127.0.0.1"
# Errors of a collective or of the group itself: gloo and NCCL raise plain RuntimeErrors, so the
# message is all there is to tell them from an error of the kernel's own.
_COMMUNICATION = re.compile(r"gloo|NCCL|Connection (reset|closed) by peer|Timed out waiting|connectFullMesh|"
                            r"DistNetworkError|DistStoreError|DistBackendError|process group")
JOIN_SECONDS = 30.0  # for the ranks of a pool to start, meet and load, beyond their calls' time
IN_KERNEL = "in its kernel"
AFTER_KERNEL = "waiting for the other ranks after its kernel"


def on_rank(rank: int, world: int) -> str:
    """' on rank r' for a message about a multi-rank call; nothing for a single process."""
    return f" on rank {rank}" if world > 1 else ""


class Placement:
    """Each rank's positional arguments for a kernel taking `table` (AbiMeta), built from the inputs
    stage's whole tensors: In tensors are copies, Out/InOut ones sit between guard regions."""

    def __init__(self, table: list[ParamRow], placement: dict, inputs, world: int, here=None):
        """`here`: the ranks whose arguments to build (default: all of them)."""
        self.table, self.placement, self.world = table, placement, world
        here = range(world) if here is None else here
        self.guards = {r: {} for r in here}  # rank -> {argument index: isolate.Guarded}: the outputs
        self.padded = {r: {} for r in here}  # the same for the inputs, between POISON guards
        self.args = {r: [self._arg(i, row, inputs, r) for i, row in enumerate(table)] for r in here}

    def holds(self, row: ParamRow, rank: int) -> bool:
        """Whether `rank` receives the content of the tensor of `row` (not just a buffer of its shape)."""
        where = self.placement.get(row.name)
        return where is None or where == STACKED or where == rank

    def view(self, row: ParamRow, whole, rank: int):
        """What `rank` receives of the whole tensor of `row`."""
        return whole[rank] if self.placement.get(row.name) == STACKED else whole

    def _arg(self, i, row, inputs, rank):
        if row.by_value:
            return inputs.meta.scalars[row.name]
        if not self.holds(row, rank):
            data = torch.zeros(row.shape, dtype=dtype_of(row.dtype))
        elif row.name in inputs.tensors:  # an input, or an Out with an init_value
            data = self.view(row, inputs.tensors[row.name], rank)
        else:  # an Out with no initial content: what the kernel leaves of it is reported unwritten
            data = canary(row.shape, dtype_of(row.dtype))
        if row.direction == "in":
            self.padded[rank][i] = isolate.Guarded(row.name, data, isolate.POISON)
            return self.padded[rank][i].tensor
        self.guards[rank][i] = isolate.Guarded(row.name, data)
        return self.guards[rank][i].tensor

    def written_inputs(self, inputs) -> list:
        """The In tensors (by name, and rank) that no longer hold their input: written by the kernel."""
        return [f"{row.name!r}{on_rank(r, self.world)}" for r, args in self.args.items()
                for row, arg in zip(self.table, args) if not row.by_value and row.direction == "in"
                and self.holds(row, r) and not same_bits(arg, self.view(row, inputs.tensors[row.name], r))]

    def check_inputs_untouched(self, inputs, what: str) -> None:
        if written := self.written_inputs(inputs):
            raise StageFailed(f"{what} wrote its In parameter {', '.join(written)}: inputs are read-only")

    def check_guards(self, what: str) -> None:
        clobbered = [f"the guard region {g.name} ({side}){on_rank(r, self.world)} lost its canary: {detail}"
                     for placed in (self.guards, self.padded) for r, guards in placed.items()
                     for g in guards.values() for side, detail in g.clobbered()]
        if clobbered:
            raise StageFailed(f"{what} wrote outside its outputs: {'; '.join(clobbered)}")

    def sent(self, rank: int) -> dict:
        """Rank `rank`'s outputs (argument index -> tensor), to send to where they are assembled."""
        return {i: g.tensor for i, g in self.guards[rank].items()}

    def receive(self, rank: int, outputs: dict) -> None:
        """Rank `rank`'s outputs as another process `sent` them, into its buffers here."""
        for i, tensor in outputs.items():
            self.guards[rank][i].tensor.copy_(tensor)

    def outputs(self, what: str) -> dict:
        """The whole Out/InOut tensors: stacked slices stacked, a resident one from its rank, an
        unplaced one from rank 0, which every other rank must match bit for bit."""
        found = {}
        for i, row in enumerate(self.table):
            if row.by_value or row.direction == "in":
                continue
            copies = [guards[i].tensor for guards in self.guards.values()]
            where = self.placement.get(row.name)
            if where == STACKED:
                found[row.name] = torch.stack(copies)
                continue
            if where is None:
                differ = next((r for r in range(1, self.world) if not same_bits(copies[r], copies[0])), None)
                if differ is not None:
                    raise StageFailed(f"{what}: output {row.name!r} is whole on every rank (no resident), "
                                      f"but rank {differ}'s copy differs from rank 0's: the ranks must agree, "
                                      f"or its spec must say where it lives (resident=k, or {STACKED!r})")
            found[row.name] = copies[where or 0].clone()
        return found


@dataclasses.dataclass
class RankFailure:
    """An exception in a rank, with where it happened (`phase`) and whether it is a failed
    collective (often a symptom of another rank's fault) rather than an error of its own."""
    phase: str
    communication: bool
    text: str

    @property
    def first_line(self) -> str:
        lines = [line for line in self.text.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


@dataclasses.dataclass
class RankResult:
    """A rank's answer: what its program returned, and how many tensors it placed on its device."""
    value: object
    placed: int


class Rank:
    """One rank's side of a multi-rank call, in its own process: it joins the group, runs a rank
    program, leaves. `phase` says where it is, for the verdict when it fails."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world, self.phase = rank, world, "joining the process group"

    def join(self, device: str, timeout: float, address=None, meeting=None, listener=None) -> None:
        """Join the group (gloo; NCCL for a CUDA device, one GPU per rank on its machine) through the
        TCPStore at `address` (served by this rank from `listener`, a socket bound there, if given), or
        the store `meeting`; a collective may wait `timeout` seconds."""
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", self.rank)) % torch.cuda.device_count())
        store = meeting or dist.TCPStore(*address, is_master=listener is not None, wait_for_workers=False,
                                         master_listen_fd=listener.detach() if listener else None,
                                         timeout=datetime.timedelta(seconds=JOIN_SECONDS))
        # every rank first waits (up to JOIN_SECONDS) for the others to arrive: on a loaded machine a rank
        # may start late, and the group's own wait is the case's timeout, meant for the kernel's collectives
        store.set(f"arrived/{self.rank}", "1")
        store.wait([f"arrived/{r}" for r in range(self.world)], datetime.timedelta(seconds=JOIN_SECONDS))
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=store, rank=self.rank,
                                world_size=self.world, timeout=datetime.timedelta(seconds=timeout))

    def run(self, program, artifact, args: list) -> "RankResult":
        """Load the kernel, place `args` on its device, run `program(kernel, placed_args, self)`, copy
        what it left back into `args`."""
        self.phase = "loading its kernel"
        kernel = artifact.load()
        placed = on_device(artifact, args)
        self.phase = IN_KERNEL
        value = program(kernel, placed, self)
        back_to_host(args, placed)
        self.phase = AFTER_KERNEL
        return RankResult(value, sum(isinstance(a, torch.Tensor) for a in args))

    def sync(self) -> None:
        """Wait for every rank (a barrier); nothing in a world of one."""
        if self.world > 1:
            self.phase = "in a barrier between calls"
            dist.barrier()
        self.phase = IN_KERNEL

    def agree(self, us: float, elapsed: float) -> tuple[float, float]:
        """After a timed call: the slowest rank's round time and elapsed time, the same on every rank
        (an all-reduce, which also waits for every rank, as a barrier would)."""
        self.phase = "in a barrier between calls"
        values = torch.tensor([us, elapsed], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        self.phase = IN_KERNEL
        return values[0].item(), values[1].item()

    def leave(self) -> None:
        self.phase = AFTER_KERNEL
        dist.barrier()  # no rank leaves while a peer may still be in a collective with it
        dist.destroy_process_group()

    def failure(self, exc: Exception) -> RankFailure:
        return RankFailure(self.phase, bool(_COMMUNICATION.search(str(exc))),
                           "".join(traceback.format_exception(exc)).rstrip())


def _rank_main(program, artifact, args: list, rank: int, world: int, address, timeout: float, listener=None):
    """Runs in a pool's rank process: join (rank 0 serving the store from `listener`), run, leave
    (Rank). An exception comes back as a RankFailure; the process then ends without leaving the group
    (its peers see it at once)."""
    me = Rank(rank, world)
    try:
        if world > 1:
            torch.set_num_threads(max(1, torch.get_num_threads() // world))
            me.join(artifact.device, timeout, address, listener=listener)
        result = me.run(program, artifact, args)
        if world > 1:
            me.leave()
    except Exception as exc:  # noqa: BLE001 -- judged by the caller with every rank's outcome
        return me.failure(exc)
    return result


@contextlib.contextmanager
def _rendezvous(world: int, confinement):
    """For one pool: a socket bound to a loopback port the system picked, which this process holds until
    the pool is done and rank 0 serves the store from (it then listens on loopback only, on a port
    nobody else can take), and the confinement of the ranks: in the pool's network namespace when
    confined (the socket is made there). For a world of one: no socket, `confinement` as it is."""
    if world == 1:
        yield None, confinement
    elif confinement:
        with contextlib.ExitStack() as stack:
            try:
                pool = stack.enter_context(isolate.pool_network())
            except sandbox.SandboxError as exc:
                raise StageFailed(f"could not confine the kernel's ranks: {exc}") from None
            yield pool.listener, dataclasses.replace(confinement, pool=pool.holder)
    else:
        with socket.socket() as listener:
            listener.bind((LOOPBACK, 0))
            yield listener, confinement


def unavailable(artifact, world: int) -> str:
    """Why this machine cannot run `world` ranks of `artifact`, or None."""
    if artifact.device == "cuda" and world > 1 and torch.cuda.device_count() < world:
        return (f"{world} ranks of a CUDA kernel need {world} CUDA devices (NCCL: one per rank); "
                f"this machine has {torch.cuda.device_count()}")
    return None


def run(program, artifact, placement: Placement, timeout: float, calls: float, what: str,
        also: tuple = ()) -> list:
    """Every rank's RankResult of `program` (see _rank_main) on its arguments, all ranks at once;
    `also`: more placements, whose arguments follow each rank's first ones, in order.
    The ranks get `timeout` seconds for each of `calls` calls, and several ranks JOIN_SECONDS more
    to meet; a collective may wait `timeout` seconds (so a rank stuck in one lets its peers report
    before the ranks count as hung). StageFailed names the rank that failed and why."""
    world = placement.world
    budget = timeout * calls + (JOIN_SECONDS if world > 1 else 0)
    confinement = isolate.confinement(artifact.files.values(), gpu=artifact.device == "cuda")
    with _rendezvous(world, confinement) as (listener, confinement):
        address = listener and (LOOPBACK, listener.getsockname()[1])
        jobs = [(_rank_main, (program, artifact, args + [a for more in also for a in more.args[rank]], rank, world,
                              address, timeout, listener if rank == 0 else None))
                for rank, args in placement.args.items()]
        outcomes = isolate.call_all(jobs, budget, confinement=confinement,
                                    failed=lambda o: o.kind is not Ended.RETURNED or isinstance(o.value, RankFailure))
    if all(o.kind is Ended.RETURNED and isinstance(o.value, RankResult) for o in outcomes):
        return [o.value for o in outcomes]
    raise StageFailed(verdict(outcomes, what))


def verdict(outcomes: list, what: str) -> str:
    """The failure of a pool, naming the rank(s) at fault first and what the others saw."""
    world = len(outcomes)

    def failure(o):
        return o.value if o.kind is Ended.RETURNED and isinstance(o.value, RankFailure) else None

    if world == 1:
        if f := failure(outcomes[0]):
            return f"{what} raised:\n{f.text}"
        try:
            outcomes[0].result(what)
        except StageFailed as exc:
            return str(exc)
    finished = any(o.kind is Ended.RETURNED and (failure(o) is None or failure(o).phase == AFTER_KERNEL)
                   for o in outcomes)
    crashed = [r for r, o in enumerate(outcomes) if o.kind is Ended.CRASHED]
    own = [r for r, o in enumerate(outcomes) if o.kind is Ended.RAISED or failure(o) and not failure(o).communication]
    hung = [r for r, o in enumerate(outcomes) if o.kind is Ended.HUNG or finished and failure(o)
            and failure(o).communication and failure(o).phase == IN_KERNEL]
    failing = [r for r, o in enumerate(outcomes) if o.kind is not Ended.RETURNED or failure(o)]
    culprits = crashed or own or hung or failing

    def describe(r, full):
        o, f = outcomes[r], failure(outcomes[r])
        if o.kind is Ended.CRASHED:
            return f"crashed: {o.value}"
        if o.kind is Ended.HUNG:
            return (f"hung: no result after {o.value:g} s" if len(culprits) == world else
                    "hung: still running after the other ranks had failed") + "; killed with everything it started"
        if o.kind is Ended.RAISED:
            return f"raised:\n{o.value}" if full else "raised"
        if f is None:
            return "finished its kernel"
        if r in hung and o.kind is not Ended.HUNG:
            return (f"hung in a collective {f.phase} after the other ranks had finished theirs:\n{f.text}" if full
                    else f"hung in a collective {f.phase}: {f.first_line}")
        kind = "a failed collective" if f.communication else "an error"  # its own message first, then where
        return f"{kind} {f.phase}: {f.first_line}" + (f"\n{f.text}" if full else "")

    lines = [f"{what} failed on rank {r} (of {world}): {describe(r, True)}" for r in culprits]
    others = [f"  rank {r}: {describe(r, False)}" for r in range(world) if r not in culprits]
    return "\n".join(lines + (["what the other ranks saw:", *others] if others else []))
