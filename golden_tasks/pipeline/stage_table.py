"""The stages, each declared once: the only place a stage's name is spelled.

A Stage says everything the rest of golden-tasks asks of it: the upstream
stages it reads (their digests enter its key, their outputs are its argument)
and the plan fields in its key, whether it runs user code and where (an
isolated child, or one confined to its inputs), how long it may take, the type
of its meta, the timing it measures, what a runtime dir keeps of it and what a
replay does with it, and the module whose `run` computes it. Code elsewhere
names a stage by its StageName member (a str: entries, JSON records and doit's
task names hold the same text); tests/test_layers.py fails on a stage name
spelled as a string anywhere else in golden_tasks/.
"""
import dataclasses
import enum
from collections.abc import Callable

from ..model.outputs import (
    AbiMeta,
    BenchMeta,
    CompileMeta,
    DispatchMeta,
    GoldenMeta,
    InputsMeta,
    MachineMeta,
    Meta,
    ValidateMeta,
)
from ..model.plan import FIELDS, KEYED_EVERYWHERE, KEYED_WITH_USER_CODE, BenchSettings, Plan


class StageName(enum.StrEnum):
    CALIBRATE = "calibrate"
    ABI = "abi"
    COMPILE = "compile"
    INPUTS = "inputs"
    GOLDEN = "golden"
    DISPATCH = "dispatch"
    POLICY = "policy"
    VALIDATE = "validate"
    INPUTS2 = "inputs2"
    GOLDEN2 = "golden2"
    BENCH = "bench"
    GOLDEN_BENCH = "golden_bench"


class InReplay(enum.Enum):
    """What a replay of a runtime dir does with a stage (pipeline/replay.py)."""
    SAVED = "its outputs are saved in the dir and read back"
    RUN = "run again on the saved outputs"
    LEFT_OUT = "not part of a replay"


@dataclasses.dataclass(frozen=True)
class Stage:
    name: StageName
    doc: str
    module: str  # the module whose run(case, plan, workdir, upstream) computes it
    reads: tuple[StageName, ...] = ()  # upstream stages: their digests enter the key, their outputs are its Upstream
    after: tuple[StageName, ...] = ()  # ordering only
    # the plan fields in its key, besides KEYED_EVERYWHERE and (user_code) KEYED_WITH_USER_CODE
    fields: tuple[str, ...] = ()
    user_code: bool = True  # reads or runs the case's code: the files and variables it declares enter the key
    isolated: bool = True  # runs in an isolated child (forms.isolate): a crash, an exit or a hang fails it alone
    confined: bool = False  # runs the kernel's own code: in a confined child that writes nothing but its outputs
    # its run is handed the case (imported or unpickled in its child): only an isolated stage, never one a replay runs
    loads_case: bool = True
    torch: bool = True  # computes with torch (its worker sizes the thread pools first)
    # isolated stages: plan -> seconds its run may take before it counts as hung
    budget: Callable[[Plan], float] | None = None
    meta: type[Meta] = Meta  # the type of its outputs' meta (golden_tasks.model.outputs)
    timing: str | None = None  # the Stats field of the time it measures: the machine then enters its key
    measures: bool = False  # its outputs describe this machine (a timing stage's do too): the machine enters its key
    # its key holds the case (even the nonce of a plan with parts that cannot be fingerprinted), and the summary
    # table has a column for it: not calibrate's, whose one entry per machine class every case shares
    per_case: bool = True
    folder: str | None = None  # where a runtime dir keeps its tensors
    replay: InReplay = InReplay.RUN

    @property
    def on_machine(self) -> bool:
        """Whether its outputs are measurements of the machine it ran on, which its key then holds."""
        return self.measures or bool(self.timing)

    @property
    def plan_fields(self) -> tuple[str, ...]:
        """The plan fields that enter this stage's key, in the plan's order."""
        keyed = {*self.fields, *(KEYED_EVERYWHERE if self.per_case else ()),
                 *(KEYED_WITH_USER_CODE if self.user_code else ())}
        return tuple(f for f in FIELDS if f in keyed)

    def seconds(self, plan: Plan) -> float:
        """How long its isolated run may take before it counts as hung (its budget)."""
        if self.budget is None:
            raise TypeError(f"the {self.name} stage runs in its caller's process: it has no budget")
        return self.budget(plan)


MACHINE_SECONDS = 300.0  # what measuring a machine may take (stages.machine: seconds on a busy one)

# Seconds a compile may spend in the compiler itself, beyond the case's timeout for each of the
# two runs of the kernel body (the write check and the trace).
COMPILE_SECONDS = 1800.0


def _making(plan: Plan) -> float:
    """Seconds to make a case's tensors and run its golden once."""
    return plan.timeout * (1 + len(plan.specs))


def _timing(plan: Plan) -> float:
    """Seconds a timing of the golden may take (BenchSettings.longest)."""
    return BenchSettings(**plan.bench).longest(plan.timeout) + _making(plan)


_INPUT_FIELDS = ("specs", "seed", "data_in")  # what makes an input set
_GOLDEN_FIELDS = ("specs", "seed", "golden")  # what makes the golden's outputs on one

STAGES = (
    # reads nothing of a case: one entry per machine class, which every case's benchmark reads (a replay's
    # benchmark, on whatever machine replays it, is held to no floor)
    Stage(StageName.CALIBRATE, "measure this machine's memory bandwidth and FLOP rates",
          "golden_tasks.stages.calibrate",
          user_code=False, loads_case=False, budget=lambda plan: MACHINE_SECONDS, meta=MachineMeta, measures=True,
          per_case=False, replay=InReplay.LEFT_OUT),
    Stage(StageName.ABI, "check the specs against the kernel's parameter table", "golden_tasks.stages.abi",
          fields=("params", "signature", "ranks"), user_code=False, isolated=False, loads_case=False, torch=False,
          meta=AbiMeta,
          replay=InReplay.SAVED),
    # reads none of the ABI's output (its shapes): a kernel built once for any shapes is built once for a sweep
    Stage(StageName.COMPILE, "compile the kernel for the spec shapes (scalar values are compiled in)",
          "golden_tasks.stages.compile", after=(StageName.ABI,),
          fields=("compiled_for", "kernel", "backend", "ranks", "options"),
          budget=lambda plan: COMPILE_SECONDS + 2 * plan.timeout, meta=CompileMeta, confined=True,
          replay=InReplay.SAVED),
    Stage(StageName.INPUTS, "generate the seeded In/InOut tensors (or read them from a data dir)",
          "golden_tasks.stages.inputs", reads=(StageName.ABI,), fields=_INPUT_FIELDS, budget=_making,
          meta=InputsMeta, folder="data/in", replay=InReplay.SAVED),
    Stage(StageName.GOLDEN, "run the golden on the inputs (or read its outputs from a data dir)",
          "golden_tasks.stages.golden", reads=(StageName.ABI, StageName.INPUTS), fields=(*_GOLDEN_FIELDS, "data_out"),
          budget=_making, meta=GoldenMeta, folder="data/golden", replay=InReplay.SAVED),
    Stage(StageName.DISPATCH, "run the compiled kernel on the inputs", "golden_tasks.stages.dispatch",
          reads=(StageName.ABI, StageName.COMPILE, StageName.INPUTS), fields=("ranks", "resources"),
          isolated=False, loads_case=False, meta=DispatchMeta, folder="data/out"),
    Stage(StageName.POLICY, "save the case's validation policy (comparators, tolerances) with its user code",
          "golden_tasks.stages.policy", fields=("policy",), torch=False, budget=lambda plan: plan.timeout,
          replay=InReplay.SAVED),
    # judges with the saved policy (its comparators user code by value, hence isolated), never the case's own
    Stage(StageName.VALIDATE, "compare the kernel's outputs with the golden's", "golden_tasks.stages.validate",
          reads=(StageName.ABI, StageName.DISPATCH, StageName.GOLDEN, StageName.INPUTS, StageName.POLICY),
          loads_case=False, budget=lambda plan: 2 * plan.timeout, meta=ValidateMeta),
    Stage(StageName.INPUTS2,
          "a second input set (seed + 1) for the benchmark's recheck, and sets it meets once (seed + 2...)",
          "golden_tasks.stages.inputs2", reads=(StageName.ABI,), fields=_INPUT_FIELDS, budget=_making,
          meta=InputsMeta, folder="data/in2", replay=InReplay.SAVED),
    Stage(StageName.GOLDEN2, "run the golden on the second input set", "golden_tasks.stages.golden2",
          reads=(StageName.ABI, StageName.INPUTS2), fields=(*_GOLDEN_FIELDS, "data_out"), budget=_making,
          folder="data/golden2", replay=InReplay.SAVED),
    Stage(StageName.BENCH, "time the kernel; recheck its last timed round and its outputs on the second input set",
          "golden_tasks.stages.bench",
          reads=(StageName.ABI, StageName.COMPILE, StageName.INPUTS, StageName.GOLDEN, StageName.POLICY,
                 StageName.VALIDATE, StageName.INPUTS2, StageName.GOLDEN2, StageName.CALIBRATE),
          fields=("ranks", "resources", "bench", "work"), isolated=False, loads_case=False, meta=BenchMeta,
          timing="kernel_us"),
    Stage(StageName.GOLDEN_BENCH, "time the golden on the inputs", "golden_tasks.stages.golden_bench",
          reads=(StageName.ABI, StageName.INPUTS), after=(StageName.GOLDEN,),
          fields=(*_GOLDEN_FIELDS, "resources", "bench"), budget=_timing, timing="golden_us",
          replay=InReplay.LEFT_OUT),
)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def _of_kernel() -> tuple[Stage, ...]:
    found: list[Stage] = []
    for stage in STAGES:  # in graph order: what a stage reads comes before it
        if "kernel" in stage.plan_fields or any(BY_NAME[name] in found for name in stage.reads):
            found.append(stage)
    return tuple(found)


# The stages whose key holds the kernel, directly or through what they read: those a baseline has of its own
# (Case.baselines). A baseline shares every other stage with its case: the same plan fields make the same keys.
KERNEL_STAGES = _of_kernel()
