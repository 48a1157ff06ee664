"""A temporary copy of the project (dodo.py and some kernels) with its own cache, driven by real doit."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = "GT_TEST_CALIBRATION"  # a cache holding this machine's calibration (conftest.calibration)


def seed_calibration(cache: Path) -> None:
    """Start `cache` with the session's calibration of this machine (its entries and their objects), so that no
    test measures the machine again; a run whose key differs (another toolchain, a cluster) measures its own."""
    if not (found := os.environ.get(CALIBRATION)):
        return
    for part in ("entries", "objects"):
        shutil.copytree(Path(found) / part, cache / part, dirs_exist_ok=True)


class Project:
    def __init__(self, path: Path, modules=None, cache: Path = None, html: bool = False, calibrated: bool = True,
                 baselines: bool = False):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "dodo.py", path)
        (path / "kernels").mkdir(exist_ok=True)
        for source in sorted((ROOT / "kernels").glob("*.py")):
            if modules is None or source.stem in modules or source.stem.startswith("_"):
                shutil.copy(source, path / "kernels" / source.name)
        self.cache = cache or path / "cache"
        if calibrated:  # False: no cache folder until a run makes one
            seed_calibration(self.cache)
        self.env = {**os.environ, "GOLDEN_TASKS_CACHE": str(self.cache), "GOLDEN_TASKS_RUNS": str(path / "runs"),
                    "PYTHONWARNINGS": "ignore",
                    # runs/report.html only where a test reads it: plotting costs seconds on every run that changes
                    "GOLDEN_TASKS_HTML": "1" if html else "0",
                    # the library's baselines only where a test reads them: each costs a compile (AOTInductor's)
                    # and a benchmark in every cold run
                    "GOLDEN_TASKS_BASELINES": "1" if baselines else "0"}
        for inherited in ("GOLDEN_TASKS_CACHE_READONLY", "GOLDEN_TASKS_OVERLAY"):  # a test that set them in-process
            self.env.pop(inherited, None)

    def command(self, *args):
        return [sys.executable, "-m", "doit", *args]

    def doit(self, *args, env=None):
        """Run doit with the JSON reporter; return (exit code, {task: result}, report, stderr). A result is
        doit's ("success", "fail", "up-to-date", ...), or "unmet" for a task that a failure upstream kept from
        running (doit reports it as failed, never started)."""
        proc = subprocess.run(self.command("--reporter=json", *args), cwd=self.path, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=1200)
        try:
            report = json.loads(proc.stdout)
        except ValueError:
            raise AssertionError(f"doit printed no JSON report:\n{proc.stdout}\n{proc.stderr}") from None
        # the JSON reporter captures what the parent and each task write to stderr
        err = proc.stderr + report.get("err", "") + "".join(t.get("err") or "" for t in report["tasks"])
        results = {t["name"]: "unmet" if t["result"] == "fail" and not t["started"] else t["result"]
                   for t in report["tasks"]}
        return proc.returncode, results, report, err

    def console(self, *args, env=None):
        return subprocess.run(self.command(*args), cwd=self.path, env={**self.env, **(env or {})},
                              capture_output=True, text=True, timeout=1200)

    def cli(self, *args):
        return subprocess.run([sys.executable, "-m", "golden_tasks.cli", *args], cwd=self.path, env=self.env,
                              capture_output=True, text=True, timeout=600)

    def edit(self, module, old, new):
        path = self.path / "kernels" / f"{module}.py"
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} not found once in {path}"
        path.write_text(text.replace(old, new))

    def restore(self, module):
        shutil.copy(ROOT / "kernels" / f"{module}.py", self.path / "kernels" / f"{module}.py")

    def entries(self, stage=None):
        """Entry manifests in the cache, as dicts."""
        pattern = f"entries/{stage or '*'}/*/*.json"
        return [json.loads(p.read_text()) for p in sorted(self.cache.glob(pattern))]


def copy_checkout(dest: Path) -> Path:
    """The source tree as a fresh clone has it: no cache, runs, build leftovers or git metadata."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
        "cache", "runs", ".doit.db*", "build", "dist", "*.egg-info", "__pycache__", ".git", ".pytest_cache", ".venv"))
    return dest


def package_view(folder: Path) -> Path:
    """A folder of links to this interpreter's installed packages (torch, numpy... and their
    *.dist-info) but golden-tasks: a site tree to reach them through without this checkout's
    install. (An editable install is a .pth file and a finder there; a folder that is no site
    directory runs no .pth file.)"""
    folder.mkdir(parents=True)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if "golden_tasks" not in entry.name.lower().replace("-", "_"):
            (folder / entry.name).symlink_to(entry)
    return folder


def fresh_venv(path: Path, system_site_packages: bool = False, python=sys.executable) -> Path:
    """A virtual environment at `path`, made by `python`, that sees this machine's packages (torch
    and the other dependencies: no download) through a .pth file linking a `package_view` (unless
    `system_site_packages`: then only those of `python`'s installation), but not this checkout's
    own install of golden-tasks; returns its python. It has no pip of its own (whose old bundled
    setuptools would hide the one torch requires): this interpreter's pip installs into it
    (`pip --python`)."""
    subprocess.run([python, "-m", "venv", "--without-pip", *(["--system-site-packages"] * system_site_packages),
                    str(path)], check=True)
    venv_python = path / "bin" / "python"
    if not system_site_packages:
        site = Path(subprocess.run([venv_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip())
        (site / "machine-packages.pth").write_text(f"{package_view(path / 'machine-packages')}\n")
    return venv_python


def base_install(path: Path) -> Path:
    """A Python installation at `path` with this machine's packages installed in its own
    site-packages, as a container's preinstalled torch is: this interpreter's binary copied (it
    finds its installation beside it), its standard library linked, a `package_view` as its
    site-packages. Returns its python."""
    base = Path(sys.base_prefix)
    executable = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    python = path / executable.relative_to(base)
    python.parent.mkdir(parents=True)
    shutil.copy2(executable, python)
    site = Path(sysconfig.get_path("purelib", "posix_prefix", vars={"base": str(path), "platbase": str(path)}))
    (path / stdlib.relative_to(base)).mkdir(parents=True, exist_ok=True)
    for entry in stdlib.iterdir():
        if path / stdlib.relative_to(base) / entry.name != site:
            (path / stdlib.relative_to(base) / entry.name).symlink_to(entry)
    package_view(site)
    return python


def recipe(cache: Path, entry: dict) -> dict:
    """What went into an entry's key: the object its "recipe" names."""
    return json.loads((cache / "objects" / entry["recipe"][:2] / entry["recipe"]).read_text())


def recipe_differences(cache: Path, stage: str, case: str) -> str:
    """What differs between the recipes (what enters the key) of `case`'s `stage` entries in `cache`:
    why a stage that should have been a hit was computed again under another key."""
    recipes = [recipe(cache, e) for e in map(json.loads, map(Path.read_text, sorted(cache.glob(f"entries/{stage}/*/*.json"))))
               if e["case"] == case]

    def flat(value, prefix=""):
        if isinstance(value, dict):
            return {k: v for name, item in value.items() for k, v in flat(item, f"{prefix}{name}.").items()}
        return {prefix.rstrip("."): json.dumps(value)[:200]}
    flats = [flat(r) for r in recipes]
    differing = sorted({k for f in flats for k in f if len({g.get(k) for g in flats}) > 1})
    return f"{len(recipes)} {stage} entries of {case}; differing: " + "; ".join(
        f"{k}: {' | '.join(str(f.get(k)) for f in flats)}" for k in differing)


def ran(results):
    return {name for name, r in results.items() if r in ("success", "fail")}


def stage_results(results):
    """Results of the stage and plan tasks (not the verify groups)."""
    return {n: r for n, r in results.items() if not n.startswith("verify")}
