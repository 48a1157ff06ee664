"""Planning the kernel library without importing it in the doit parent.

`load_plans` keeps one manifest per kernel module of each checkout and profile under
<cache>/plans/<checkout>/<profile>/: the module's case plans and the digest of every project source
file the plans depend on. A manifest is reused while those files, the toolchain and the
pipeline are unchanged; stale modules are planned in one subprocess
(`python -m golden_tasks.discover`), which imports them.
"""
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from . import config
from .graph import pipeline_version
from .hashing import digest_bytes, digest_file
from .store import Store
from .toolchain import toolchain


def kernel_modules(root: Path) -> list:
    """Case modules: kernels/*.py except private helpers (_*.py)."""
    return sorted(p for p in (root / "kernels").glob("*.py") if not p.name.startswith("_"))


def _environment() -> dict:
    return {"pipeline": pipeline_version(), "toolchain": toolchain()}


def _fresh(manifest: dict, digests: dict) -> bool:
    """Whether the manifest's sources are unchanged; `digests` memoizes file digests
    across the modules of one load (they share most of their dependencies)."""
    if manifest.get("environment") != _environment() or manifest.get("failed"):
        return False
    for f, d in manifest["files"].items():
        if f not in digests:
            try:
                digests[f] = digest_file(Path(f))
            except OSError:
                digests[f] = None
        if digests[f] != d:
            return False
    return True


def load_plans(root: Path, store: Store) -> list:
    """Every case's plan under the active profile, in module order; a module that fails yields one error plan."""
    # Per checkout: two checkouts sharing a cache may hold different sources. Per profile: the
    # same sources plan other shapes under another profile, and switching back re-plans nothing.
    plans_dir = f"plans/{digest_bytes(str(root.resolve()).encode())[:16]}/{config.profile()}"
    manifests, stale, digests = {}, [], {}
    for path in kernel_modules(root):
        manifest = store.read_json(f"{plans_dir}/{path.stem}.json")
        if manifest and _fresh(manifest, digests):
            manifests[path.stem] = manifest
        else:
            stale.append(path.stem)
    if stale:
        for stem, manifest in plan_in_subprocess(root, stale).items():
            manifest["environment"] = _environment()
            store.write_json(f"{plans_dir}/{stem}.json", manifest)
            manifests[stem] = manifest
    return [plan for path in kernel_modules(root) for plan in manifests[path.stem]["cases"]]


def plan_in_subprocess(root: Path, stems: list, profile: str = None) -> dict:
    """plan_modules(root, stems), run in a fresh interpreter under `profile` (default: the active one).
    Raises RuntimeError, with the subprocess's stderr, when it fails."""
    env = {**os.environ, config.PROFILE_ENV: profile} if profile else None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plans.json"
        proc = subprocess.run([sys.executable, "-m", "golden_tasks.discover", str(root), str(out), *stems],
                              cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"planning the kernel library failed:\n{proc.stderr}")
        return json.loads(out.read_text())


def _import_error(stem: str, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/kernels/" in f.filename]
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"kernels/{stem}.py failed to import: {type(exc).__name__}: {exc}{where}"


def plan_modules(root: Path, stems: list) -> dict:
    """Import each module and plan its cases, each plan recording the profile (runs in the subprocess)."""
    import importlib  # noqa: PLC0415

    from .case import module_cases, plan_of  # noqa: PLC0415
    from .fingerprint import is_user_module  # noqa: PLC0415

    sys.path.insert(0, str(root))
    result = {}
    for stem in stems:
        module_name = f"kernels.{stem}"
        files = {str((root / "kernels" / f"{stem}.py").resolve())}
        try:
            module = importlib.import_module(module_name)
            cases = module_cases(module)
        except Exception as exc:
            result[stem] = {"failed": True, "files": {},
                            "cases": [{"case": stem, "module": module_name, "error": _import_error(stem, exc)}]}
            continue
        plans = []
        for case in cases:
            try:
                plan, used = plan_of(case.resolved(module), module_name)
                files |= used
            except Exception as exc:
                plan = {"case": case.name, "module": module_name, "error": f"{type(exc).__name__}: {exc}"}
            plans.append(plan)
        names = [p["case"] for p in plans]
        for plan in plans:
            if names.count(plan["case"]) > 1:
                plan["error"] = f"case name {plan['case']!r} is defined more than once in kernels/{stem}.py"
        # a broken case (missing data files, say) is planned again every time, until it is fixed
        result[stem] = {"files": files, "cases": plans, "failed": any("error" in p for p in plans)}
    # Every project module now loaded may have shaped a plan: depend on all of them.
    loaded = {str(Path(m.__file__).resolve()) for n, m in list(sys.modules.items())
              if getattr(m, "__file__", None) and is_user_module(n)
              and Path(m.__file__).resolve().is_relative_to(root.resolve())}
    for entry in result.values():
        for plan in entry["cases"]:
            plan["profile"] = config.profile()
        if isinstance(entry["files"], set):
            entry["files"] = {f: digest_file(Path(f)) for f in sorted(entry["files"] | loaded)}
    return result


if __name__ == "__main__":
    root_arg, out_arg, *stem_args = sys.argv[1:]
    Path(out_arg).write_text(json.dumps(plan_modules(Path(root_arg).resolve(), stem_args)))
