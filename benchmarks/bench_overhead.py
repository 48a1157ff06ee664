"""The bench stage's overhead per round for a trivial kernel, against torch.utils.benchmark.Timer on the
same function, side by side in one run.

- Timer: `torch.utils.benchmark.Timer(...).blocked_autorange()` times blocks of many calls and divides,
  so its clock costs almost nothing per call: the function's own time, as close as Python measures it.
- bench: `golden_tasks.run` with a fixed number of rounds (the bench stage in its isolated child, each
  round timed on its own, its buffers refreshed before it outside its time), and with the default
  adaptive rounds. Its median round over Timer's median call is the ratio (goal: within 10%, 1.10x).

    python benchmarks/bench_overhead.py [--elements 4096] [--rounds 2000]
"""
import argparse
import os
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
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    specs = [TensorSpec("x", (args.elements,), torch.float32, torch.randn),
             TensorSpec("out", (args.elements,), torch.float32)]
    with tempfile.TemporaryDirectory() as tmp:
        def bench(**rounds):
            result = golden_tasks.run(fn=scale, specs=specs, golden=golden_scale, cache_dir=Path(tmp) / "cache",
                                      runs_dir=Path(tmp) / "runs", **rounds)
            assert result.passed, result.error
            return result.bench

        fixed = bench(rounds=args.rounds, warmup=100)
        adaptive = bench()
    x, out = torch.randn(args.elements), torch.empty(args.elements)
    timer = Timer("fn(x, out)", globals={"fn": scale.fn, "x": x, "out": out}, num_threads=1)
    reference = timer.blocked_autorange(min_run_time=2.0).median * 1e6
    print(f"trivial kernel: torch.mul of {args.elements} float32, {fixed['threads']} thread(s)")
    print(f"{'measurement':40} {'us/call':>9} {'ratio':>7}")
    print(f"{'torch.utils.benchmark.Timer (median)':40} {reference:9.3f} {1:7.3f}")
    for name, stats in ((f"bench, {fixed['rounds']} fixed rounds (median)", fixed),
                        (f"bench, adaptive: {adaptive['rounds']} rounds, {adaptive['stopped']} (median)", adaptive)):
        print(f"{name:40} {stats['median']:9.3f} {stats['median'] / reference:7.3f}")
    print(f"bench overhead per round: {fixed['median'] - reference:+.3f} us "
          f"({fixed['median'] / reference - 1:+.1%}; goal: within 10%)")


if __name__ == "__main__":
    main()
