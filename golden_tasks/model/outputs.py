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
from typing import Self

POLICY_FILE = "policy.pkl"  # policy: the case's validation policy (cloudpickle, its user code by value)
SAMPLES_FILE = "samples.json"  # bench, golden_bench: their timings' round times (Stats.split)
_SAMPLED = ("times", "outliers")  # a timing's lists of round times: samples, not summary


@dataclasses.dataclass(frozen=True)
class Meta:
    """The meta every stage has: `skipped` is None, or why the stage did not do its work."""
    skipped: str | None = None

    @classmethod
    def of(cls, entry) -> Self:
        """The typed meta of a stored entry (storage.entry.Entry)."""
        return cls(**entry.meta)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AbiMeta(Meta):
    table: list = dataclasses.field(default_factory=list)  # one row per parameter: name, kind, direction, ...
    placement: dict = dataclasses.field(default_factory=dict)  # name -> TensorSpec.resident, where one is set


@dataclasses.dataclass(frozen=True)
class CompileMeta(Meta):
    backend: str | None = None
    module: str | None = None  # where the artifact's class lives (forms.Artifact.restore)
    table: list = dataclasses.field(default_factory=list)  # the parameter table the artifact embeds
    device: str = "cpu"  # where the artifact's tensors live: "cuda" asks an executor for a GPU
    config: dict = dataclasses.field(default_factory=dict)  # what compile chose (forms.Artifact.config)


@dataclasses.dataclass(frozen=True)
class DispatchMeta(Meta):
    # what the kernel returned that is none of its arguments ("a new float32 tensor of shape (8, 8)"): a
    # kernel that returns its result leaves its Out unwritten (validate says why)
    returned: str | None = None


@dataclasses.dataclass(frozen=True)
class InputsMeta(Meta):
    scalars: dict = dataclasses.field(default_factory=dict)  # name -> value
    nonfinite: dict = dataclasses.field(default_factory=dict)  # name -> "N NaN/Inf, first at (i, j)"


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ValidateMeta(Meta):
    outputs: list = dataclasses.field(default_factory=list)  # compare.Comparison.to_json() per output
    max_abs: float | None = None
    # comparisons that cannot catch a wrong kernel (a golden a kernel writing zeros would match): the
    # report flags them; they do not fail the case
    warnings: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class BenchMeta(Meta):
    """What the benchmark checked besides timing: its last timed round's outputs against the golden, and
    the kernel's outputs on the second input set (inputs2) in the same processes, so a kernel right only
    on its first call, or one returning a result it cached, fails. `second_set` is "checked" or why not."""
    second_set: str | None = None
    caveat: str | None = None  # why its timing is no performance figure (Artifact.timing_caveat), if it is not


@dataclasses.dataclass(frozen=True)
class Stats:
    """Timings, outside the entry's digest. A timing is stages.summary's: min, median, mean, max, std,
    iqr, the noise floor reached (rse), outliers and every round's time in microseconds, with its rounds,
    warmup and why it stopped; and where it was measured (threads, device). A stored entry's stats hold
    the summary (split): its round times are in the entry's SAMPLES_FILE."""
    seconds: float | None = None  # the stage's own run (set by the graph)
    golden_us: dict | None = None  # golden_bench: the golden function's timing
    kernel_us: dict | None = None  # bench: the kernel's timing
    node: dict | None = None  # the machine that ran the stage (toolchain.hardware; set by the graph)

    @classmethod
    def of(cls, entry) -> "Stats":
        return cls(**entry.stats)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def split(self) -> tuple["Stats", dict]:
        """(the stats with each timing summarised, the samples: field -> its round times, or {} when none).
        An entry keeps the summary in its stats and the samples in its object SAMPLES_FILE, which only what
        draws them reads (joined)."""
        timings = {f: split_timing(t) for f in ("golden_us", "kernel_us") if (t := getattr(self, f))}
        summaries = {f: summary for f, (summary, _) in timings.items()}
        return (dataclasses.replace(self, golden_us=summaries.get("golden_us", self.golden_us),
                                    kernel_us=summaries.get("kernel_us", self.kernel_us)),
                {f: samples for f, (_, samples) in timings.items()})


def split_timing(timing: dict) -> tuple[dict, dict]:
    """(summary, samples) of a timing (stages.summary's; a multi-rank one has each rank's under "ranks"): the
    round times and the outliers' times go to samples, and the summary counts the outliers."""
    summary = {k: v for k, v in timing.items() if k not in _SAMPLED}
    if "outliers" in timing:
        summary["outliers"] = len(timing["outliers"])
    samples = {k: timing[k] for k in _SAMPLED if k in timing}
    if "ranks" in timing:
        parts = [split_timing(rank) for rank in timing["ranks"]]
        summary["ranks"], samples["ranks"] = [p[0] for p in parts], [p[1] for p in parts]
    return summary, samples


def join_timing(summary: dict, samples: dict) -> dict:
    """The timing that split_timing split."""
    joined = {**summary, **{k: v for k, v in samples.items() if k != "ranks"}}
    if "ranks" in summary:
        joined["ranks"] = [join_timing(s, r) for s, r in zip(summary["ranks"], samples.get("ranks", []))]
    return joined


@dataclasses.dataclass
class Outputs:
    """What a stage returns: tensors and files (name -> tensor / path), its typed meta and stats."""
    tensors: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)
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
