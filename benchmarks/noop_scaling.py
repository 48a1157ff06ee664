"""What a no-op `doit verify` costs as a library grows, side by side in one run.

For generated libraries of trivial eager cases (8x8 tensors, `rounds=3`, ten cases per module, each
with a seed of its own; every case's kernel is the same, so compiled once), each in a temporary project
with its own cache:

- the cold `doit -n 2 verify` once (its wall time per case);
- the no-op `doit -n 2 verify` (the median of `--repeats`), against (a) `python -c "import torch"`
  and (b) doit's floor: a dodo.py of as many trivially up-to-date tasks as the library has;
- the run right after one kernel module was edited (a comment: only that module is planned again,
  every stage stays cached);
- `doit abi:<case>` of an unchanged module, and of that module right after another comment edit;
- the size of runs/report.json.

With --library, the kernel library of this repository (kernels/) first, the same way.

Goals (issue 28): library no-op <= 0.15x import torch; at 1,000 cases <= 1.5x doit's floor and under
1 s; from 300 to 1,000 cases the no-op grows linearly or better; `doit abi:<case>` <= 0.3 s unchanged,
within 1.3x of import torch right after an edit.

With --sweeps, a project of one trivial case swept over that many shapes (Case.sweep) too, the same way.
Goals (issue 49): at 1,000 points the no-op within 1.5x of doit's floor, the cold run under 0.3 s per point,
report.json and the HTML page each written in under 2 s, the page under 10 MB.

The floor is a dodo.py of as many trivially up-to-date tasks as the project has, with the same task_dep edges.
The report columns: writing the last run's report.json (with report.xml and the logs), and its HTML page
by `python -m golden_tasks.html_report` with its figures drawn before (as every run after the first).

    python benchmarks/noop_scaling.py [--library] [--sizes 30 300 1000] [--sweeps 100 300 1000] [--repeats 3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_MODULE = 10

DODO = '''from pathlib import Path
from golden_tasks.doit_tasks import DOIT_CONFIG, tasks_for  # noqa: F401
globals().update(tasks_for(Path(__file__).parent))
'''

KERNEL = '''import torch
from golden_tasks import Case, In, Out, TensorSpec, jit


@jit(backend="eager")
def add_one(x: In, out: Out):
    torch.add(x, 1.0, out=out)


def golden(t):
    t["out"].copy_(t["x"] + 1.0)

'''  # every generated module's kernel and golden

MODULE = KERNEL + '''
SPECS = [TensorSpec("x", (8, 8), torch.float32, torch.randn), TensorSpec("out", (8, 8), torch.float32)]
CASES = [Case(f"m{module}_c{i}", SPECS, add_one, golden=golden, rounds=3, warmup=1, seed={module} * {per} + i)
         for i in range({cases})]
'''

SWEEP = KERNEL + '''
def specs(n):
    return [TensorSpec("x", (n, 8), torch.float32, torch.randn), TensorSpec("out", (n, 8), torch.float32)]


CASES = [Case("add_one", specs, add_one, golden=golden, rounds=3, warmup=1, sweep={{"n": range(1, {points} + 1)}})]
'''

FLOOR = '''import json
from pathlib import Path

DEPS = json.loads(Path(__file__).with_name("deps.json").read_text())  # task -> the tasks it depends on


def _nothing():
    return True


def _group(group):
    def create():
        for task, deps in DEPS.items():
            if task.partition(":")[0] == group:
                yield {{"name": task.partition(":")[2], "actions": [(_nothing,)], "task_dep": deps, "uptodate": [True]}}
    create.__name__ = f"task_{{group}}"
    return create


globals().update({{f"task_{{g}}": _group(g) for g in {{t.partition(":")[0] for t in DEPS}}}})
'''


def floor_deps(tasks: list) -> dict:
    """doit's floor for a graph of the same shape: every task of `tasks` (as `doit list --all -q` lists them)
    with the task_dep edges ours have (the stage table's reads, runtime and verify on a case's stages, a
    case's verify on its baselines', a sweep's on its points'), each trivially up to date."""
    from golden_tasks.pipeline.stage_table import STAGES

    names, deps = set(tasks), {}
    for task in tasks:
        group, _, case = task.partition(":")
        own = [f"{s.name}:{case}" for s in STAGES if f"{s.name}:{case}" in names]
        stage = next((s for s in STAGES if s.name == group), None)
        if stage:  # what it reads: the case's own task, or the one every case shares (calibrate:machine)
            deps[task] = [d for d in [f"plan:{case}"] + [next((t for t in (f"{r}:{case}", f"{r}:machine")
                                                               if t in names), "") for r in stage.reads + stage.after]
                          if d in names]
        elif group in ("runtime", "verify"):
            deps[task] = own + [f"runtime:{case}"] * (group == "verify" and f"runtime:{case}" in names) + [
                t for t in names if group == "verify" and t.startswith((f"verify:{case}@", f"verify:{case}."))]
        else:
            deps[task] = []
    return deps


def timed(cmd: list, cwd: Path, env: dict) -> float:
    """Wall seconds of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        failed = [line for line in proc.stdout.splitlines() if ": FAIL at " in line or "error" in line.lower()]
        sys.exit(f"{' '.join(map(str, cmd))} failed in {cwd}:\n" + "\n".join(failed[:20] or [proc.stdout[-3000:]])
                 + f"\n{proc.stderr[-3000:]}")
    return seconds


def library(path: Path, cases: int) -> None:
    """A project at `path` with `cases` generated cases, PER_MODULE to a module."""
    kernels = path / "kernels"
    kernels.mkdir(parents=True)
    (path / "dodo.py").write_text(DODO)
    (kernels / "__init__.py").write_text("")
    for m in range(0, cases, PER_MODULE):
        text = MODULE.replace("{module}", str(m // PER_MODULE)).replace("{per}", str(PER_MODULE))
        text = text.replace("{cases}", str(min(PER_MODULE, cases - m)))
        (kernels / f"gen_{m // PER_MODULE:04d}.py").write_text(text)


def sweep_library(path: Path, points: int) -> None:
    """A project at `path` with one case swept over `points` shapes."""
    kernels = path / "kernels"
    kernels.mkdir(parents=True)
    (path / "dodo.py").write_text(DODO)
    (kernels / "__init__.py").write_text("")
    (kernels / "add_one.py").write_text(SWEEP.format(points=points))


def copied_library(path: Path) -> None:
    """A project at `path` with this repository's kernel library."""
    path.mkdir(parents=True)
    (path / "dodo.py").write_text(DODO)
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))


def measure(name: str, path: Path, tmp: Path, base: dict, repeats: int) -> float:
    """Print the row of the project at `path`; return its no-op seconds."""
    doit = [sys.executable, "-m", "doit"]
    env = {**base, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs")}
    cold = timed([*doit, "-n", "2", "verify"], path, env)
    listed = subprocess.run([*doit, "list", "--all", "-q"], cwd=path, env=env, capture_output=True, text=True)
    tasks = len(listed.stdout.split())
    cases = sum(1 for t in listed.stdout.split() if t.startswith("abi:"))
    first = next(t.partition(":")[2] for t in listed.stdout.split() if t.startswith("abi:"))
    modules = sorted((path / "kernels").glob("[!_]*.py"))  # the edited one: where the timed case is named
    module = next((m for m in modules if f'"{first}"' in m.read_text()), modules[0])
    floor_path = tmp / f"floor-{name}"
    floor_path.mkdir()
    (floor_path / "dodo.py").write_text(FLOOR.format())
    (floor_path / "deps.json").write_text(json.dumps(floor_deps(listed.stdout.split())))
    timed(doit, floor_path, base)  # its database: every task up to date from now on
    noop, torch_s, floor, abi = [], [], [], []
    for _ in range(repeats):  # alternated, so that a drift of the machine reaches all alike
        noop.append(timed([*doit, "-n", "2", "verify"], path, env))
        torch_s.append(timed([sys.executable, "-c", "import torch"], path, base))
        floor.append(timed(doit, floor_path, base))
        abi.append(timed([*doit, f"abi:{first}"], path, env))
    with open(module, "a") as f:
        f.write("# edited: a comment, so every stage stays cached\n")
    edited = timed([*doit, "-n", "2", "verify"], path, env)
    with open(module, "a") as f:
        f.write("# edited again\n")
    abi_edited = timed([*doit, f"abi:{first}"], path, env)
    n, t, fl, a = (statistics.median(x) for x in (noop, torch_s, floor, abi))
    kb = (path / "runs" / "report.json").stat().st_size / 1024
    report_s, page_s, page_mb = report_times(path, env)
    print(f"{name:>8} {cases:>6} {tasks:>6} {cold / cases:>11.3f} {n:>8.2f} {t:>8.2f} {fl:>8.2f} {n / t:>6.2f}x "
          f"{n / fl:>6.2f}x {edited:>9.2f} {a:>6.2f} {abi_edited:>7.2f} {abi_edited / t:>6.2f}x {kb:>8.0f} "
          f"{report_s:>8.2f} {page_s:>7.2f} {page_mb:>7.1f}", flush=True)
    return n


REPORT = """import json, sys, time
from pathlib import Path
from golden_tasks.model.records import RunRecord
from golden_tasks.reports import report
runs = Path(sys.argv[1])
record = RunRecord.from_json(json.loads((runs / "report.json").read_text()))
start = time.perf_counter()
report.write_files(runs, record)
print(time.perf_counter() - start)
"""


def report_times(path: Path, env: dict) -> tuple[float, float, float]:
    """(seconds to write the last run's report.json, report.xml and logs; seconds to write its HTML page with
    its figures drawn before, by a run's own `python -m golden_tasks.html_report`; the page's MB)."""
    written = subprocess.run([sys.executable, "-c", REPORT, str(path / "runs")], env=env, capture_output=True,
                             text=True, check=True)
    page = timed([sys.executable, "-m", "golden_tasks.html_report", "--project", str(path)], path, env)
    return float(written.stdout), page, (path / "runs" / "report.html").stat().st_size / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", action="store_true", help="also this repository's kernel library, first")
    parser.add_argument("--sizes", type=int, nargs="*", default=[30, 300, 1000])
    parser.add_argument("--sweeps", type=int, nargs="*", default=[],
                        help="also one case swept over this many shapes (100 300 1000), after the libraries")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONWARNINGS": "ignore"}
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package runs: its bytecode cached, not compiled
    print(f"{'project':>8} {'cases':>6} {'tasks':>6} {'cold s/case':>11} {'no-op s':>8} {'torch s':>8} "
          f"{'floor s':>8} {'/torch':>7} {'/floor':>7} {'edited s':>9} {'abi s':>6} {'abi ed.':>7} "
          f"{'/torch':>7} {'json KB':>8} {'report s':>8} {'page s':>7} {'page MB':>7}", flush=True)
    noops = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.library:
            copied_library(Path(tmp) / "library")
            measure("library", Path(tmp) / "library", Path(tmp), base, args.repeats)
        for cases in args.sizes:
            path = Path(tmp) / f"lib{cases}"
            library(path, cases)
            noops[cases] = measure(str(cases), path, Path(tmp), base, args.repeats)
        for points in args.sweeps:
            path = Path(tmp) / f"sweep{points}"
            sweep_library(path, points)
            measure(f"sweep{points}", path, Path(tmp), base, args.repeats)
    sizes = sorted(noops)
    for small, large in zip(sizes, sizes[1:]):
        print(f"no-op growth {small} -> {large} cases: {noops[large] / noops[small]:.2f}x "
              f"(linear: {large / small:.2f}x)")


if __name__ == "__main__":
    main()
