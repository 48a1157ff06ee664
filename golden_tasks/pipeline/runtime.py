"""Runtime dirs: each verified case's latest run, self-contained and replayable.

    runs/<case>/
      manifest.json        stage keys, fingerprints, profile, toolchain, parameter table and placement over
                           ranks, every file's digest
      report.json          the validation report and timings of the run
      artifact/<file>      the compiled kernel (e.g. kernel.pt2)
      policy.pkl           the validation policy (cloudpickle)
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

from ..model.hashing import canonical_json, digest_bytes
from ..model.outputs import POLICY_FILE, AbiMeta, CompileMeta, InputsMeta, Meta, Outputs
from ..model.plan import REPLAY_MEANING, Plan
from ..model.records import MANIFEST, MANIFEST_FORMAT, BadRecord, CaseRow, Manifest
from ..project.toolchain import pipeline_version, toolchain
from ..storage.store import umask
from . import graph

# What a replay compares with the current source (golden_tasks.model.plan: each field's `replay`), and
# the parts that name what changed.
FINGERPRINTS = (*REPLAY_MEANING, "parts")


# Where each stage's tensors are saved.
FOLDERS = {"inputs": "data/in", "golden": "data/golden", "dispatch": "data/out", "inputs2": "data/in2",
           "golden2": "data/golden2"}


def current_keys(plan: Plan, store, found: dict = None) -> dict:
    """stage -> key for every stage whose upstream is cached (None otherwise); `found` as graph.resolve's
    (an entry found under a stage's current key has that key)."""
    found = {} if found is None else found
    return {s.name: found[s.name].key if found.get(s.name) else graph.resolve(s, plan, store, found)[0]
            for s in graph.STAGES}


def is_current(plan: Plan, store, case_dir: Path, found: dict = None) -> bool:
    """Whether case_dir holds this plan's current run, under its profile, every file present, unchanged
    since written (size and mtime: the files are hard links, so damage to a cache object shows here too).
    `found`: entries already looked up in this run (graph.resolve)."""
    try:
        manifest = Manifest.read(case_dir)
    except BadRecord:
        return False
    if manifest.keys != current_keys(plan, store, found) or manifest.profile != plan.profile:
        return False
    for rel, record in manifest.recorded().items():
        try:
            st = os.stat(case_dir / rel)
        except OSError:
            return False
        if st.st_size != record["nbytes"] or st.st_mtime_ns != manifest.mtimes.get(rel):
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


def materialize(plan: Plan, store, case_dir: Path, summary: CaseRow = None) -> Path:
    """Write the case's runtime dir from its cached entries (which must all exist)."""
    import torch  # noqa: PLC0415 -- scalars are written through torch's dtypes

    from ..model.specs import dtype_of  # noqa: PLC0415

    entries = graph.snapshot(plan, store)
    missing = [n for n, e in entries.items() if e is None]
    if missing:
        raise RuntimeError(f"{plan.case} is not verified yet ({', '.join(missing)} not cached)")
    case_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=case_dir.parent, prefix=f".{case_dir.name}."))
    os.chmod(tmp, 0o777 & ~umask())  # as a plain mkdir would make it
    tensors, files = {}, {}
    for stage, folder in FOLDERS.items():
        for name, record in entries[stage].objects.items():
            rel = f"{folder}/{name}.bin"
            _place(store.object_path(record["digest"]), tmp / rel)
            tensors[rel] = {k: record[k] for k in ("digest", "nbytes", "dtype", "shape")}
    table = AbiMeta.of(entries["abi"]).table
    for name, value in InputsMeta.of(entries["inputs"]).scalars.items():
        row = next(r for r in table if r["name"] == name)
        raw = torch.tensor(value, dtype=dtype_of(row["dtype"])).reshape(1).view(torch.uint8).numpy().tobytes()
        rel = f"data/in/{name}.bin"
        (tmp / rel).write_bytes(raw)
        tensors[rel] = {"digest": digest_bytes(raw), "nbytes": len(raw), "dtype": row["dtype"], "shape": []}
    compiled, built = entries["compile"], CompileMeta.of(entries["compile"])
    for name, record in compiled.objects.items():
        _place(store.object_path(record["digest"]), tmp / "artifact" / name)
    policy = entries["validate"].objects.get(POLICY_FILE)
    if policy:
        _place(store.object_path(policy["digest"]), tmp / POLICY_FILE)
        files[POLICY_FILE] = {"digest": policy["digest"], "nbytes": policy["nbytes"]}
    manifest = Manifest(
        format=MANIFEST_FORMAT, case=plan.case, module=plan.module, profile=plan.profile,
        keys=current_keys(plan, store), fingerprints={f: getattr(plan, f) for f in FINGERPRINTS},
        toolchain=toolchain(), pipeline=pipeline_version(), table=table,
        placement=AbiMeta.of(entries["abi"]).placement, bench=plan.bench, timeout=plan.timeout,
        # saved stages that skipped (a case without a golden): a replay skips what reads them
        skipped={s: reason for s in ("golden", "inputs2", "golden2")
                 if (reason := graph.BY_NAME[s].meta.of(entries[s]).skipped)},
        artifact={"backend": built.backend, "module": built.module, "table": built.table,
                  "files": {f"artifact/{n}": {"digest": r["digest"], "nbytes": r["nbytes"]}
                            for n, r in compiled.objects.items()}},
        tensors=tensors, files=files)
    run_report = {"case": plan.case, "summary": summary and summary.to_json(), "validation": entries["validate"].meta,
                  "kernel_us": graph.load_timings(store, entries["bench"]).kernel_us,
                  "golden_us": graph.load_timings(store, entries["golden_bench"]).golden_us}
    (tmp / "report.json").write_text(json.dumps(run_report, indent=1, sort_keys=True))
    manifest.mtimes = {rel: os.stat(tmp / rel).st_mtime_ns for rel in manifest.recorded()}
    (tmp / MANIFEST).write_text(json.dumps(json.loads(canonical_json(manifest.to_json())), indent=1, sort_keys=True))
    _swap_in(tmp, case_dir)
    return case_dir


def saved_plan(manifest: Manifest, bench: dict = None) -> Plan:
    """The plan of a runtime dir's run, as far as it was recorded (`bench`: warmup/rounds over the run's)."""
    return Plan(case=manifest.case, module=manifest.module, profile=manifest.profile,
                timeout=Plan.timeout if manifest.timeout is None else manifest.timeout,
                bench={**manifest.bench, **(bench or {})}, **manifest.fingerprints)


def saved_outputs(case_dir: Path, manifest: Manifest) -> dict:
    """stage -> Outputs for the stages whose results a runtime dir keeps: abi, compile, both input sets
    and the golden's outputs on them (tensors map the saved files; nothing is copied)."""
    from ..storage.tensors import map_raw  # noqa: PLC0415 -- imports torch: only where a replay runs

    def folder(stage):
        prefix = f"{FOLDERS[stage]}/"
        return {rel[len(prefix):-len(".bin")]: map_raw(case_dir / rel, record)
                for rel, record in manifest.tensors.items() if rel.startswith(prefix)}

    table, artifact, inputs, skipped = manifest.table, manifest.artifact, folder("inputs"), manifest.skipped
    scalars = {r["name"]: inputs.pop(r["name"]).item() for r in table if r["kind"] == "scalar"}
    return {
        "abi": Outputs(meta=AbiMeta(table=table, placement=manifest.placement)),
        "compile": Outputs(files={rel.split("/", 1)[1]: case_dir / rel for rel in artifact["files"]},
                           meta=CompileMeta(backend=artifact["backend"], module=artifact["module"],
                                            table=artifact["table"])),
        "inputs": Outputs(tensors=inputs, meta=InputsMeta(scalars=scalars)),
        "golden": Outputs(tensors=folder("golden"), meta=Meta(skipped=skipped.get("golden"))),
        "inputs2": Outputs(tensors=folder("inputs2"), meta=InputsMeta(scalars=scalars, skipped=skipped.get("inputs2"))),
        "golden2": Outputs(tensors=folder("golden2"), meta=Meta(skipped=skipped.get("golden2"))),
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
