"""What the benchmark's defences (docs/threat-model.md) cost an honest kernel, side by side in one run.

For honest kernels of about 10 us, 100 us and 1 ms (a matmul of three sizes):

- the time the bench stage reports (its median round) against torch.utils.benchmark.Timer on the same call
  (`blocked_autorange`, whose clock costs almost nothing per call): goal within 10%; and against a plain
  loop timing each call with perf_counter (as the bench does, without its defences). Timer's blocks run
  the calls back to back, which for a small multi-threaded matmul is not what one call costs: where
  Timer and the plain loop disagree, the bench should agree with the plain loop. Both run in a child
  forked from golden_tasks' forkserver (golden_tasks.forms.isolate), the kind of process the bench's rank is:
  the same matmul is 5-10% slower in this script's own process, which has started and waited on others;
- the bench stage's wall time with the defences (this checkout) and before them (`--before`, by default
  the commit before they landed, unpacked with `git archive`), each in its own process and cache, the
  same kernel, the same default adaptive rounds.

Each figure is the median of `--repeats` alternated runs, so a drift of the machine reaches all alike.

    python benchmarks/integrity.py [--before afa3949] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.benchmark import Timer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from golden_tasks.forms import isolate  # noqa: E402 -- this checkout's, not an installed one

SIZES = {"10 us": 40, "100 us": 120, "1 ms": 400}  # matmul sizes near those times on a 2-core CPU

KERNEL = '''
import torch
from golden_tasks import In, Out, jit


@jit(backend="eager")
def matmul(x: In, out: Out):
    torch.matmul(x, x, out=out)


def golden(t):
    t["out"].copy_(t["x"].double().matmul(t["x"].double()).float())
'''

# Run in a checkout (PYTHONPATH): the case once, in its own cache; prints the bench's median and wall time.
MEASURE = '''
import json, sys, torch, golden_tasks
from golden_tasks import TensorSpec
from integrity_kernel import golden, matmul
n, cache = int(sys.argv[1]), sys.argv[2]
specs = [TensorSpec("x", (n, n), torch.float32, torch.randn), TensorSpec("out", (n, n), torch.float32)]
result = golden_tasks.run(fn=matmul, specs=specs, golden=golden, rtol=1e-4, atol=1e-3, name=f"matmul{n}",
                          cache_dir=cache, runs_dir=cache + "-runs")
assert result.passed, result.error
bench = result.bench if isinstance(result.bench, dict) else result.bench.to_json()  # --before: a dict
print(json.dumps({"median": bench["median"], "seconds": result.timings["bench"], "rounds": bench["rounds"]}))
'''


def measure(tree: Path, n: int, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(cache.parent)])}
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(n), str(cache)], cwd=cache.parent, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def timer_median(n: int, threads: int) -> float:
    """Timer's median call on the same work, with `threads` threads (a process's default, as the bench's
    rank process has)."""

    x, out = torch.randn(n, n), torch.empty(n, n)
    timer = Timer("torch.matmul(x, x, out=out)", globals={"torch": torch, "x": x, "out": out},
                  num_threads=threads)
    return timer.blocked_autorange(min_run_time=1.0).median * 1e6


def loop_median(n: int) -> float:
    """The median of calls timed one by one with perf_counter, with the process's threads."""
    x, out = torch.randn(n, n), torch.empty(n, n)
    calls = max(200, int(0.5 / max(timer_median(n, torch.get_num_threads()) * 1e-6, 1e-6)))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        torch.matmul(x, x, out=out)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="afa3949", help="the checkout without the defences (a git revision)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import integrity  # this file as a module (its folder is sys.path[0]): a child finds its functions by name
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "integrity_kernel.py").write_text(KERNEL)
        before = tmp / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "x", "-C", str(before)], input=archive, check=True)
        print(f"{'kernel':<8} {'Timer us':>9} {'loop us':>8} {'bench us':>9} {'/Timer':>7} {'/loop':>6}   "
              f"{'bench s before':>14} {'bench s now':>11} {'ratio':>6}   rounds before/now")
        for label, n in SIZES.items():
            timers, loops, now, old = [], [], [], []
            for r in range(args.repeats):
                now.append(measure(ROOT, n, tmp / f"now{n}-{r}"))
                timers.append(isolate.call(integrity.timer_median, (n, torch.get_num_threads()), 600, "Timer"))
                loops.append(isolate.call(integrity.loop_median, (n,), 600, "the plain loop"))
                old.append(measure(before, n, tmp / f"before{n}-{r}"))
            timer, loop = statistics.median(timers), statistics.median(loops)
            bench = statistics.median(m["median"] for m in now)
            wall_now = statistics.median(m["seconds"] for m in now)
            wall_old = statistics.median(m["seconds"] for m in old)
            rounds = [statistics.median(m["rounds"] for m in runs) for runs in (old, now)]
            print(f"{label:<8} {timer:>9.1f} {loop:>8.1f} {bench:>9.1f} {bench / timer:>6.2f}x {bench / loop:>5.2f}x   "
                  f"{wall_old:>14.2f} {wall_now:>11.2f} {wall_now / wall_old:>5.2f}x   {rounds[0]:.0f}/{rounds[1]:.0f}")


if __name__ == "__main__":
    main()
