"""The plan of a case: what the task graph knows about it, typed, each field declared once.

A plan is made where the case's module is imported (the planning subprocess, a
worker, `golden_tasks.run`) and travels as JSON to the doit parent, which never
imports kernel modules. Every field declares, in its metadata:

- `source`: "case" (computed from the case's source: a change means the plan is
  stale, see case.live_case), "run" (set for one run: a doit variable, the nonce)
  or "context" (names and settings that no key needs);
- `keyed`: "every" for a field in every stage's key (the nonce), "user_code" for one in the key of every
  stage that runs user code (the files and variables a case declares); the others enter the keys of the
  stages that declare them (pipeline.stage_table: Stage.fields);
- `variables`: the doit variables that override it, with their parser;
- `replay`: what a change since a runtime dir was saved means for its replay
  (the runtime manifest records exactly these fields);
- `every_stage`: readable by every stage outside its key (names for messages,
  the kernel-call timeout); a stage is handed nothing else (StagePlan).

A plan that failed to load (an import error, a bad spec, a duplicate name) is a
FailedPlan, whose `error` says why; a Plan's `error` is None.
"""
import dataclasses
import functools
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from .rows import ParamRow, Row, SignatureRow, as_json, fields_from_json, json_of, rows_field


@dataclasses.dataclass(frozen=True)
class Variable:
    """doit variables that override a field: parse(values by name, old value) -> new value.
    `values` holds only the variables given; parse raises ValueError naming a bad one."""
    names: tuple[str, ...]
    parse: Callable[[dict[str, str], Any], Any]  # (the variables given, the field's value) -> its new value


def _field(source: str, keyed: str | None = None, replay: str | None = None, variable: Variable | None = None,
           every_stage: bool = False, default: Any = None, rows: type[Row] | None = None) -> Any:
    """A Plan field declared with its metadata (the module docstring); `rows`: the row type of a list of rows."""
    meta: dict[str, Any] = {"source": source, "keyed": keyed, "replay": replay, "variable": variable,
                            "every_stage": every_stage}
    if rows is not None:
        return rows_field(rows, **meta)
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# The @jit backends a run or a project may choose (jit's buildable artifacts; test_jit checks they agree).
# Named here so the doit parent checks `backend=` and the table's backend without importing torch.
BACKENDS = ("aoti", "eager")


def _backend(values: dict[str, str], old: str) -> str:
    text = values["backend"]
    if text and text not in BACKENDS:
        raise ValueError(f"doit variable backend={text!r} is not a backend ({', '.join(BACKENDS)}; "
                         "empty: each case's own)")
    return text or old  # backend= (empty): the case's own


def _options(values: dict[str, str], old: dict[str, Any]) -> dict[str, Any]:
    text = values["options"]
    try:
        extra = json.loads(text)
    except ValueError:
        extra = None
    if not isinstance(extra, dict):
        raise ValueError(f"doit variable options={text!r} is not a JSON object")
    return {**old, **extra}  # merged over the case's own options


def _count(least: int) -> Callable[[str, str], int]:
    def parse(name: str, text: str) -> int:
        if not text.isdigit() or int(text) < least:
            raise ValueError(f"doit variable {name}={text!r} is not an integer >= {least}")
        return int(text)
    return parse


def _positive(name: str, text: str, unit: str = "") -> float:
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0:
        raise ValueError(f"doit variable {name}={text!r} is not a number{unit} > 0")
    return value


def _switch(name: str, text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"doit variable {name}={text!r} is not 0 or 1")
    return text == "1"


@dataclasses.dataclass(kw_only=True)
class BenchSettings:
    """How long the kernel and the golden are timed, declared once: a Case's settings by these names
    (Case inherits them), Plan.bench (as a dict, overridden by the doit variables of _BENCH_VARIABLES)
    and the rule the timing stages follow (stages.adaptive_rounds). `warmup` untimed calls (fewer when
    they alone spend a quarter of the budget), then rounds until the mean's relative standard error is
    at most `rse`, or `budget` seconds of rounds are spent, within `min_rounds` and `max_rounds`;
    `rounds` fixes the count instead (no noise target, no budget). `flush` evicts the last-level cache
    (a GPU's L2) before every round, so each round starts cold."""
    warmup: int = 5
    rounds: int | None = None
    min_rounds: int = 10
    max_rounds: int = 10_000
    rse: float = 0.01
    budget: float = 2.0
    flush: bool = False

    def bench_settings(self) -> dict[str, Any]:
        """These settings by name (Plan.bench)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(BenchSettings)}

    def bench_problem(self) -> str | None:
        """What makes these settings unusable, or None."""
        if self.warmup < 0 or (self.rounds or 1) < 1 or not 1 <= self.min_rounds <= self.max_rounds:
            return "warmup must be >= 0, rounds (when given) >= 1, and 1 <= min_rounds <= max_rounds"
        if not (self.rse > 0 and self.budget > 0):
            return f"rse and budget must be > 0, got {self.rse!r} and {self.budget!r}"
        return None

    @property
    def bounds(self) -> tuple[int, int, float, float]:
        """(least rounds, most rounds, noise target, budget in seconds) in effect."""
        if self.rounds is not None:
            return self.rounds, self.rounds, 0.0, float("inf")
        return self.min_rounds, self.max_rounds, self.rse, self.budget

    def longest(self, timeout: float) -> float:
        """Seconds a timing may take when each call takes up to `timeout`: the warmup, the least rounds,
        and the budget with one more round."""
        least, _, _, budget = self.bounds
        return timeout * (self.warmup + least + 1) + (budget if self.rounds is None else 0.0)


# The benchmark's settings a doit variable overrides (BenchSettings has them all).
_BENCH_VARIABLES: dict[str, Callable[[str, str], Any]] = {"warmup": _count(0), "rounds": _count(1), "rse": _positive,
                    "budget": lambda name, text: _positive(name, text, " of seconds"), "flush": _switch}


def _bench(values: dict[str, str], old: dict[str, Any]) -> dict[str, Any]:
    return {**old, **{name: parse(name, values[name]) for name, parse in _BENCH_VARIABLES.items() if name in values}}


def _fresh(values: dict[str, str], old: bool) -> bool:
    return _switch("fresh", values["fresh"])


def _timeout(values: dict[str, str], old: float) -> float:
    return _positive("timeout", values["timeout"], " of seconds")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A case as the task graph keys it: JSON-able values, and lists of typed rows (params, signature, specs),
    which a key, a manifest and the plan's own JSON hold as the rows' JSON (`field_json`, `to_json`)."""
    case: str = _field("context", every_stage=True)
    module: str | None = _field("context", every_stage=True)  # kernels.<stem>; None for golden_tasks.run
    profile: str | None = _field("context", every_stage=True)
    # a baseline's plan (Case.baselines): the case it is a baseline of, whose plan computes the stages it shares
    # (pipeline.graph.computed_by); a case's plan: the names of its baselines' plans, the first the table's
    baseline_of: str | None = _field("context")
    baselines: list[str] = _field("context", default=[])
    # a point's plan (Case.sweep): the sweep it is a point of, and its value on each axis as its name shows it
    sweep_of: str | None = _field("context")
    point: dict[str, Any] = _field("context", default={})
    # a dataset's case (planning.datasets): where it came from (format, definition or problem, solution, workload)
    # and the sizes it ran at beside the dataset's own where they differ
    dataset: dict[str, Any] = _field("context", default={})
    # in no key: it decides only whether a call counts as hung
    timeout: float = _field("run", variable=Variable(("timeout",), _timeout), every_stage=True, default=60.0)
    params: list[ParamRow] = _field("case", rows=ParamRow,
                                    replay="the kernel's parameter list changed; the saved artifact has the old ABI")
    signature: list[SignatureRow] = _field("case", rows=SignatureRow,
                                           replay="the specs' shapes, dtypes or scalar values changed")
    # the signature with what makes each tensor's initial content (SignatureRow.init): an input set's key
    specs: list[SignatureRow] = _field("case", rows=SignatureRow,
                                       replay="the saved inputs may not be what the case generates now")
    seed: int = _field("case", default=0,
                       replay="the saved inputs come from another seed")
    kernel: str = _field("case",
                         replay="the saved artifact is not your current kernel; `doit verify:{case}` rebuilds it")
    # what compile builds for (rows.compiled_for): the ABI's table, with no shapes or scalar values where one build
    # serves every call (KernelForm.builds_once), so that a sweep's points share one compile
    compiled_for: list[ParamRow] = _field("case", rows=ParamRow, default=[],
                                          replay="the kernel is now compiled for other parameters")
    backend: str = _field("run", variable=Variable(("backend",), _backend))
    # the world size: one process per rank; the ABI checks resident specs against it (`ranks=N` is
    # planning context, as the profile is: a case's specs may follow it, see Case)
    ranks: int = _field("case", default=1,
                        replay="the world size changed; the saved artifact and placement are for the old one")
    # custom resources the stages that run the kernel or time it ask a cluster for (Case.resources)
    resources: dict[str, Any] = _field("case", default={},
                                       replay="the case now asks for other hardware (resources)")
    options: dict[str, Any] = _field("run", variable=Variable(("options",), _options), default={})
    golden: str = _field("case", replay="the saved golden may no longer be the intended reference")
    policy: str = _field("case",
                         replay="the saved validation policy (tolerances, comparators) differs from the case's")
    # BenchSettings' settings by name: how long the kernel and the golden are timed
    bench: dict[str, Any] = _field("run", variable=Variable(tuple(_BENCH_VARIABLES), _bench),
                                   default={})
    # in no key: `fresh=1` measures the timing stages again and replaces their entries (stage_table.Stage.timing;
    # an entry's timings are outside its digest, so what reads it keeps its key and stays cached)
    fresh: bool = _field("run", variable=Variable(("fresh",), _fresh), default=False)
    # the work the specs imply and the case declares (model.work.Work): the benchmark holds the kernel to it
    work: dict[str, Any] = _field("case", default={},
                                  replay="the work the case declares (bytes=, flops=) changed")
    data_in: dict[str, Any] = _field("case", default={},
                                     replay="the saved inputs come from other data files than the case's now")
    data_out: dict[str, Any] = _field("case", default={},
                                      replay="the saved golden comes from other data files than the case's now")
    external: dict[str, Any] = _field("case", "user_code", default={"files": {}, "env": {}},
                                      replay="the files or variables the case declares (file_deps, env_deps) changed")
    # in no key: the digest of each function and constant, so that `golden-tasks explain` and a
    # replay can name what changed
    parts: dict[str, Any] = _field("context",
                                   default={"kernel": {}, "golden": {}})  # not a stage: the golden function's
    volatile: list[str] = _field("context", default=[])  # what cannot be fingerprinted (see fingerprint.py)
    # whether the kernel is named by import path, so that its module never runs beside the golden (untrusted.py)
    golden_protected: bool = _field("context", default=False)
    nonce: str = _field("run", "every")  # see for_this_run

    error: ClassVar[None] = None

    def to_json(self) -> dict[str, Any]:
        return as_json(self)

    def field_json(self, name: str) -> Any:
        """The field `name` as JSON (its rows as theirs): what enters a key, a manifest, a comparison of plans."""
        return json_of(self, name)

    def overridden(self, values: dict[str, str]) -> "Plan":
        """The plan with doit variables applied (`values`: name -> text, only those given)."""
        changes = {f.name: f.metadata["variable"].parse(values, getattr(self, f.name))
                   for f in dataclasses.fields(self)
                   if f.metadata["variable"] and any(n in values for n in f.metadata["variable"].names)}
        return dataclasses.replace(self, **changes)

    def for_this_run(self) -> "Plan":
        """The plan as keyed in this run: one with parts that cannot be fingerprinted gets a fresh
        nonce, so that everything depending on them recomputes (once per run: its stages agree)."""
        return dataclasses.replace(self, nonce=uuid.uuid4().hex) if self.volatile else self

    def in_run_of(self, case: "Plan") -> "Plan":
        """A baseline's plan as keyed in the run its `case`'s plan is (for_this_run): with that plan's nonce, so
        that the stages it shares with its case have the same keys in both."""
        return dataclasses.replace(self, nonce=case.nonce)

    @functools.cached_property
    def keys_made(self) -> dict[tuple[Any, ...], str]:
        """graph's memo of this plan's stage keys: not a field, so outside its JSON, equality and replace."""
        return {}


@dataclasses.dataclass(frozen=True)
class FailedPlan:
    """A case that could not be planned: `error` says why (the case's name is the module's stem
    when the module itself failed to import)."""
    case: str
    module: str | None  # None for golden_tasks.run
    error: str
    profile: str | None = None
    sweep_of: str | None = None  # a point that failed: its sweep, whose points verify:<sweep> verifies
    baseline_of: ClassVar[None] = None  # as a Plan's: a failed plan plans no baseline
    baselines: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StagePlan:
    """What a stage may read of a plan: the fields in its key (`keyed`) and those every stage may read. Reading
    any other is an error, so a stage cannot depend on what its key does not cover."""
    __slots__ = ("_plan", "_stage", "_keyed")

    def __init__(self, plan: Plan, stage: str, keyed: tuple[str, ...]) -> None:
        object.__setattr__(self, "_plan", plan)
        object.__setattr__(self, "_stage", stage)
        object.__setattr__(self, "_keyed", keyed)

    def __getattr__(self, name: str) -> Any:
        if name in self._keyed or name in EVERY_STAGE:
            return getattr(self._plan, name)
        raise AttributeError(f"the {self._stage} stage read plan field {name!r}, which is not in its key")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a stage's plan is read-only")


def _fields_where(test: Callable[[Mapping[str, Any]], Any]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(Plan) if test(f.metadata))


FIELDS = _fields_where(lambda m: True)
KEYED_EVERYWHERE = _fields_where(lambda m: m["keyed"] == "every")
KEYED_WITH_USER_CODE = _fields_where(lambda m: m["keyed"] == "user_code")
SOURCE_FIELDS = _fields_where(lambda m: m["source"] == "case")  # a change makes the plan stale
EVERY_STAGE = _fields_where(lambda m: m["every_stage"])
REPLAY_MEANING = {f.name: f.metadata["replay"] for f in dataclasses.fields(Plan) if f.metadata["replay"]}
VARIABLES = tuple(n for f in dataclasses.fields(Plan) if f.metadata["variable"] for n in f.metadata["variable"].names)


def from_json(record: dict[str, Any]) -> "Plan | FailedPlan":
    """The Plan or FailedPlan a `to_json` record describes."""
    return FailedPlan(**record) if "error" in record else Plan(**fields_from_json(Plan, record))
