"""Planning the kernel library without importing it in the doit parent.

`load_plans` keeps one manifest per kernel module of each checkout and profile under
<cache>/plans/<checkout>/<profile>/: the module's case plans (or the error that kept it from
planning) and a record of everything planning read (golden_tasks.project.observe: every user source
file, data files opened, directories listed, environment variables read by user code). A
manifest is reused while that record, the toolchain, the pipeline and the installed packages
are unchanged; stale modules are planned in one subprocess (`python -m golden_tasks.planning.discover`),
which imports them. A module whose import ends that process (a crash, an exit) fails its own cases,
under a record of what was read until then, and the others are planned in another.
"""
import dataclasses
import functools
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from ..model.hashing import digest_bytes
from ..model.origin import library_dirs
from ..model.plan import FailedPlan, from_json
from ..project import config, reaper
from ..project.observe import Observer, changed, logged, snapshot
from ..project.toolchain import pipeline_version, toolchain, triton_settings
from ..storage.store import Store


@functools.cache
def _environment() -> dict:
    """What every plan depends on besides its record: golden_tasks, the toolchain, Triton's settings (a
    Triton kernel's fingerprint holds them), and the installed packages, wherever this interpreter finds
    them (installing, upgrading or removing one changes its directory's mtime)."""
    return {"pipeline": pipeline_version(), "toolchain": toolchain(), "triton": triton_settings(),
            "packages": {p: os.stat(p).st_mtime_ns if os.path.isdir(p) else None for p in sorted(library_dirs())}}


def _manifest_path(root: Path, module: str) -> str:
    # Per checkout: two checkouts sharing a cache may hold different sources. Per profile (and
    # world size): the same sources plan other shapes under another, and switching back re-plans nothing.
    return f"plans/{digest_bytes(str(root.resolve()).encode())[:16]}/{config.planning_context()}/{module}.json"


def _fresh(manifest: dict, memo: dict) -> bool:
    """Whether a manifest's plans still hold. Plans with parts that cannot be fingerprinted are
    made again on every run: nothing says whether those parts changed."""
    return (manifest.get("environment") == _environment() and not changed(manifest["observed"], memo)
            and not any(plan.get("volatile") for plan in manifest["cases"]))


def observed(root: Path, store: Store, modules: list) -> tuple[set, set]:
    """(the files, the folders) that the last planning of each of `modules` read or listed, as recorded in
    its manifest (a module not planned yet adds nothing): what a watcher of those modules' cases watches."""
    files, dirs = set(), set()
    for module in modules:
        manifest = store.read_json(_manifest_path(root, module))
        if manifest:
            files |= set(manifest["observed"]["files"])
            dirs |= set(manifest["observed"]["dirs"])
    return files, dirs


def load_plans(root: Path, store: Store) -> list:
    """Every case's Plan under the active profile, in module order; a module that fails yields one FailedPlan."""
    manifests, stale, memo = {}, [], {}  # memo: states shared by the modules' records
    modules = [m.name for m in config.Project.at(root).layout.modules()]
    for module in modules:
        manifest = store.read_json(_manifest_path(root, module))
        if manifest and _fresh(manifest, memo):
            manifests[module] = manifest
        else:
            stale.append(module)
    if stale:
        for module, manifest in plan_in_subprocess(root, stale).items():
            manifest["environment"] = _environment()
            store.write_json(_manifest_path(root, module), manifest)
            manifests[module] = manifest
    return [from_json(record) for module in modules for record in manifests[module]["cases"]]


def forget(root: Path, store: Store, module: str) -> None:
    """Drop the plan manifest of kernel module `module` so the next load re-plans it: a worker found
    that its plan no longer matches the source."""
    store.remove(_manifest_path(root, module))


def plan_in_subprocess(root: Path, modules: list, profile: str = None) -> dict:
    """plan_modules(root, modules), run in a fresh interpreter under `profile` (default: the active one).
    A module whose import ends that interpreter (a crash, an exit) fails its own cases (_ended), and the
    other modules are planned again without it. Raises RuntimeError, with the subprocess's stderr, when it
    fails otherwise."""
    env = dataclasses.replace(config.current(), profile=profile).process_environment() if profile else None
    planned, left = {}, list(modules)
    while left:
        try:
            fd, log = tempfile.mkstemp(prefix="golden-tasks-planning-", suffix=".log")
            os.close(fd)
        except OSError:  # no room for it: a module that ends the process is then not known
            log = None
        try:
            proc = reaper.python_module("golden_tasks.planning.discover", str(root), log or os.devnull, *left,
                                        cwd=root, env=env)
            reads = Path(log).read_text(errors="surrogateescape") if log else ""
        finally:
            if log:
                os.unlink(log)
        if proc.returncode == 0:
            try:
                return {**planned, **json.loads(proc.stdout)}
            except ValueError:
                pass
        importing = [line.partition("\t")[2] for line in reads.splitlines() if line.startswith(f"{_IMPORTING}\t")]
        if proc.returncode == 0 or not importing:  # not a module's doing
            raise RuntimeError(f"planning the kernel library failed:\n{proc.stderr}")
        planned[importing[-1]] = _ended(root, importing[-1], proc, reads, profile or config.profile())
        left.remove(importing[-1])
    return planned


_IMPORTING = "importing"  # the line of plan_modules's log that names the module it imports next


def _ended(root: Path, module: str, proc, reads: str, profile: str) -> dict:
    """The manifest of a module whose import ended the planning process: its one FailedPlan, saying how (and
    the process's last words), under the record of everything read until then (the Observer's log), so that
    it is reused until one of those changes, as a planned module's is."""
    layout = config.Project.at(root).layout
    path = layout.module(module).path
    how = (f"killed by signal {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
           else f"exit status {proc.returncode}")
    said = "\n".join(proc.stderr.strip().splitlines()[-20:])
    error = f"{layout.relative(path)} ended the planning process as it was imported ({how})" + f":\n{said}" * bool(said)
    seen = logged(reads)
    record = snapshot(seen["files"] | {str(path)}, seen["dirs"] | seen["import_dirs"], seen["env"])
    return {"cases": [FailedPlan(path.stem, module, error, profile).to_json()], "observed": record}


def plan_modules(root: Path, modules: list, log: int = None) -> dict:
    """Import each kernel module (by name, from the project's layout) and plan its cases, each plan
    recording the profile (runs in the subprocess). `log`: a file descriptor that a line names each module
    as its import starts on, and every read is written to as it is made (Observer), so that whoever started
    a process that dies mid-import knows which module it was and what it had read."""
    from ..forms.triton_form import import_hint  # noqa: PLC0415
    from ..model.origin import described, is_user_module  # noqa: PLC0415
    from .case import plans_of  # noqa: PLC0415
    from .datasets import cases_of  # noqa: PLC0415
    from .unplanned import Unplanned  # noqa: PLC0415

    project = config.Project.at(root).layout
    project.importable()
    result, profile = {}, config.profile()
    with Observer(log) as observer:
        for module_name in modules:
            found = project.module(module_name)
            shown = project.relative(found.path)
            observer.note(f"{_IMPORTING}\t{module_name}")
            observer.add("dirs" if found.dataset else "files", str(found.path))
            try:
                module, cases = cases_of(module_name, found.dataset)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 -- user code: its error fails the module's plans
                reason, _, trace = described(exc).partition("\n")
                hint = import_hint(exc)
                failed = "could not be read" if found.dataset else "failed to import"
                result[module_name] = [FailedPlan(found.path.stem, module_name, f"{shown} {failed}: {reason}"
                                                  + f"; {hint}" * bool(hint) + f"\n{trace}" * bool(trace), profile)]
                continue
            plans = []
            for case in cases:
                if isinstance(case, Unplanned):  # a dataset's case that its reader could not make
                    plans.append(FailedPlan(case.name, module_name, case.error, profile, case.sweep_of))
                    continue
                try:
                    points = case.points()
                except (Exception, SystemExit) as exc:  # noqa: BLE001 -- a bad sweep fails the case's plan
                    plans.append(FailedPlan(case.name, module_name, described(exc), profile))
                    continue
                for point in points:  # a point's failure is its own
                    try:
                        made, used = plans_of(point.resolved(module), module_name, profile)
                        for name in used:
                            observer.add("files", name)
                        for name in made[0].external["env"]:
                            observer.add("env", name)
                    except (Exception, SystemExit) as exc:  # noqa: BLE001 -- user code: its error fails the plan
                        made = [FailedPlan(point.name, module_name, described(exc), profile, point.sweep_of)]
                    plans.extend(made)
            names = [p.case for p in plans]
            result[module_name] = [FailedPlan(p.case, module_name, f"case name {p.case!r} is defined more than "
                                              f"once in {shown}", profile) if names.count(p.case) > 1 else p
                                   for p in plans]
    # Every user module now loaded, in the project or not, may have shaped a plan: depend on all of them.
    observer.files |= {str(Path(m.__file__).resolve()) for n, m in list(sys.modules.items())
                       if getattr(m, "__file__", None) and n != "__main__" and is_user_module(n)}
    records = {failed: observer.record(failed) for failed in (False, True)}
    return {module: {"cases": [p.to_json() for p in plans], "observed": records[any(p.error for p in plans)]}
            for module, plans in result.items()}


if __name__ == "__main__":
    # The plans go to stdout (a pipe: no file to write, so a full disk cannot lose them); whatever
    # the kernel modules print goes to stderr instead.
    plans_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    root_arg, log_arg, *module_args = sys.argv[1:]
    config.quiet_third_party_logs()
    log_fd = os.open(log_arg, os.O_WRONLY | os.O_APPEND)
    json.dump(plan_modules(Path(root_arg).resolve(), module_args, log_fd), plans_out)
    plans_out.close()
