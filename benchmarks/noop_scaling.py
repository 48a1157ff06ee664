"""What a no-op `doit verify` costs as a library grows, side by side in one run.

For generated libraries of trivial eager cases (8x8 tensors, `rounds=3`, ten cases per module, each
with a seed of its own; every case's kernel is the same, so compiled once), each in a temporary project
with its own cache:

- the cold `doit -n 2 verify` once (its wall time per case);
- the no-op `doit -n 2 verify` (the median of `--repeats`), against (a) `python -c "import torch"`
  and (b) doit's floor: a dodo.py of as many trivially up-to-date tasks as the library has;
- the run right after one kernel module was edited (a comment: only that module is planned again,
  every stage stays cached).

Goals (issue 28): library no-op <= 0.15x import torch; at 1,000 cases <= 1.5x doit's floor and under
1 s; from 300 to 1,000 cases the no-op grows linearly or better.

    python benchmarks/noop_scaling.py [--sizes 30 300 1000] [--repeats 3]
"""
import argparse
import os
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

MODULE = '''import torch
from golden_tasks import Case, In, Out, TensorSpec, jit


@jit(backend="eager")
def add_one(x: In, out: Out):
    torch.add(x, 1.0, out=out)


def golden(t):
    t["out"].copy_(t["x"] + 1.0)


SPECS = [TensorSpec("x", (8, 8), torch.float32, torch.randn), TensorSpec("out", (8, 8), torch.float32)]
CASES = [Case(f"m{module}_c{i}", SPECS, add_one, golden=golden, rounds=3, warmup=1, seed={module} * {per} + i)
         for i in range({cases})]
'''

FLOOR = '''def _nothing():
    return True


def task_t():
    for i in range({tasks}):
        yield {{"name": str(i), "actions": [(_nothing,)], "uptodate": [True]}}
'''


def timed(cmd: list, cwd: Path, env: dict) -> float:
    """Wall seconds of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed in {cwd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 300, 1000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    doit = [sys.executable, "-m", "doit"]
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONWARNINGS": "ignore"}
    print(f"{'cases':>6} {'tasks':>6} {'cold s/case':>11} {'no-op s':>8} {'torch s':>8} {'floor s':>8} "
          f"{'/torch':>7} {'/floor':>7} {'edited s':>9}", flush=True)
    noops = {}
    with tempfile.TemporaryDirectory() as tmp:
        for cases in args.sizes:
            path = Path(tmp) / f"lib{cases}"
            library(path, cases)
            env = {**base, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs")}
            cold = timed([*doit, "-n", "2", "verify"], path, env)
            listed = subprocess.run([*doit, "list", "--all", "-q"], cwd=path, env=env, capture_output=True, text=True)
            tasks = len(listed.stdout.split())
            floor_path = Path(tmp) / f"floor{cases}"
            floor_path.mkdir()
            (floor_path / "dodo.py").write_text(FLOOR.format(tasks=tasks))
            timed([*doit], floor_path, base)  # its database: every task up to date from now on
            noop, torch_s, floor = [], [], []
            for _ in range(args.repeats):  # alternated, so that a drift of the machine reaches all alike
                noop.append(timed([*doit, "-n", "2", "verify"], path, env))
                torch_s.append(timed([sys.executable, "-c", "import torch"], path, base))
                floor.append(timed([*doit], floor_path, base))
            with open(path / "kernels" / "gen_0000.py", "a") as f:
                f.write("# edited: a comment, so every stage stays cached\n")
            edited = timed([*doit, "-n", "2", "verify"], path, env)
            n, t, fl = (statistics.median(x) for x in (noop, torch_s, floor))
            noops[cases] = n
            print(f"{cases:>6} {tasks:>6} {cold / cases:>11.3f} {n:>8.2f} {t:>8.2f} {fl:>8.2f} {n / t:>6.2f}x "
                  f"{n / fl:>6.2f}x {edited:>9.2f}", flush=True)
    sizes = sorted(noops)
    for small, large in zip(sizes, sizes[1:]):
        print(f"no-op growth {small} -> {large} cases: {noops[large] / noops[small]:.2f}x "
              f"(linear: {large / small:.2f}x)")


if __name__ == "__main__":
    main()
