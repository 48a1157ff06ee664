"""The task graph's keys: what enters a stage's key, and the store's entries under the current keys.

With the stage table (pipeline/stage_table.py: which stages exist and what each
reads) this is the one place that knows the DAG and the keys; doit's tasks and
up-to-date checks, the in-process runner, the reports and the cluster executor
ask it. It imports no torch: keys are computed from plans and small entry
manifests, so the doit parent can check every stage's status cheaply.

A stage's key is the xxh3-128 of: its name, the pipeline's code version, the
toolchain, the plan fields it declares (Stage.plan_fields: the nonce among
them, a fresh value on every run for a plan with parts that cannot be
fingerprinted), and the digests of the upstream entries it reads. A stage is
handed only those plan fields and the few every stage may read (Plan.view), so
it cannot read one that its key does not cover. A stage whose key is in the store is up to date: keys depend
only on content, so reverting an edit finds the earlier entries again, and a
stage whose upstream re-ran but produced the same digests is not re-run
(early cutoff).
"""
import dataclasses
import enum
from typing import Any

from ..model.hashing import digest_json
from ..model.plan import FailedPlan, Plan, StagePlan
from ..project.toolchain import machine, pipeline_version, toolchain
from ..storage.entry import Entry
from ..storage.store import Store
from .stage_table import BY_NAME, KERNEL_STAGES, STAGES, Stage

# What stands for the case in the task of a stage that holds nothing of one (Stage.per_case false: calibrate):
# one task, `calibrate:machine`, computes the entry every case reads.
MACHINE = "machine"
MACHINE_STAGES = tuple(s for s in STAGES if not s.per_case)
CASE_STAGES = tuple(s for s in STAGES if s.per_case)


def stages_of(plan: Plan | FailedPlan) -> tuple[Stage, ...]:
    """The stages that are a plan's own tasks: every stage of a case (CASE_STAGES), or a baseline's
    (stage_table.KERNEL_STAGES); a plan reads the others, computed by another task under the same keys
    (computed_by)."""
    return KERNEL_STAGES if plan.baseline_of else CASE_STAGES


def computed_by(plan: Plan, stage: Stage) -> str:
    """What names the task that computes `stage` of `plan` (`<stage>:<it>`): the plan's case, its case's for a
    stage a baseline shares, or MACHINE for a stage every case shares."""
    if not stage.per_case:
        return MACHINE
    return plan.baseline_of if plan.baseline_of and stage not in KERNEL_STAGES else plan.case


def recipe(stage: Stage, plan: Plan, upstream: dict[str, Entry]) -> dict[str, Any]:
    """Everything that enters the stage's key (the key is its digest)."""
    return {
        "stage": stage.name,
        "pipeline": pipeline_version(),
        "toolchain": toolchain(),
        **({"machine": machine()} if stage.on_machine else {}),
        "plan": keyed(stage, plan),
        "upstream": {n: e.digest for n, e in upstream.items()},
    }


def keyed(stage: Stage, plan: Plan) -> dict[str, Any]:
    """The plan fields that enter the stage's key, by name, as JSON."""
    return {f: plan.field_json(f) for f in stage.plan_fields}


def view(stage: Stage, plan: Plan) -> StagePlan:
    """What the stage may read of the plan: the fields in its key and those every stage may read."""
    return StagePlan(plan, stage.name, stage.plan_fields)


def parts_detail(stage: Stage, plan: Plan) -> dict[str, Any]:
    """The parts of the fingerprints in the stage's key, recorded beside it for `golden-tasks explain`."""
    return {f: plan.parts[f] for f in stage.plan_fields if f in plan.parts}


def _key(stage: Stage, plan: Plan, upstream: dict[str, Entry]) -> str:
    """The digest of the stage's recipe, made once per plan object for the same upstream digests and
    toolchain (a status check, a report row and a runtime dir each ask again in one run)."""
    made = (stage.name, id(toolchain()), stage.on_machine and id(machine()), tuple(e.digest for e in upstream.values()))
    if made not in plan.keys_made:
        plan.keys_made[made] = digest_json(recipe(stage, plan, upstream))
    key: str = plan.keys_made[made]
    return key


def remeasured(stage: Stage, plan: Plan) -> bool:
    """Whether this run measures `stage` again although its entry is cached (`fresh=1`, a timing stage)."""
    return bool(stage.timing) and plan.fresh


class Missing(enum.Enum):
    """Why a stage has no usable cached entry (NotCached.kind): each says so, naming NotCached.detail."""
    REMEASURED = "fresh=1 measures its timings again"
    UPSTREAM = "its key depends on upstream {detail}, not cached yet"
    VOLATILE = "it recomputes on every run: it depends on what cannot be fingerprinted: {detail}"
    DAMAGED = "its cached entry (key {detail:.16}) is damaged or unreadable, so it is computed again"
    NO_ENTRY = "no cached entry under its key {detail:.16}"


@dataclasses.dataclass(frozen=True)
class NotCached:
    """Why a stage is not cached: the kind, and the detail that names it (the upstream stages not
    cached, the reasons it is volatile) or the key it has no entry under."""
    kind: Missing
    detail: str

    def __str__(self) -> str:
        return self.kind.value.format(detail=self.detail)


class Lookups:
    """One plan's stage entries in the store under their current keys, each looked up at most once: what the
    questions asked at one moment share (a status check and those after it, a row, a runtime dir). Never kept
    across moments: another process may have replaced an entry since, so each run of a stage makes its own.
    `known`: entries found under their current keys before (a doit process's earlier hits)."""

    def __init__(self, plan: Plan, store: Store, known: dict[str, Entry] | None = None) -> None:
        self.plan, self.store = plan, store
        # stage name -> Entry, or None for one not in the store
        self._entries: dict[str, Entry | None] = dict(known or {})

    def resolve(self, stage: Stage) -> tuple[str | None, dict[str, Entry]]:
        """(key, upstream entries by stage name) for a stage, or (None, {}) while an upstream is not cached."""
        upstream: dict[str, Entry] = {}
        for name in stage.reads:
            if (entry := self.cached(BY_NAME[name])) is None:
                return None, {}
            upstream[name] = entry
        return _key(stage, self.plan, upstream), upstream

    def cached(self, stage: Stage) -> Entry | None:
        """The stage's cached entry under its current key, or None."""
        if stage.name not in self._entries:
            key, _ = self.resolve(stage)
            self._entries[stage.name] = self.store.get(stage.name, key) if key else None
        return self._entries[stage.name]

    def not_cached(self, stage: Stage) -> NotCached | None:
        """Why `stage` has no usable cached entry, or None when it has one (the answer of `cached`, never a hit
        it would not give; the reasons cost lookups only on a miss)."""
        if remeasured(stage, self.plan):
            return NotCached(Missing.REMEASURED, "")
        if self.plan.volatile and stage.per_case:  # its key holds this run's nonce (Plan.for_this_run): not found
            return NotCached(Missing.VOLATILE, "; ".join(self.plan.volatile))
        key, _ = self.resolve(stage)
        if key is None:
            missing = [n for n in stage.reads if self.cached(BY_NAME[n]) is None]
            return NotCached(Missing.UPSTREAM, ", ".join(missing))
        if (hit := self.store.get(stage.name, key)) is not None:
            self._entries[stage.name] = hit
            return None
        # an entry the lookup dropped as damaged (with a warning), or one it cannot parse
        if any((stage.name, key) in s.dropped or s.entry_path(stage.name, key).exists()
               for s in (self.store, self.store.overlay) if s is not None):
            return NotCached(Missing.DAMAGED, key)
        return NotCached(Missing.NO_ENTRY, key)

    def snapshot(self) -> dict[str, Entry | None]:
        """Every stage's cached entry (or None)."""
        return {s.name: self.cached(s) for s in STAGES}

    def keys(self) -> dict[str, str | None]:
        """Every stage's current key, None where an upstream is not cached (an entry found has its key)."""
        return {s.name: entry.key if (entry := self._entries.get(s.name)) else self.resolve(s)[0] for s in STAGES}

    def hits(self) -> dict[str, Entry]:
        """The entries found so far, by stage name: what a later Lookups of this moment may start from."""
        return {name: entry for name, entry in self._entries.items() if entry is not None}
