"""Replay a runtime dir: the saved artifact on the saved inputs, judged against the
saved golden with the saved policy, then benchmarked.

No compile, no input generation, no golden, and no import of the kernel module:
a replay works where the kernel's source is gone or changed. It says whether
the saved data is stale against the current source, and refuses an artifact
built by another toolchain before dispatching anything.
"""
import dataclasses
import json
import tempfile
from pathlib import Path

import cloudpickle

from .case import Case
from .config import DEFAULT_PROFILE
from .discover import plan_in_subprocess
from .errors import VerificationFailure
from .fingerprint import changed_parts
from .hashing import digest_file
from .runtime import MANIFEST, records
from .stages import Outputs, bench, dispatch
from .stages.validate import judge
from .tensors import map_raw
from .toolchain import toolchain

MEANING = {
    "kernel": "the saved artifact is not your current kernel; `doit verify:{case}` rebuilds it",
    "golden": "the saved golden may no longer be the intended reference",
    "specs": "the saved inputs may not be what the case generates now",
    "seed": "the saved inputs come from another seed",
    "params": "the kernel's parameter list changed; the saved artifact has the old ABI",
    "signature": "the specs' shapes, dtypes or scalar values changed",
    "policy": "the saved validation policy (tolerances, comparators) differs from the case's",
}


class ReplayError(VerificationFailure):
    """The runtime dir cannot be replayed here; the message says why."""


@dataclasses.dataclass
class ReplayResult:
    passed: bool
    error: str
    stale: list  # what changed since the data was saved, each with its meaning
    report: dict  # validation report of the replay
    bench: dict  # kernel timing (us)


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except OSError:
        raise ReplayError(f"{path} is not a runtime dir: no {MANIFEST}") from None
    except ValueError as exc:
        raise ReplayError(f"{path / MANIFEST} is not valid JSON: {exc}") from None
    return manifest


def toolchain_mismatches(manifest: dict) -> list:
    here = toolchain()
    return [f"{k}: built with {manifest['toolchain'].get(k)!r}, this machine has {here[k]!r}"
            for k in sorted(here) if manifest["toolchain"].get(k) != here[k]]


def _check_files(path: Path, manifest: dict) -> None:
    problems = []
    for rel, record in sorted(records(manifest).items()):
        file = path / rel
        if not file.exists():
            problems.append(f"{rel}: missing")
        elif file.stat().st_size != record["nbytes"]:
            problems.append(f"{rel}: {file.stat().st_size} bytes, {record['nbytes']} expected (truncated?)")
        elif digest_file(file) != record["digest"]:
            problems.append(f"{rel}: content does not match its recorded digest (modified?)")
    if problems:
        raise ReplayError(f"{path} is damaged:\n  " + "\n  ".join(problems))


def _folder(path: Path, manifest: dict, folder: str) -> dict:
    prefix = f"data/{folder}/"
    return {rel[len(prefix):-len(".bin")]: map_raw(path / rel, rec)
            for rel, rec in manifest["tensors"].items() if rel.startswith(prefix)}


def staleness(path: Path, manifest: dict, project: Path) -> list:
    """What differs between the saved run and the case's current source, with what it means."""
    found = [f"toolchain changed: {m}" for m in toolchain_mismatches(manifest)]
    try:  # planned under the saved run's profile (dirs written before profiles existed: the default)
        planned = plan_in_subprocess(project, [manifest["module"].rsplit(".", 1)[-1]],
                                     manifest.get("profile", DEFAULT_PROFILE))
    except RuntimeError as exc:
        return found + [f"cannot check the source for staleness: {str(exc).strip().splitlines()[-1]}"]
    plans = [p for m in planned.values() for p in m["cases"] if p["case"] == manifest["case"]]
    if not plans or plans[0].get("error"):
        reason = plans[0]["error"] if plans else f"{manifest['module']} no longer defines it"
        return found + [f"the case cannot be found in the current source ({reason}): the saved data "
                        "is all that is left of it"]
    current, saved = plans[0], manifest["fingerprints"]
    for field, meaning in MEANING.items():
        if current.get(field) != saved.get(field):
            detail = ""
            if field in ("kernel", "golden"):
                old, new = saved["parts"].get(field, {}), current["parts"].get(field, {})
                names = changed_parts(old, new)
                helpers = [n for n in names if not n.endswith("(body)")]
                detail = f" ({', '.join(names)}{'; helper modules or constants' if helpers else ''})"
            found.append(f"{field} changed since this data was saved{detail}: "
                         + meaning.format(case=manifest["case"]))
    return found


def replay(path, project=None, warmup=None, rounds=None) -> ReplayResult:
    """Replay the runtime dir at `path`; `project` (default: the current directory) is
    where its case's current source is looked up for staleness."""
    path = Path(path).resolve()
    stale = []
    try:
        manifest = _read_manifest(path)
        mismatches = toolchain_mismatches(manifest)
        if mismatches:
            raise ReplayError(f"refusing to run the artifact in {path}, built for another toolchain:\n  "
                              + "\n  ".join(mismatches))
        if (Path(project or Path.cwd()) / "kernels").is_dir():
            stale = staleness(path, manifest, Path(project or Path.cwd()).resolve())
        _check_files(path, manifest)
        plan = {"case": manifest["case"], "timeout": manifest.get("timeout", Case.timeout),
                "bench": {**manifest["bench"], **{k: v for k, v in (("warmup", warmup), ("rounds", rounds))
                                                  if v is not None}}}
        abi = Outputs(meta={"table": manifest["table"]})
        files = {rel.split("/", 1)[1]: path / rel for rel in manifest["artifact"]["files"]}
        compiled = Outputs(files=files, meta={k: manifest["artifact"][k] for k in ("backend", "module", "table")})
        inputs_in = _folder(path, manifest, "in")
        scalars = {r["name"]: inputs_in.pop(r["name"]).item() for r in manifest["table"] if r["kind"] == "scalar"}
        inputs = Outputs(tensors=inputs_in, meta={"scalars": scalars})
        with tempfile.TemporaryDirectory() as work:
            out = dispatch.run(None, plan, Path(work), abi, compiled, inputs)
            if "skipped" in out.meta:
                raise ReplayError(f"cannot replay {path} here: {out.meta['skipped']}")
            golden = _folder(path, manifest, "golden")
            policy = cloudpickle.loads((path / "policy.pkl").read_bytes())
            report = judge(policy, out.tensors, golden, manifest["case"])
            timing = bench.run(None, plan, Path(work), abi, compiled, inputs).stats["kernel_us"]
    except VerificationFailure as exc:
        return ReplayResult(False, str(exc), stale, {}, {})
    return ReplayResult(True, None, stale, report, timing)


def main(path, project=None) -> int:
    """Print a replay's outcome; exit status 0 on PASS."""
    result = replay(path, project)
    for line in result.stale:
        print(f"STALE: {line}")
    if result.passed:
        print(f"PASS {path}: max abs error {result.report['max_abs']:.3g}, kernel median "
              f"{result.bench['median']:.1f} us over {result.bench['rounds']} rounds")
        return 0
    print(f"FAIL {path}: {result.error}")
    return 1
