"""Runtime dirs: each verified case's latest run, self-contained and replayable.

    runs/<case>/
      manifest.json        stage keys, fingerprints, profile, toolchain, parameter table, every file's digest
      report.json          the validation report and timings of the run
      artifact/<file>      the compiled kernel (e.g. kernel.pt2)
      policy.pkl           the validation policy (cloudpickle)
      data/in/<name>.bin   In/InOut tensors and scalars, as saved before the kernel ran
      data/golden/<name>.bin   the golden's outputs
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

from . import graph
from .hashing import canonical_json, digest_bytes
from .toolchain import toolchain

MANIFEST = "manifest.json"
FORMAT = 1
FINGERPRINTS = ("params", "signature", "specs", "seed", "kernel", "golden", "policy", "backend", "options", "parts")


def records(manifest: dict) -> dict:
    """Every file of a runtime dir (relative path -> digest, nbytes, ...) but the manifest and report."""
    return {**manifest["tensors"], **manifest["artifact"]["files"], **manifest["files"]}


def current_keys(plan: dict, store) -> dict:
    """stage -> key for every stage whose upstream is cached (None otherwise)."""
    found = {}
    return {s.name: graph.resolve(s, plan, store, found)[0] for s in graph.STAGES}


def is_current(plan: dict, store, case_dir: Path) -> bool:
    """Whether case_dir holds this plan's current run, under its profile, every file present, unchanged
    since written (size and mtime: the files are hard links, so damage to a cache object shows here too)."""
    try:
        manifest = json.loads((case_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if manifest.get("keys") != current_keys(plan, store) or manifest.get("profile") != plan["profile"]:
        return False
    for rel, record in records(manifest).items():
        try:
            st = os.stat(case_dir / rel)
        except OSError:
            return False
        if st.st_size != record["nbytes"] or st.st_mtime_ns != manifest["mtimes"].get(rel):
            return False
    return True


def _place(src: Path, dst: Path) -> None:
    """Hard-link src to dst (read-only: an edit in place would alter the cache too), else copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    os.chmod(dst, 0o444)


def materialize(plan: dict, store, case_dir: Path, summary: dict = None) -> Path:
    """Write the case's runtime dir from its cached entries (which must all exist)."""
    import torch  # noqa: PLC0415 -- scalars are written through torch's dtypes

    from .specs import dtype_of  # noqa: PLC0415

    entries = graph.snapshot(plan, store)
    missing = [n for n, e in entries.items() if e is None]
    if missing:
        raise RuntimeError(f"{plan['case']} is not verified yet ({', '.join(missing)} not cached)")
    case_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=case_dir.parent, prefix=f".{case_dir.name}."))
    os.chmod(tmp, 0o755)
    tensors, files = {}, {}
    for stage, folder in (("inputs", "data/in"), ("golden", "data/golden"), ("dispatch", "data/out")):
        for name, record in entries[stage].objects.items():
            rel = f"{folder}/{name}.bin"
            _place(store.object_path(record["digest"]), tmp / rel)
            tensors[rel] = {k: record[k] for k in ("digest", "nbytes", "dtype", "shape")}
    for name, value in entries["inputs"].meta["scalars"].items():
        row = next(r for r in entries["abi"].meta["table"] if r["name"] == name)
        raw = torch.tensor(value, dtype=dtype_of(row["dtype"])).reshape(1).view(torch.uint8).numpy().tobytes()
        rel = f"data/in/{name}.bin"
        (tmp / rel).write_bytes(raw)
        tensors[rel] = {"digest": digest_bytes(raw), "nbytes": len(raw), "dtype": row["dtype"], "shape": []}
    compiled = entries["compile"]
    for name, record in compiled.objects.items():
        _place(store.object_path(record["digest"]), tmp / "artifact" / name)
    policy = entries["validate"].objects.get("policy.pkl")
    if policy:
        _place(store.object_path(policy["digest"]), tmp / "policy.pkl")
        files["policy.pkl"] = {"digest": policy["digest"], "nbytes": policy["nbytes"]}
    manifest = {
        "format": FORMAT,
        "case": plan["case"],
        "module": plan["module"],
        "profile": plan["profile"],
        "keys": current_keys(plan, store),
        "fingerprints": {f: plan.get(f) for f in FINGERPRINTS},
        "toolchain": toolchain(),
        "pipeline": graph.pipeline_version(),
        "table": entries["abi"].meta["table"],
        "bench": plan["bench"],
        "timeout": plan["timeout"],
        "artifact": {"backend": compiled.meta["backend"], "module": compiled.meta["module"],
                     "table": compiled.meta["table"],
                     "files": {f"artifact/{n}": {"digest": r["digest"], "nbytes": r["nbytes"]}
                               for n, r in compiled.objects.items()}},
        "tensors": tensors,
        "files": files,
    }
    run_report = {"case": plan["case"], "summary": summary, "validation": entries["validate"].meta,
                  "kernel_us": entries["bench"].stats.get("kernel_us"),
                  "golden_us": entries["golden"].stats.get("golden_us")}
    (tmp / "report.json").write_text(json.dumps(run_report, indent=1, sort_keys=True))
    manifest["mtimes"] = {rel: os.stat(tmp / rel).st_mtime_ns for rel in records(manifest)}
    (tmp / MANIFEST).write_text(json.dumps(json.loads(canonical_json(manifest)), indent=1, sort_keys=True))
    _swap_in(tmp, case_dir)
    return case_dir


def _swap_in(new: Path, target: Path) -> None:
    """Replace target by new with renames: readers see the old or the new dir, never a mix."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old."))
        os.rename(target, old / "dir")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
