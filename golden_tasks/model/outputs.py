"""What each stage produces, declared once.

A stage returns Outputs: tensors and files (stored as objects, by name), a typed
`meta` (deterministic: it enters the entry's digest, so downstream keys follow
it) and `stats` (timings: informational, outside the digest). The meta type
each stage declares (graph.Stage.meta) is the one way to read it, in a stage
downstream, a report, a runtime dir or a replay: `ValidateMeta.of(entry)`.

Tensors are named by their parameter: inputs holds the In and InOut tensors,
golden and dispatch the Out and InOut ones. Files: compile's are the artifact's
own (forms.Artifact.files); policy's is POLICY_FILE.

A stage that cannot do its work says why in `skipped` (no golden; no device for
a CUDA kernel), and a stage that reads a skipped one skips with its reason.
Skipped is never passed.
"""
import dataclasses
from typing import Any, Protocol, Self

from .machine import Limits
from .records import JsonRecord, Timing
from .rows import ParamRow, as_json, fields_from_json, rows_field

POLICY_FILE = "policy.pkl"  # policy: the case's validation policy (cloudpickle, its user code by value)
SAMPLES_FILE = "samples.json"  # bench, golden_bench: their timings' round times (Stats.split)


class _Entry(Protocol):
    """What Meta.of and Stats.of read of a stored entry (storage.entry.Entry; model does not import storage)."""
    @property
    def meta(self) -> dict[str, Any]: ...

    @property
    def stats(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class Meta:
    """The meta every stage has: `skipped` is None, or why the stage did not do its work."""
    skipped: str | None = None

    @classmethod
    def of(cls, entry: _Entry) -> Self:
        """The typed meta of a stored entry (storage.entry.Entry)."""
        return cls(**fields_from_json(cls, entry.meta))

    def to_json(self) -> dict[str, Any]:
        return as_json(self)


@dataclasses.dataclass(frozen=True)
class AbiMeta(Meta):
    table: list[ParamRow] = rows_field(ParamRow)  # the checked parameter table, stamped with directions
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> TensorSpec.resident, where one is set


@dataclasses.dataclass(frozen=True)
class CompileMeta(Meta):
    backend: str | None = None
    module: str | None = None  # where the artifact's class lives (forms.Artifact.restore)
    table: list[ParamRow] = rows_field(ParamRow)  # the parameter table the artifact embeds
    device: str = "cpu"  # where the artifact's tensors live: "cuda" asks an executor for a GPU
    config: dict[str, Any] = dataclasses.field(default_factory=dict)  # what compile chose (forms.Artifact.config)


@dataclasses.dataclass(frozen=True)
class DispatchMeta(Meta):
    # what the kernel returned that is none of its arguments ("a new float32 tensor of shape (8, 8)"): a
    # kernel that returns its result leaves its Out unwritten (validate says why)
    returned: str | None = None


@dataclasses.dataclass(frozen=True)
class GoldenMeta(Meta):
    # the floating-point operations the golden's run did, as torch.utils.flop_counter counts them (matmuls,
    # convolutions, attention); 0 where it counts none; None where no golden ran (outputs read from a data dir)
    flops: int | None = None


@dataclasses.dataclass(frozen=True)
class MachineMeta(Meta):
    limits: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # machine.Limits.to_json() per device

    def of_device(self, device: str, threads: int | None, declared: dict[str, Any] | None = None) -> Limits | None:
        """The limits measured for `device` ("cpu" or "cuda") with `threads` threads (a CPU's: those measured with
        the fewest threads that are not fewer, else with the most), or None; `declared`: a project's figures by
        device (project.layout.Layout.machine), which they then hold (Limits.declared)."""
        found = sorted((Limits.from_json(record, "limits") for record in self.limits if record.get("device") == device),
                       key=lambda limits: limits.threads or 0)
        enough = [limits for limits in found if (limits.threads or 0) >= (threads or 0)]
        limits = enough[0] if enough else found[-1] if found else None
        return limits.with_declared(declared or {}) if limits else None


@dataclasses.dataclass(frozen=True)
class InputsMeta(Meta):
    scalars: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> value
    nonfinite: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> "N NaN/Inf, first at (i, j)"


@dataclasses.dataclass(frozen=True)
class Worst:
    """What a validation found at worst over a case's outputs, as its summary shows it (records.CaseRow:
    `max err`): how many elements of the kernel's outputs it left unwritten, or made NaN or infinite where
    the golden's are finite, and the largest absolute error over the elements it compared whose difference
    is finite (None: none was compared)."""
    max_abs: float | None = None
    unwritten: int = 0
    nan: int = 0
    inf: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ValidateMeta(Meta):
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # compare.Comparison.to_json() per output
    max_abs: float | None = None
    # comparisons that cannot catch a wrong kernel (a golden a kernel writing zeros would match): the
    # report flags them; they do not fail the case
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class BenchMeta(Meta):
    """What the benchmark checked besides timing: its last timed round's outputs against the golden, and
    the kernel's outputs on the second input set (inputs2) in the same processes, so a kernel right only
    on its first call, or one returning a result it cached, fails. `second_set` is "checked" or why not."""
    second_set: str | None = None
    caveat: str | None = None  # why its timing is no performance figure (Artifact.timing_caveat), if it is not


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stats(JsonRecord):
    """What a stage measured, outside the entry's digest: its timing (records.Timing), how long it ran and on
    what machine. A stored entry's stats hold each timing's summary: its round times are in the entry's
    SAMPLES_FILE (split)."""
    _OMIT_NONE = True
    seconds: float | None = None  # the stage's own run (set by the graph)
    golden_us: Timing | None = None  # golden_bench: the golden function's timing
    kernel_us: Timing | None = None  # bench: the kernel's timing
    node: dict[str, Any] | None = None  # the machine that ran the stage (toolchain.hardware; set by the graph)

    @classmethod
    def of(cls, entry: _Entry) -> "Stats":
        """The typed stats of a stored entry (storage.entry.Entry); BadRecord naming a field that is not."""
        return cls.from_json(entry.stats, "stats")

    def split(self) -> tuple["Stats", dict[str, Any]]:
        """(the stats with each timing summarised, the samples: field -> its round times, or {} when none).
        An entry keeps the summary in its stats and the samples in its object SAMPLES_FILE, which only what
        draws them reads (joined)."""
        timed = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), Timing)]
        parts = {name: getattr(self, name).split() for name in timed}
        return (dataclasses.replace(self, **{name: summary for name, (summary, _) in parts.items()}),
                {name: samples for name, (_, samples) in parts.items()})

    def joined(self, samples: dict[str, Any]) -> "Stats":
        """The stats `split` split: each timing with its round times from `samples`."""
        return dataclasses.replace(self, **{name: getattr(self, name).joined(s) for name, s in samples.items()})


@dataclasses.dataclass
class Outputs:
    """What a stage returns: tensors and files (name -> tensor / path), its typed meta and stats."""
    tensors: dict[str, Any] = dataclasses.field(default_factory=dict)
    files: dict[str, Any] = dataclasses.field(default_factory=dict)
    meta: Meta = dataclasses.field(default_factory=Meta)
    stats: Stats = dataclasses.field(default_factory=Stats)

    @property
    def skipped(self) -> str | None:
        return self.meta.skipped


@dataclasses.dataclass(frozen=True)
class Upstream:
    """A stage's one argument besides the case, its plan and its work directory: the Outputs of each stage it
    reads (pipeline.stage_table: Stage.reads), None for those it does not."""
    abi: Outputs | None = None
    compile: Outputs | None = None
    inputs: Outputs | None = None
    golden: Outputs | None = None
    dispatch: Outputs | None = None
    policy: Outputs | None = None
    validate: Outputs | None = None
    inputs2: Outputs | None = None
    golden2: Outputs | None = None
    calibrate: Outputs | None = None
