"""Planning the kernel library without importing it in the doit parent.

`load_plans` keeps one manifest per kernel module of each checkout and profile under
<cache>/plans/<checkout>/<profile>/: the module's case plans (or the error that kept it from
planning) and a record of everything planning read (golden_tasks.project.observe: every user source
file, data files opened, directories listed, environment variables read by user code). A
manifest is reused while that record, the toolchain, the pipeline and the installed packages
are unchanged; stale modules are planned in one subprocess (`python -m golden_tasks.planning.discover`),
which imports them.
"""
import functools
import json
import os
import sys
from pathlib import Path

from ..model.hashing import digest_bytes
from ..model.origin import library_dirs
from ..model.plan import FailedPlan, from_json
from ..project import config, reaper
from ..project.observe import Observer, changed
from ..project.toolchain import pipeline_version, toolchain
from ..storage.store import Store


@functools.cache
def _environment() -> dict:
    """What every plan depends on besides its record: golden_tasks, the toolchain, and the
    installed packages, wherever this interpreter finds them (installing, upgrading or removing
    one changes its directory's mtime)."""
    return {"pipeline": pipeline_version(), "toolchain": toolchain(),
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
    Raises RuntimeError, with the subprocess's stderr, when it fails."""
    env = {**os.environ, config.PROFILE_ENV: profile} if profile else None
    proc = reaper.python_module("golden_tasks.planning.discover", str(root), *modules, cwd=root, env=env)
    try:
        if proc.returncode == 0:
            return json.loads(proc.stdout)
    except ValueError:
        pass
    raise RuntimeError(f"planning the kernel library failed:\n{proc.stderr}")




def plan_modules(root: Path, modules: list) -> dict:
    """Import each kernel module (by name, from the project's layout) and plan its cases, each plan
    recording the profile (runs in the subprocess)."""
    import importlib  # noqa: PLC0415

    from ..model.origin import described, is_user_module  # noqa: PLC0415
    from .case import module_cases, plan_of  # noqa: PLC0415

    project = config.Project.at(root).layout
    project.importable()
    result, profile = {}, config.profile()
    with Observer() as observer:
        for module_name in modules:
            found = project.module(module_name)
            shown = project.relative(found.path)
            observer.files.add(str(found.path))
            try:
                module = importlib.import_module(module_name)
                cases = module_cases(module)
            except Exception as exc:  # noqa: BLE001 -- user code: its error fails the module's plans
                result[module_name] = [FailedPlan(found.path.stem, module_name,
                                                  f"{shown} failed to import: {described(exc)}", profile)]
                continue
            plans = []
            for case in cases:
                try:
                    plan, used = plan_of(case.resolved(module), module_name, profile)
                    observer.files |= used
                    observer.env |= set(plan.external["env"])
                except Exception as exc:  # noqa: BLE001 -- user code: its error fails the case's plan
                    plan = FailedPlan(case.name, module_name, described(exc), profile)
                plans.append(plan)
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
    root_arg, *module_args = sys.argv[1:]
    config.quiet_third_party_logs()
    json.dump(plan_modules(Path(root_arg).resolve(), module_args), plans_out)
    plans_out.close()
