"""Runtime dirs: each verified case's latest run, self-contained and replayable.

    runs/<case>/
      manifest.json        stage keys, fingerprints, profile, toolchain, parameter table and placement over
                           ranks, every file's digest
      report.json          the validation report and timings of the run
      artifact/<file>      the compiled kernel (e.g. kernel.pt2)
      policy.pkl           the validation policy (cloudpickle, its user code by value)
      data/in/<name>.bin   In/InOut tensors and scalars, as saved before the kernel ran
      data/golden/<name>.bin   the golden's outputs
      data/in2/, data/golden2/ the second input set (seed + 1) and the golden's outputs on it (bench's recheck)
      data/out/<name>.bin      the kernel's outputs

A `.bin` file holds a tensor's raw little-endian bytes in C order; its dtype
and shape are in manifest.json under "tensors". Files are hard links to the
cache's objects (no second copy of large tensors) where the file system allows,
copies otherwise: deleting the cache or copying the directory elsewhere leaves
it replayable. The directory is replaced atomically on each verify.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ..model.hashing import canonical_json, digest_bytes
from ..model.outputs import POLICY_FILE, AbiMeta, CompileMeta, InputsMeta, Meta, Outputs
from ..model.plan import REPLAY_MEANING, Plan
from ..model.records import MANIFEST, MANIFEST_FORMAT, BadRecord, CaseRow, Manifest, SavedArtifact, StoredTensor
from ..model.rows import fields_from_json
from ..project.toolchain import pipeline_version, toolchain
from ..storage.store import Store, umask
from . import graph
from .stage_table import BY_NAME, STAGES, InReplay, StageName
from .stored import load_timings

if TYPE_CHECKING:
    import torch

# What a replay compares with the current source (golden_tasks.model.plan: each field's `replay`), and
# the parts that name what changed.
FINGERPRINTS = (*REPLAY_MEANING, "parts")


def is_current(lookups: graph.Lookups, case_dir: Path) -> bool:
    """Whether case_dir holds the run of the lookups' plan under their current keys, under its profile, every
    file present, unchanged since written (size and mtime: the files are hard links, so damage to a cache
    object shows here too)."""
    try:
        manifest = Manifest.read(case_dir)
    except BadRecord:
        return False
    if manifest.keys != lookups.keys() or manifest.profile != lookups.plan.profile:
        return False
    for rel, record in manifest.recorded().items():
        try:
            st = os.stat(case_dir / rel)
        except OSError:
            return False
        if st.st_size != record.nbytes or st.st_mtime_ns != manifest.mtimes.get(rel):
            return False
    return True


def _place(src: Path, dst: Path) -> None:
    """Hard-link src to dst (read-only: an edit in place would alter the cache too), else copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    os.chmod(dst, 0o444 & ~umask())


def materialize(plan: Plan, store: Store, case_dir: Path, summary: CaseRow | None = None) -> Path:
    """Write the case's runtime dir from its cached entries (which must all exist)."""
    import torch  # noqa: PLC0415 -- scalars are written through torch's dtypes

    from ..model.specs import dtype_of  # noqa: PLC0415

    lookups = graph.Lookups(plan, store)
    entries = {name: entry for name, entry in lookups.snapshot().items() if entry is not None}
    missing = [s.name for s in STAGES if s.name not in entries]
    if missing:
        raise RuntimeError(f"{plan.case} is not verified yet ({', '.join(missing)} not cached)")
    case_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=case_dir.parent, prefix=f".{case_dir.name}."))
    os.chmod(tmp, 0o777 & ~umask())  # as a plain mkdir would make it
    tensors: dict[str, StoredTensor] = {}
    for stage in (s for s in STAGES if s.folder):
        for name, record in entries[stage.name].objects.items():
            if isinstance(record, StoredTensor):
                rel = f"{stage.folder}/{name}.bin"
                _place(store.object_path(record.digest), tmp / rel)
                tensors[rel] = record
    table = AbiMeta.of(entries[StageName.ABI]).table
    for name, value in InputsMeta.of(entries[StageName.INPUTS]).scalars.items():
        dtype = cast(str, next(r.dtype for r in table if r.name == name))  # a checked table's rows have every field
        raw = torch.tensor(value, dtype=dtype_of(dtype)).reshape(1).view(torch.uint8).numpy().tobytes()
        rel = f"data/in/{name}.bin"
        (tmp / rel).write_bytes(raw)
        tensors[rel] = StoredTensor(digest=digest_bytes(raw), nbytes=len(raw), dtype=dtype, shape=[])
    compiled, built = entries[StageName.COMPILE], CompileMeta.of(entries[StageName.COMPILE])
    for name, record in compiled.objects.items():
        _place(store.object_path(record.digest), tmp / "artifact" / name)
    policy = entries[StageName.POLICY].objects[POLICY_FILE]
    _place(store.object_path(policy.digest), tmp / POLICY_FILE)
    files = {POLICY_FILE: policy}
    manifest = Manifest(
        format=MANIFEST_FORMAT, case=plan.case, module=plan.module, profile=plan.profile,
        keys=lookups.keys(), fingerprints={f: plan.field_json(f) for f in FINGERPRINTS},
        toolchain=toolchain(), pipeline=pipeline_version(), table=table,
        placement=AbiMeta.of(entries[StageName.ABI]).placement, bench=plan.bench, timeout=plan.timeout,
        # saved stages that skipped (a case without a golden): a replay skips what reads them
        skipped={s.name: reason for s in STAGES
                 if s.replay is InReplay.SAVED and (reason := s.meta.of(entries[s.name]).skipped)},
        artifact=SavedArtifact(backend=built.backend, module=built.module, table=built.table,
                               files={f"artifact/{n}": r for n, r in compiled.objects.items()}),
        tensors=tensors, files=files)
    timings = {s.timing: getattr(load_timings(store, entries[s.name]), s.timing) for s in STAGES if s.timing}
    run_report = {"case": plan.case, "summary": summary and summary.to_json(),
                  "validation": entries[StageName.VALIDATE].meta,
                  **{field: timing and timing.to_json() for field, timing in timings.items()}}
    (tmp / "report.json").write_text(json.dumps(run_report, indent=1, sort_keys=True))
    manifest.mtimes = {rel: os.stat(tmp / rel).st_mtime_ns for rel in manifest.recorded()}
    (tmp / MANIFEST).write_text(json.dumps(json.loads(canonical_json(manifest.to_json())), indent=1, sort_keys=True))
    _swap_in(tmp, case_dir)
    return case_dir


def saved_plan(manifest: Manifest, bench: dict[str, Any] | None = None) -> Plan:
    """The plan of a runtime dir's run, as far as it was recorded (`bench`: warmup/rounds over the run's)."""
    return Plan(case=manifest.case, module=manifest.module, profile=manifest.profile,
                timeout=Plan.timeout if manifest.timeout is None else manifest.timeout,
                bench={**manifest.bench, **(bench or {})}, **fields_from_json(Plan, manifest.fingerprints))


def saved_outputs(case_dir: Path, manifest: Manifest) -> dict[StageName, Outputs]:
    """stage -> Outputs for the stages whose results a runtime dir keeps: abi, compile, both input sets
    and the golden's outputs on them, the policy (tensors map the saved files; nothing is copied)."""
    from ..storage.tensors import map_raw  # noqa: PLC0415 -- imports torch: only where a replay runs

    def folder(stage: StageName) -> dict[str, "torch.Tensor"]:
        prefix = f"{BY_NAME[stage].folder}/"
        return {rel[len(prefix):-len(".bin")]: map_raw(case_dir / rel, record)
                for rel, record in manifest.tensors.items() if rel.startswith(prefix)}

    table, artifact, inputs, skipped = manifest.table, manifest.artifact, folder(StageName.INPUTS), manifest.skipped
    scalars = {r.name: inputs.pop(r.name).item() for r in table if r.by_value}
    return {
        StageName.ABI: Outputs(meta=AbiMeta(table=table, placement=manifest.placement)),
        StageName.COMPILE: Outputs(files={rel.split("/", 1)[1]: case_dir / rel for rel in artifact.files},
                                   meta=CompileMeta(backend=artifact.backend, module=artifact.module,
                                                    table=artifact.table)),
        StageName.INPUTS: Outputs(tensors=inputs, meta=InputsMeta(scalars=scalars)),
        StageName.GOLDEN: Outputs(tensors=folder(StageName.GOLDEN), meta=Meta(skipped=skipped.get(StageName.GOLDEN))),
        StageName.INPUTS2: Outputs(tensors=folder(StageName.INPUTS2),
                                   meta=InputsMeta(scalars=scalars, skipped=skipped.get(StageName.INPUTS2))),
        StageName.GOLDEN2: Outputs(tensors=folder(StageName.GOLDEN2),
                                   meta=Meta(skipped=skipped.get(StageName.GOLDEN2))),
        StageName.POLICY: Outputs(files={POLICY_FILE: case_dir / POLICY_FILE}),
    }


def _swap_in(new: Path, target: Path) -> None:
    """Replace target by new with renames: readers see the old or the new dir, never a mix."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old."))
        os.rename(target, old / "dir")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
