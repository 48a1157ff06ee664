"""Replay a runtime dir: the saved artifact on the saved inputs, judged against the
saved golden with the saved policy, then benchmarked.

No compile, no input generation, no golden, and no import of the kernel module:
a replay works where the kernel's source is gone or changed. It says whether
the saved data is stale against the current source, and refuses an artifact
built by another toolchain before dispatching anything.
"""
import dataclasses
import importlib.util
import pickletools
import re
import tempfile
import typing
from pathlib import Path
from typing import cast

from ..model.errors import VerificationFailure
from ..model.hashing import digest_file
from ..model.outputs import ValidateMeta
from ..model.plan import REPLAY_MEANING, Plan, from_json
from ..model.records import BadRecord, Manifest, Timing
from ..planning.discover import plan_in_subprocess
from ..project.config import DEFAULT_PROFILE, Project
from ..project.fingerprint_parts import changed_parts
from ..project.layout import LayoutError
from ..project.toolchain import toolchain
from .execution import replay_stages
from .runtime import saved_outputs, saved_plan
from .stage_table import StageName

_GOLDEN_TASKS_MODULE = re.compile(r"golden_tasks(\.[A-Za-z_]\w*)+")


class ReplayError(VerificationFailure):
    """The runtime dir cannot be replayed here; the message says why."""


@dataclasses.dataclass
class ReplayResult:
    passed: bool
    error: str | None
    stale: list[str]  # what changed since the data was saved, each with its meaning
    report: ValidateMeta | None  # validation report of the replay (None when it failed)
    bench: Timing | None  # the kernel's timing, with every round (None when it failed)


def _read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.read(path)
    except BadRecord as exc:
        raise ReplayError(str(exc)) from None


def toolchain_mismatches(manifest: Manifest) -> list[str]:
    here = toolchain()
    return [f"{k}: built with {manifest.toolchain.get(k)!r}, this machine has {here[k]!r}"
            for k in sorted(here) if manifest.toolchain.get(k) != here[k]]


def _check_files(path: Path, manifest: Manifest) -> None:
    problems: list[str] = []
    for rel, record in sorted(manifest.recorded().items()):
        file = path / rel
        if not file.exists():
            problems.append(f"{rel}: missing")
        elif file.stat().st_size != record.nbytes:
            problems.append(f"{rel}: {file.stat().st_size} bytes, {record.nbytes} expected (truncated?)")
        elif digest_file(file) != record.digest:
            problems.append(f"{rel}: content does not match its recorded digest (modified?)")
    if problems:
        raise ReplayError(f"{path} is damaged:\n  " + "\n  ".join(problems))


def _unchecked(manifest: Manifest, project: Path) -> str | None:
    """Why the case's current source cannot be looked up in `project`; None when it can."""
    if not manifest.module:
        return "the case was not defined in a kernel module (golden_tasks.run): it has no source to compare"
    try:
        kernels = Project.at(project).layout.kernels
    except LayoutError as exc:
        return str(exc)
    if not any(folder.is_dir() for folder in kernels):
        return f"{project} has no kernel folder (give the checkout that holds the case's source with --project)"
    return None


def _check_modules(path: Path, manifest: Manifest) -> None:
    """Refuse a dir that names a module path of golden-tasks that no longer exists (modules move with no alias
    kept): its artifact's module, or one its pickles name (read as opcodes: nothing saved is executed here)."""
    named = {manifest.artifact.module} if manifest.artifact.module else set()
    for rel in sorted(manifest.recorded()):
        if rel.endswith(".pkl"):
            named |= _modules_pickled(path / rel)
    for module in sorted(named):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise ReplayError(f"{path} names {module}, which this golden-tasks no longer has (the dir was written "
                              "by an earlier version): verify the case again to write a current one"
                              + (f" (doit verify:{manifest.case})" if manifest.module else ""))


def _modules_pickled(file: Path) -> set[str]:
    """The golden_tasks modules a pickle names (its strings that are such module paths); none for a file that
    is missing or not a pickle (the file check names it)."""
    try:
        return {arg.partition(" ")[0] for _, arg, _ in pickletools.genops(file.read_bytes())  # GLOBAL: "module name"
                if isinstance(arg, str) and _GOLDEN_TASKS_MODULE.fullmatch(arg.partition(" ")[0])}
    except (OSError, ValueError):
        return set()


def staleness(path: Path, manifest: Manifest, project: Path) -> list[str]:
    """What differs between the saved run and the case's current source, with what it means."""
    found = [f"toolchain changed: {m}" for m in toolchain_mismatches(manifest)]
    if manifest.module not in {m.name for m in Project.at(project).layout.modules()}:
        return found + [f"the case cannot be found in the current source ({manifest.module} is not a module "
                        "of the project's kernel folders): the saved data is all that is left of it"]
    try:  # planned under the saved run's profile (dirs written before profiles existed: the default)
        planned = plan_in_subprocess(project, [manifest.module], manifest.profile or DEFAULT_PROFILE)
    except RuntimeError as exc:
        return found + [f"cannot check the source for staleness: {str(exc).strip().splitlines()[-1]}"]
    plans = [from_json(p) for m in planned.values() for p in m["cases"] if p["case"] == manifest.case]
    if not plans or plans[0].error:
        reason = plans[0].error if plans else f"{manifest.module} no longer defines it"
        return found + [f"the case cannot be found in the current source ({reason}): the saved data "
                        "is all that is left of it"]
    current, saved = typing.cast(Plan, plans[0]), manifest.fingerprints  # its error is None: a Plan
    for field, meaning in REPLAY_MEANING.items():
        if field in saved and current.field_json(field) != saved[field]:  # dirs written before a field was recorded
            detail = ""
            if field in current.parts:
                old, new = saved["parts"].get(field, {}), current.parts[field]
                names = changed_parts(old, new)
                helpers = [n for n in names if not n.endswith("(body)")]
                detail = f" ({', '.join(names)}{'; helper modules or constants' if helpers else ''})"
            found.append(f"{field} changed since this data was saved{detail}: "
                         + meaning.format(case=manifest.case))
    return found


def replay(path: str | Path, project: str | Path | None = None, warmup: int | None = None,
           rounds: int | None = None) -> ReplayResult:
    """Replay the runtime dir at `path`; `project` (default: the current directory) is
    where its case's current source is looked up for staleness."""
    path = Path(path).resolve()
    stale: list[str] = []
    try:
        manifest = _read_manifest(path)
        mismatches = toolchain_mismatches(manifest)
        if mismatches:
            raise ReplayError(f"refusing to run the artifact in {path}, built for another toolchain:\n  "
                              + "\n  ".join(mismatches))
        _check_modules(path, manifest)
        source = Path(project or Path.cwd()).resolve()
        reason = _unchecked(manifest, source)  # reported, never silently skipped
        stale = [f"cannot check the source for staleness: {reason}"] if reason else staleness(path, manifest, source)
        _check_files(path, manifest)
        plan = saved_plan(manifest, {k: v for k, v in (("warmup", warmup), ("rounds", rounds)) if v is not None})
        with tempfile.TemporaryDirectory() as work:
            # dispatch, validate and bench, as in a verify, on the saved abi, compile, inputs, golden and policy
            outputs = replay_stages(plan, saved_outputs(path, manifest), Path(work))
        if reason := outputs[StageName.VALIDATE].skipped:  # no golden was saved, or no device here
            raise ReplayError(f"cannot replay {path} here: {reason}")
    except VerificationFailure as exc:
        return ReplayResult(False, str(exc), stale, None, None)
    # the validate stage's meta is a ValidateMeta (stage_table: its Stage.meta)
    verdict = cast(ValidateMeta, outputs[StageName.VALIDATE].meta)
    return ReplayResult(True, None, stale, verdict, outputs[StageName.BENCH].stats.kernel_us)


def main(path: str | Path, project: str | Path | None = None) -> int:
    """Print a replay's outcome; exit status 0 on PASS."""
    result = replay(path, project)
    for line in result.stale:
        print(f"STALE: {line}")
    if result.passed and result.report is not None and result.bench is not None:
        print(f"PASS {path}: max abs error {result.report.max_abs:.3g}, kernel median "
              f"{result.bench.median:.1f} us over {result.bench.rounds} rounds")
        return 0
    print(f"FAIL {path}: {result.error}")
    return 1
