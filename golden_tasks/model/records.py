"""The files golden-tasks writes for people and scripts to read, as types declared once: the run record (runs/
report.json: a RunRecord holds a CaseRow per case, and a row the kernel's and the golden's Timing), a runtime dir's
Manifest (runs/<case>/manifest.json), and the record of an object in the store (StoredObject, StoredTensor).

report builds the record (in the doit parent, and in golden_tasks.run); the JUnit writer, the HTML page,
`compare` and `golden-tasks watch` read it; runtime writes a Manifest, replay and data read it. `to_json`
is the one writer and `from_json` the one reader of each: a value of the wrong kind, or a field the type
does not declare (a misspelling), is a BadRecord naming where it is (`cases[0].kernel_timing.median`); a
field a file from an older version lacks takes its default. docs/reports.md says what each field means.
"""
import dataclasses
import functools
import json
import math
import statistics
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from .rows import ParamRow, Row
from .verdicts import StageState, Verdict

# how a field's value is read: (the JSON value, where it is) -> the field's value
_Read = Callable[[Any, str], Any]


class BadRecord(ValueError):
    """A file or value that is not a run record (or part of one); the message names the file and the field."""


def _shown(value: object) -> str:
    return json.dumps(value)[:80]


def _number(value: Any, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise BadRecord(f"{where}: expected a finite number >= 0, got {_shown(value)}")
    return value


def _count(value: Any, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRecord(f"{where}: expected a count (an integer >= 0), got {_shown(value)}")
    return value


def _of_kind(kind: type) -> "_Read":
    def check(value: Any, where: str) -> Any:
        if not isinstance(value, kind):
            raise BadRecord(f"{where}: expected {_KIND_NAMES[kind]}, got {_shown(value)}")
        return value
    return check


_KIND_NAMES = {str: "text", bool: "true or false", list: "a list", dict: "an object"}
_READERS: dict[type, _Read] = {float: _number, int: _count, **{kind: _of_kind(kind) for kind in _KIND_NAMES}}


def _reader(kind: Any) -> _Read:
    """How a value declared as `kind` is read: a word of an enum, a nested record or row (from_json), a mapping
    of words (dict[str, StageState]), or a plain JSON value checked for its kind."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if typing.get_origin(kind) is dict and typing.get_args(kind)[1] is Any:  # dict[str, Any]: as a bare dict
        return _object
    if typing.get_origin(kind) is dict:
        item = _or_none(_reader(typing.get_args(kind)[1]))
        return lambda value, where: {k: item(v, f"{where}.{k}") for k, v in _object(value, where).items()}
    if typing.get_origin(kind) is list:
        item = _or_none(_reader(typing.get_args(kind)[0]))
        return lambda value, where: [item(v, f"{where}[{i}]") for i, v in enumerate(_list(value, where))]
    if isinstance(kind, type) and issubclass(kind, JsonRecord):
        return kind.from_json
    if isinstance(kind, type) and issubclass(kind, Row):
        def row(value: Any, where: str) -> Any:
            try:
                return kind.from_json(value, where)
            except ValueError as exc:  # the row names the field
                raise BadRecord(str(exc)) from None
        return row
    if isinstance(kind, type) and issubclass(kind, (Verdict, StageState)):
        def word(value: Any, where: str) -> Any:
            try:
                return kind(value)
            except ValueError:
                raise BadRecord(f"{where}: expected one of {', '.join(kind)}, got {_shown(value)}") from None
        return word
    return _READERS[typing.get_origin(kind) or kind]


_object, _list = _READERS[dict], _READERS[list]


def _or_none(read: _Read) -> _Read:
    """`read`, with None (JSON's null) for any value: a stage without an entry has a key of None."""
    return lambda value, where: None if value is None else read(value, where)


@functools.cache
def _field_readers(cls: type) -> dict[str, _Read]:
    return {name: _or_none(_reader(kind)) for name, kind in typing.get_type_hints(cls).items()
            if not name.startswith("_")}


class JsonRecord:
    """A record type: a kw_only dataclass whose fields are JSON values, enums, nested records, or lists and
    mappings of them. Fields that are None are left out of its JSON when `_OMIT_NONE`."""
    _OMIT_NONE = False
    __dataclass_fields__: typing.ClassVar[dict[str, dataclasses.Field[Any]]]  # each record type is a dataclass

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Self:
        """The record `data` holds; BadRecord (naming `where` and the field) for a value of the wrong kind,
        a missing required field or a field this type does not have."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for name, value in _object(data, where or cls.__name__).items():
            at = f"{where}.{name}" if where else name
            if name not in fields:
                raise BadRecord(f"{at}: not a field of {cls.__name__} (it has {', '.join(fields)})")
            values[name] = _field_readers(typing.cast(type, cls))[name](value, at)
        missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise BadRecord(f"{where or cls.__name__}: missing {', '.join(missing)}")
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and self._OMIT_NONE:
                continue
            out[f.name] = _to_json(value)
        return out


def _to_json(value: Any) -> Any:
    if isinstance(value, (JsonRecord, Row)):
        return value.to_json()
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    return value


def relative_standard_error(times: list[float]) -> float:
    """The standard error of the mean over the mean (inf for fewer than two rounds or a zero mean)."""
    mean = statistics.fmean(times)
    if len(times) < 2 or mean <= 0:
        return math.inf
    return float(statistics.stdev(times) / len(times) ** 0.5 / mean)


def _quartiles(times: list[float]) -> tuple[float, float]:
    """The first and third quartiles (inclusive; one round is all of them)."""
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return q1, q3


def _outliers(times: list[float]) -> list[float]:
    """The times beyond 1.5 IQR of the quartiles."""
    q1, q3 = _quartiles(times)
    fence = 1.5 * (q3 - q1)
    return [t for t in times if t < q1 - fence or t > q3 + fence]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing(JsonRecord):
    """A timing in microseconds: what bench and golden_bench measure (of_rounds), a stage's stats carry
    (outputs.Stats), a run record's row copies and golden_tasks.run returns; and where the kernel's was
    measured. A stored entry keeps its summary in its stats and every round's time (`times`) in its samples
    object (outputs.Stats.split); a row holds the summary and that object's digest (`samples`). Several
    ranks: the summary is of each round's slowest rank, and `ranks` holds each rank's own."""
    _OMIT_NONE = True
    median: float
    min: float | None = None
    mean: float | None = None
    max: float | None = None
    std: float | None = None
    iqr: float | None = None
    rse: float | None = None  # the relative standard error of the mean the timing reached
    outliers: int | None = None  # rounds beyond 1.5 IQR of the quartiles (kept in the figures, only flagged)
    rounds: int | None = None
    warmup: int | None = None
    stopped: str | None = None  # what ended the timing: noise, budget or rounds
    times: list[float] | None = None  # every round's time, in order; not in a summary (split)
    samples: str | None = None  # a row's: the digest of the cache object holding every round's time
    # where the kernel's rounds ran (bench: stages.bench._device, clock_check)
    device: str | None = None
    threads: int | None = None
    name: str | None = None  # a GPU's
    sm_clock_mhz: float | None = None
    cpu: list[float] | None = None  # the process's CPU time in each of the first rounds
    clock: dict[str, float] | None = None  # the clocks bench checked each other against (ms)
    unseen_rounds: int | None = None  # rounds on input sets the kernel had not seen before
    ranks: list["Timing"] | None = None
    imbalance: str | None = None  # why the ranks look imbalanced
    slowest_rounds: int | None = None  # a rank's: in how many rounds it was the slowest
    placed: int | None = None  # a rank's: how many tensors it placed on its device

    @classmethod
    def of_rounds(cls, times: list[float], stopped: str, warmup: int) -> "Timing":
        """The timing of these round times (stages.adaptive_rounds'): min / median / mean / max, std, IQR, the
        noise floor reached (relative standard error of the mean; None below two rounds), the outliers
        (counted: reported, never dropped), the rounds, warmup, why the timing stopped and every round's time."""
        q1, q3 = _quartiles(times)
        return cls(min=min(times), median=statistics.median(times), mean=statistics.fmean(times), max=max(times),
                   std=statistics.stdev(times) if len(times) > 1 else 0.0, iqr=q3 - q1,
                   rse=rse if (rse := relative_standard_error(times)) != math.inf else None,
                   outliers=len(_outliers(times)), rounds=len(times), warmup=warmup, stopped=stopped,
                   times=list(times))

    @property
    def outlier_times(self) -> list[float]:
        """The times of the rounds beyond 1.5 IQR of the quartiles; ValueError for a summary (no `times`)."""
        if self.times is None:
            raise ValueError("a timing's summary holds no round times: join its samples (outputs.Stats.joined)")
        return _outliers(self.times)

    def split(self) -> tuple["Timing", dict[str, Any]]:
        """(its summary: this timing without round times, its samples: {"times": every round's time, and
        "ranks": each rank's samples, for several ranks}), as a stored entry keeps them apart."""
        ranks = [rank.split() for rank in self.ranks or ()]
        samples = {"times": self.times, **({"ranks": [s for _, s in ranks]} if ranks else {})}
        return dataclasses.replace(self, times=None, ranks=self.ranks and [r for r, _ in ranks]), samples

    def joined(self, samples: dict[str, Any]) -> "Timing":
        """The timing `split` split: this summary with the round times in `samples`."""
        return dataclasses.replace(self, times=samples["times"], ranks=self.ranks and [
            rank.joined(s) for rank, s in zip(self.ranks, samples["ranks"])])

    @property
    def median_rse(self) -> float | None:
        """The relative standard error of the median, the one statistic every report and `compare` use:
        sqrt(pi/2) * sigma / sqrt(rounds) / median (the median's asymptotic error), with sigma estimated
        from the IQR (IQR / 1.349), so that outliers, reported and kept, do not inflate it; None with fewer
        than two rounds or without them."""
        if self.rounds is None or self.rounds < 2 or self.iqr is None or not self.median:
            return None
        return float((math.pi / 2) ** 0.5 * (self.iqr / 1.349) / self.rounds ** 0.5 / self.median)

    def describe(self) -> str:
        """The median with the noise of it: "20.00 ±1.0%"."""
        noise = "?" if self.median_rse is None else f"{self.median_rse:.1%}"
        return f"{self.median:.2f} ±{noise}"


@dataclasses.dataclass(kw_only=True)
class Speed(JsonRecord):
    """A case's work, and its timing against it and this machine's limits (CaseRow.speed, made by
    model.machine.speed); docs/performance.md says what each field means."""
    _OMIT_NONE = True
    bytes: int  # the bytes its work moves (model.work.Work.bytes)
    bytes_from: str  # "specs" or "declared"
    flops: float | None = None
    flops_from: str | None = None  # "counted" (the golden's run) or "declared"
    working_set: int  # bytes of every tensor it reads and writes: where on the bandwidth curve it sits
    dtype: str | None = None  # the dtype its FLOP rate is taken at
    gbps: float | None = None  # achieved, from the kernel's median
    tflops: float | None = None
    intensity: float | None = None  # FLOPs per byte
    peak_gbps: float | None = None  # the machine's, at its working set
    peak_tflops: float | None = None  # at its dtype
    sol_us: float | None = None  # the speed-of-light time
    bound: str | None = None  # which limit sets sol_us: "memory" or "compute"
    sol: float | None = None  # sol_us / the median: 1.0 is at the limit
    sol_err: float | None = None  # its 1-sigma uncertainty, from the timing's spread
    device: str | None = None


@dataclasses.dataclass(kw_only=True)
class CaseRow(JsonRecord):
    """One case's summary in a run (pipeline.summary.case_row); docs/reports.md describes each field."""
    case: str
    status: Verdict
    stages: dict[str, StageState] = dataclasses.field(default_factory=dict)  # each stage's state in the run
    reason: str | None = None  # a FAIL's line that matters
    skipped: str | None = None  # why a SKIPPED case was not verified here
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # stage -> its full failure message
    log: str | None = None  # the file holding every message of a case that failed
    max_abs: float | None = None  # the largest finite absolute error of its outputs
    # a failed validation's elements the kernel left unwritten, or made NaN or infinite where the golden's are finite
    unwritten: int | None = None
    nan: int | None = None
    inf: int | None = None
    outputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # compare.Comparison.to_json() per output
    warnings: list[str] = dataclasses.field(default_factory=list)
    kernel_us: float | None = None  # the kernel's median, and the golden's (outside the table)
    caveat: str | None = None  # why the kernel's time is no performance figure (an emulator ran it)
    golden_us: float | None = None
    baseline_of: str | None = None  # a baseline's row (Case.baselines): the case it is a baseline of
    sweep_of: str | None = None  # a point's row (Case.sweep): its sweep, and its value on each axis as named
    point: dict[str, Any] = dataclasses.field(default_factory=dict)
    dataset: dict[str, Any] = dataclasses.field(default_factory=dict)  # a dataset's case: Plan.dataset
    # the first of the case's baselines that passed (its name), the ratio of its median to the kernel's, and that
    # ratio's 1-sigma uncertainty; a record from before baselines: None, its speedup over the golden's median
    baseline: str | None = None
    speedup: float | None = None
    speedup_err: float | None = None
    kernel_timing: Timing | None = None
    golden_timing: Timing | None = None
    rank_us: list[float] | None = None  # several ranks: each rank's median
    imbalance: str | None = None
    keys: dict[str, str | None] = dataclasses.field(default_factory=dict)  # stage -> its entry's content key
    fingerprints: dict[str, str] = dataclasses.field(default_factory=dict)  # kernel, golden, policy
    seconds: float | None = None  # what the stages that ran in this run took
    golden_protected: bool | None = None
    # what compile chose that the source does not say: an autotuned Triton kernel's configuration
    config: dict[str, Any] | None = None
    # its work and what its timing makes of it against this machine's limits (model.machine.Speed)
    speed: Speed | None = None

    @property
    def speedup_over(self) -> str:
        """What the speedup is over: the baseline's name, or for a record from before baselines, the golden."""
        return self.baseline or "the golden's median"

    def max_error(self) -> str:
        """The `max err` of the summary: what is worst about the outputs (elements unwritten, NaN, infinite:
        "896 unwritten"), else the largest absolute error ("2.22e-16"); "-" without a comparison."""
        found = [f"{n} {what}" for n, what in ((self.unwritten, "unwritten"), (self.nan, "NaN"), (self.inf, "inf"))
                 if n]
        return ", ".join(found) or ("-" if self.max_abs is None else f"{self.max_abs:.2e}")


@dataclasses.dataclass(kw_only=True)
class RunRecord(JsonRecord):
    """A run: its rows in library order, when and where it ran. Whether it `passed` and its `counts` follow
    from the rows: written for scripts, not read back."""
    cases: list[CaseRow]
    started: float | None = None  # Unix times
    finished: float | None = None
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)  # toolchain.machine()
    toolchain: dict[str, Any] = dataclasses.field(default_factory=dict)
    # the figures the project declares for its devices ([tool.golden-tasks.machine]), which the rows' speeds
    # use instead of the measured ones
    declared: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """No case failed (FAIL or INCOMPLETE); skips are not failures."""
        return not any(row.status.failed for row in self.cases)

    @property
    def counts(self) -> dict[Verdict, int]:
        """How many cases have each status, worst first (those that occur)."""
        found = [row.status for row in self.cases]
        return {status: found.count(status) for status in Verdict if status in found}

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> Self:
        if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
            raise BadRecord(f"{where}: " * bool(where) + "not a golden-tasks run record (runs/report.json): it has "
                            "no list of cases")
        return super().from_json({k: v for k, v in data.items() if k not in ("passed", "counts")}, where)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "passed": self.passed, "counts": self.counts}

    @classmethod
    def read(cls, path: Path) -> "RunRecord":
        """The record in the file `path`; BadRecord naming the file (and the field) when it is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise BadRecord(f"{path}: cannot read it: {exc.strerror or exc}") from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise BadRecord(f"{path}: not JSON: {exc}") from None
        try:
            return cls.from_json(data)
        except BadRecord as exc:
            raise BadRecord(f"{path}: {exc}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoredObject(JsonRecord):
    """Bytes the store holds as an object (storage.store), as what uses them records them: a store entry's
    objects, a runtime dir's files. A file that no longer has this size and digest is damaged."""
    digest: str  # of the bytes (hashing.digest_bytes): the object's name in the store
    nbytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoredTensor(StoredObject):
    """A tensor's raw little-endian bytes in C order (storage.tensors), with what makes them a tensor again."""
    dtype: str  # specs.dtype_name
    shape: list[int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SavedArtifact(JsonRecord):
    """The compiled kernel a runtime dir keeps: how to restore it (CompileMeta's backend, module and table)
    and its files, under artifact/."""
    backend: str | None
    module: str | None
    table: list[ParamRow]
    files: dict[str, StoredObject]  # relative path (artifact/<name>) -> the file


MANIFEST = "manifest.json"
MANIFEST_FORMAT = 3  # 2: the second input set (data/in2, data/golden2); 3: policy.pkl in every dir


@dataclasses.dataclass(kw_only=True)
class Manifest(JsonRecord):
    """A runtime dir's manifest.json (golden_tasks.pipeline.runtime): what its run was, and every file's digest."""
    format: int
    case: str
    module: str | None = None  # None: defined by golden_tasks.run, not in a kernel module
    profile: str | None = None
    keys: dict[str, str | None]  # stage -> the key of the entry the run used
    fingerprints: dict[str, Any]  # plan field -> its fingerprint (runtime.FINGERPRINTS), "parts" -> what they hash
    toolchain: dict[str, Any]
    pipeline: str
    table: list[ParamRow]  # the parameter table (AbiMeta.table)
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> where a tensor is resident
    bench: dict[str, Any]  # the plan's BenchSettings
    timeout: float | None = None
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # saved stage -> why it skipped
    artifact: SavedArtifact
    tensors: dict[str, StoredTensor]  # relative path -> the tensor's file (data/<folder>/<name>.bin)
    files: dict[str, StoredObject]  # other files (policy.pkl)
    mtimes: dict[str, int] = dataclasses.field(default_factory=dict)  # relative path -> st_mtime_ns when written

    def recorded(self) -> dict[str, StoredObject]:
        """Every file of the runtime dir by relative path, but the manifest and report."""
        return {**self.tensors, **self.artifact.files, **self.files}

    @classmethod
    def read(cls, case_dir: Path) -> "Manifest":
        """The manifest of the runtime dir `case_dir`; BadRecord saying what it is not."""
        path = Path(case_dir) / MANIFEST
        try:
            data = json.loads(path.read_text())
        except OSError:
            raise BadRecord(f"{case_dir} is not a runtime dir: no {MANIFEST}") from None
        except ValueError as exc:
            raise BadRecord(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise BadRecord(f"{case_dir} was written by another version of golden-tasks (format "
                            f"{data.get('format') if isinstance(data, dict) else None}, this one reads "
                            f"{MANIFEST_FORMAT}): verify the case again to rewrite it")
        try:
            return cls.from_json(data)
        except BadRecord as exc:
            raise BadRecord(f"{path}: {exc}") from None
