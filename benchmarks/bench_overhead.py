"""The bench stage's overhead per round for a trivial kernel, against torch.utils.benchmark.Timer on the
same function, side by side in one run.

- Timer: `torch.utils.benchmark.Timer(...).blocked_autorange()` times blocks of many calls and divides,
  so its clock costs almost nothing per call: the function's own time, as close as Python measures it.
- bench: `golden_tasks.run` with a fixed number of rounds (the bench stage in its isolated child, each
  round timed on its own, its buffers refreshed before it outside its time), and with the default
  adaptive rounds. The bench's mean call over Timer's is the overhead (goal: within 10%, 1.10x); the
  medians are shown too.

The three alternate `--repeats` times and each figure is the median of its repeats, so a drift of the
machine's speed during the run (a shared VM's neighbours) reaches all three alike.

    python benchmarks/bench_overhead.py [--elements 4096] [--rounds 20000] [--repeats 5]
"""
import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["GOLDEN_TASKS_THREADS"] = "1"  # a trivial kernel: one thread on both sides, no pool wake-ups

import torch  # noqa: E402
from torch.utils.benchmark import Timer  # noqa: E402

import golden_tasks  # noqa: E402
from golden_tasks import In, Out, TensorSpec, jit  # noqa: E402


@jit(backend="eager")
def scale(x: In, out: Out):
    torch.mul(x, 2.0, out=out)


def golden_scale(t):
    t["out"].copy_(t["x"] * 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    specs = [TensorSpec("x", (args.elements,), torch.float32, torch.randn),
             TensorSpec("out", (args.elements,), torch.float32)]
    x, out = torch.randn(args.elements), torch.empty(args.elements)
    timer = Timer("fn(x, out)", globals={"fn": scale.fn, "x": x, "out": out}, num_threads=1)
    timers, fixed, adaptive = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        def bench(repeat, **rounds):
            # a cache per repeat: each measures again instead of reading the timing the last one kept
            result = golden_tasks.run(fn=scale, specs=specs, golden=golden_scale,
                                      cache_dir=Path(tmp) / f"cache{repeat}", runs_dir=Path(tmp) / "runs", **rounds)
            assert result.passed, result.error
            return result.bench.to_json()  # its figures by name, as Timer's are

        for repeat in range(args.repeats):
            measured = timer.blocked_autorange(min_run_time=2.0)
            timers.append({"median": measured.median * 1e6, "mean": measured.mean * 1e6})
            fixed.append(bench(repeat, rounds=args.rounds, warmup=100))
            adaptive.append(bench(repeat))
    print(f"trivial kernel: torch.mul of {args.elements} float32, {fixed[0]['threads']} thread(s), "
          f"median of {args.repeats} alternating repeats (us per call, and the ratio to Timer's)")
    # Timer's figures are of blocks of calls (a block's time / its calls); the bench's of single calls. A
    # single call's median leaves out the slow calls a block's average holds, so the means compare like
    # with like, and the medians are shown beside them.
    reference = {stat: statistics.median(t[stat] for t in timers) for stat in ("median", "mean")}
    print(f"{'measurement':44} {'median':>8} {'ratio':>6} {'mean':>8} {'ratio':>6}")
    rows = (("torch.utils.benchmark.Timer", timers), (f"bench, {args.rounds} fixed rounds", fixed),
            (f"bench, adaptive: {'/'.join(str(r['rounds']) for r in adaptive)} rounds", adaptive))
    for name, runs in rows:
        figures = {stat: statistics.median(r[stat] for r in runs) for stat in ("median", "mean")}
        print(f"{name:44} " + " ".join(f"{figures[s]:8.3f} {figures[s] / reference[s]:6.3f}" for s in figures))
    mean = statistics.median(r["mean"] for r in fixed)
    print(f"bench overhead per round (means, fixed rounds): {mean - reference['mean']:+.3f} us "
          f"({mean / reference['mean'] - 1:+.1%}; goal: within 10%)")


if __name__ == "__main__":
    main()
