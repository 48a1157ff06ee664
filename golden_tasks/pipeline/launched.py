"""A multi-rank case whose ranks a launcher starts: torchrun, or any scheduler that sets its
variables (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), one process per rank, on one machine or
several. Every process runs `golden-tasks rank CASE`:

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr HOST --master-port 29500 \\
        -m golden_tasks.cli rank decode_hca_tp          # and --node-rank 1 on the second machine

Each process plans the library at WORLD_SIZE ranks (as `ranks=N` would) and walks the graph for
the case's abi, compile and inputs with its own cache: they are deterministic, so every machine
computes (or finds) the same. The ranks meet through the launcher's store at MASTER_ADDR:MASTER_PORT
and form their group there; each runs the kernel once on its view of the arguments (ranks.Rank),
checks its inputs and guard regions, and sends its outputs and outcome to rank 0 through the store.
Rank 0 judges the ranks' outcomes as a pool does (ranks.Placement assembles the whole outputs),
runs the golden through the graph and validates, and every process exits with the verdict: 0 for
PASS (or SKIPPED), 1 for FAIL, 2 for a launch it cannot use. The processes are the launcher's: a
crash ends that process, and the launcher ends the others.
"""
import dataclasses
import datetime
import json
import os
import pickle
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch.distributed as dist

from ..forms import ranks
from ..forms.isolate import Ended, Outcome
from ..model.errors import StageFailed, VerificationFailure
from ..model.outputs import AbiMeta, InputsMeta, Outputs
from ..model.plan import Plan
from ..model.verdicts import Verdict
from ..planning.case import Case, live_case
from ..planning.library import Library
from ..stages import load_checked
from ..stages.dispatch import call_kernel
from ..stages.validate import blank, judge
from ..storage.entry import Entry
from ..storage.store import Store
from .execution import Live
from .stage_table import BY_NAME, Stage, StageName
from .stored import load_outputs
from .walker import Events, walk

# torch.distributed imports its stores from torch._C without re-exporting them explicitly: mypy flags dist.TCPStore
# and dist.PrefixStore where implicit re-exports are off (mypy --strict), the type: ignores below
if TYPE_CHECKING:
    from torch._C._distributed_c10d import PrefixStore, TCPStore
    from torch._C._distributed_c10d import Store as DistStore

LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
GRACE_SECONDS = 5.0  # for the ranks to read the verdict, and a hung rank's to end after it


class LaunchError(Exception):
    """The environment is not a launch this case can use; the message says what to set."""


def launched_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's variables; LaunchError naming what is missing or bad."""
    missing = [v for v in LAUNCHER_VARIABLES if not os.environ.get(v)]
    if missing:
        raise LaunchError(f"not started by a launcher: {', '.join(missing)} not set (torchrun sets "
                          f"{', '.join(LAUNCHER_VARIABLES)} for each process)")
    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    if not (rank.isdigit() and world.isdigit() and int(rank) < int(world)):
        raise LaunchError(f"RANK={rank!r} and WORLD_SIZE={world!r} are not a rank of a world size")
    return int(rank), int(world)


@dataclasses.dataclass(frozen=True)
class RankVerdict:
    """The case's verdict, which rank 0 gives every rank through the launcher's store (as JSON), and why
    (a FAIL's message, a SKIPPED case's reason)."""
    verdict: Verdict
    detail: str = ""

    def __str__(self) -> str:
        """As printed: PASS, SKIPPED: <reason>, or FAIL and its message on the lines below."""
        if not self.detail:
            return str(self.verdict)
        return f"{self.verdict}: {self.detail}" if self.verdict == Verdict.SKIPPED else f"{self.verdict}\n{self.detail}"

    def to_json(self) -> str:
        return json.dumps({"verdict": self.verdict, "detail": self.detail})

    @classmethod
    def from_json(cls, text: str) -> "RankVerdict":
        data = json.loads(text)
        return cls(Verdict(data["verdict"]), data["detail"])


def verify(root: Path, case_name: str) -> tuple[int, str]:
    """Run this process's rank of `case_name`: (exit status, what to print; rank 0's says the verdict)."""
    rank, world = launched_rank()
    # the case's specs follow the world size, as with ranks=N
    library = Library(root, lambda name, default: str(world) if name == "ranks" else default)
    plan = library.plans.get(case_name)
    if plan is None:
        raise LaunchError(library.project.layout.no_case(case_name))
    if plan.error:
        return 1, f"{case_name}: {RankVerdict(Verdict.FAIL, plan.error)}"
    if plan.ranks != world:
        raise LaunchError(f"case {case_name!r} runs on one process (its kernel declares no ranks), "
                          f"and the launcher started {world} (WORLD_SIZE)")
    try:
        verdict = _rank(plan, library.store, rank, world)
    except VerificationFailure as exc:  # this process's own stages: every rank computes them alike
        verdict = RankVerdict(Verdict.FAIL, str(exc))
    return int(verdict.verdict.failed), f"{case_name}: {verdict}"


def _meeting(case_name: str, timeout: float, host: bool = False) -> tuple["TCPStore", "PrefixStore"]:
    """(the launcher's store at MASTER_ADDR:MASTER_PORT, the same under a prefix for this case); with
    `host`, this process hosts it (rank 0, when no torchrun agent does)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=host,  # type: ignore[attr-defined, unused-ignore]
                          timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    return store, dist.PrefixStore(f"golden-tasks/{case_name}/", store)  # type: ignore[attr-defined, unused-ignore]


def _wait(meeting: "DistStore", keys: list[str], seconds: float) -> list[str]:
    """The keys that are still missing after `seconds` (none once every one is set)."""
    try:
        meeting.wait(keys, datetime.timedelta(seconds=seconds))
    except RuntimeError:  # DistStoreError: a timeout
        return [k for k in keys if not meeting.check([k])]
    return []


def _end_when_judged(case_name: str, seconds: float, ran: threading.Event) -> None:
    """A daemon thread's work: once rank 0 has given its verdict (or after `seconds`), a rank whose
    kernel has not returned (`ran`) has hung in it; end its process, which its launcher would
    wait for."""
    _, meeting = _meeting(case_name, seconds)
    _wait(meeting, ["verdict"], seconds)
    if not ran.wait(GRACE_SECONDS):
        os._exit(1)


class _Entries(Events):
    """The entries a rank's walk found or made, by stage name."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}

    def cached(self, stage: Stage, entry: Entry) -> None:
        self.entries[stage.name] = entry

    ran = cached


def _rank(plan: Plan, store: Store, rank: int, world: int) -> RankVerdict:
    case = live_case(plan)

    def outputs(*names: StageName) -> list[Outputs]:
        """The stages' outputs, walked through the graph with this process's cache (StageFailed: the failure)."""
        walked = _Entries()
        if failure := walk(plan, store, [BY_NAME[n] for n in names], walked, Live(case)):
            raise StageFailed(failure.message)
        return [load_outputs(store, walked.entries[n]) for n in names]

    # every rank builds its own: the slowest sets when the ranks meet (a compile's budget)
    abi, compiled, inputs = outputs(StageName.ABI, StageName.COMPILE, StageName.INPUTS)
    artifact = load_checked(compiled, abi)
    if reason := artifact.unavailable():
        return RankVerdict(Verdict.SKIPPED, reason)
    what = f"the kernel of {plan.case}"
    abi_meta = cast(AbiMeta, abi.meta)  # the abi stage's meta type (stage_table: Stage.meta)
    placement = ranks.Placement(abi_meta.table, abi_meta.placement, inputs, world, None if rank == 0 else [rank])
    golden_seconds, compile_seconds = BY_NAME[StageName.GOLDEN].seconds(plan), BY_NAME[StageName.COMPILE].seconds(plan)
    # torchrun's agent hosts the store (it says so with TORCHELASTIC_USE_AGENT_STORE), else rank 0 does
    _, meeting = _meeting(plan.case, compile_seconds + golden_seconds,
                          host=rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")
    meeting.set(f"ready/{rank}", "1")
    if late := _wait(meeting, [f"ready/{r}" for r in range(world)], compile_seconds):
        return RankVerdict(Verdict.FAIL, f"{what}: ranks {', '.join(k.split('/')[1] for k in late)} never came "
                                         "(launch them all)")
    ran = threading.Event()
    threading.Thread(target=_end_when_judged, daemon=True,
                     args=(plan.case, 2 * (plan.timeout + ranks.JOIN_SECONDS) + golden_seconds, ran)).start()
    me = ranks.Rank(rank, world)
    result: ranks.RankResult | ranks.RankFailure
    try:
        me.join(artifact.device, plan.timeout, meeting=dist.PrefixStore("group/", meeting))  # type: ignore[attr-defined, unused-ignore]
        result = me.run(call_kernel, artifact, placement.args[rank])
        placement.check_inputs_untouched(inputs, what)
        placement.check_guards(what)
    except StageFailed as exc:
        result = ranks.RankFailure(me.phase, False, str(exc))
    except Exception as exc:  # noqa: BLE001 -- judged on rank 0 with every rank's outcome
        result = me.failure(exc)
    ran.set()
    # reports go through the store, not the group: a failed group cannot carry them
    # torch's stub declares str values; the store takes bytes too (and gives bytes back: meeting.get)
    meeting.set(f"report/{rank}", pickle.dumps((result, placement.sent(rank))))  # type: ignore[arg-type]
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank == 0:
        keys = [f"report/{r}" for r in range(world)]
        missing = _wait(meeting, keys, plan.timeout + ranks.JOIN_SECONDS)  # a stuck collective times out first
        reports = [None if k in missing else pickle.loads(meeting.get(k)) for k in keys]
        meeting.set("verdict", _judge(case, placement, reports, what, lambda: outputs(StageName.GOLDEN)[0], inputs,
                                      plan.timeout + ranks.JOIN_SECONDS).to_json())
        _wait(meeting, [f"done/{r}" for r in range(1, world)], GRACE_SECONDS)  # this process may host the store
    elif _wait(meeting, ["verdict"], plan.timeout + ranks.JOIN_SECONDS + golden_seconds):
        return RankVerdict(Verdict.FAIL, "rank 0 gave no verdict")
    verdict = RankVerdict.from_json(meeting.get("verdict").decode())
    meeting.set(f"done/{rank}", "1")
    return verdict


def _judge(case: Case, placement: ranks.Placement, reports: list[Any], what: str, golden: Callable[[], Outputs],
           inputs: Outputs, waited: float) -> RankVerdict:
    """Rank 0: the verdict from every rank's (outcome, outputs), or None for a rank that sent no
    report in `waited` seconds."""
    outcomes = [Outcome(Ended.HUNG, waited) if report is None else Outcome(Ended.RETURNED, report[0])
                for report in reports]
    if not all(isinstance(o.value, ranks.RankResult) for o in outcomes):
        return RankVerdict(Verdict.FAIL, ranks.verdict(outcomes, what))
    for r, (_, sent) in enumerate(reports):
        placement.receive(r, sent)
    try:
        expected = golden()
        if expected.skipped:
            return RankVerdict(Verdict.SKIPPED, expected.skipped)
        judge(case.policy(), placement.outputs(what), expected.tensors, case.name,
              cast(InputsMeta, inputs.meta).nonfinite,  # the inputs stage's meta type (stage_table: Stage.meta)
              case.placement(), blank(expected, inputs))
    except VerificationFailure as exc:
        return RankVerdict(Verdict.FAIL, str(exc))
    return RankVerdict(Verdict.PASS)


def main(root: Path, case_name: str) -> int:
    """`golden-tasks rank CASE`: print this rank's verdict (rank 0) and return its exit status."""
    try:
        status, said = verify(root, case_name)
    except LaunchError as exc:
        print(f"golden-tasks rank: {exc}", file=sys.stderr)
        return 2
    if os.environ["RANK"] == "0":
        print(said)
    return status
