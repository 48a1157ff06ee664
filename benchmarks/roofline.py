"""The machine's limits as golden-tasks measures them (the calibrate stage), beside independent measures, in
one run; and every library case against them.

- The bandwidth at each working-set size and thread count, beside STREAM's Add in numpy (the triad's three
  arrays in one pass) at the same sizes and threads (the arrays split among that many threads: numpy lets go
  of the GIL in its loops): the calibrated triad within 15% of it.
- The matmul rate at each dtype, beside torch.utils.benchmark.Timer on the same matmul (its side, its
  threads): within 10%.
- How long the calibration takes cold, and that a second run reuses its entry (measures nothing).
- Every case of a run record (runs/report.json, or --record PATH: `doit verify` writes it) with its GB/s,
  TFLOP/s and fraction of the speed of light.

Run it on an idle machine: both sides measure the same hardware, one after the other.

    python benchmarks/roofline.py [--record runs/report.json]
"""
import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.utils.benchmark

from golden_tasks.model.machine import Limits, size_text
from golden_tasks.model.outputs import MachineMeta
from golden_tasks.model.plan import Plan
from golden_tasks.model.records import BadRecord, RunRecord
from golden_tasks.pipeline.execution import execute
from golden_tasks.pipeline.stage_table import BY_NAME, StageName
from golden_tasks.storage.store import Store

BANDWIDTH_WITHIN, MATMUL_WITHIN = 0.15, 0.10


def numpy_triad(size: int, threads: int, repeats: int = 20) -> float:
    """GB/s of a STREAM kernel in numpy over float32 arrays of `size` bytes in all, the best of `repeats` (as STREAM
    reports): its Add, a = b + c, which moves the triad's three arrays in one pass (numpy's a = b + 3 * c takes
    two). The arrays are split among `threads` threads where each gets at least torch's grain (32768 elements) of
    them, as torch splits its own loops."""
    n = size // 4 // 3
    a, b, c = np.ones(n, np.float32), np.ones(n, np.float32), np.ones(n, np.float32)
    parts = max(1, min(threads, n // 32768))
    chunks = [slice(i * n // parts, (i + 1) * n // parts) for i in range(parts)]

    def part(s: slice) -> None:
        np.add(b[s], c[s], out=a[s])

    best = float("inf")
    with ThreadPoolExecutor(parts) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            if parts == 1:
                part(chunks[0])
            else:
                list(pool.map(part, chunks))
            best = min(best, time.perf_counter() - start)
    return 3 * n * 4 / best / 1e9


def timer_rate(dtype: str, n: int, threads: int) -> float:
    """TFLOP/s of torch.mm at `dtype` on n x n, by torch.utils.benchmark.Timer (its median)."""
    x = torch.ones(n, n, dtype=getattr(torch, dtype))
    out = torch.empty_like(x)
    found = torch.utils.benchmark.Timer("torch.mm(x, x, out=out)", globals={"x": x, "out": out},
                                        num_threads=threads).blocked_autorange(min_run_time=0.3)
    return 2 * n ** 3 / found.median / 1e12


def verdict(ratio: float, within: float) -> str:
    return "ok" if abs(ratio - 1) <= within else f"OFF (beyond {within:.0%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, default=Path("runs/report.json"), help="a run record to place")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        store, plan, stage = Store(cache), Plan(case="machine"), BY_NAME[StageName.CALIBRATE]
        start = time.perf_counter()
        entry, ran = execute(stage, plan, store)
        cold = time.perf_counter() - start
        start = time.perf_counter()
        _, again = execute(stage, plan, store)
        warm = time.perf_counter() - start
        print(f"calibration: cold {cold:.1f} s (measured: {ran}); second run {warm * 1e3:.0f} ms "
              f"(measured again: {again})")
        by_threads = {found.threads: found for found in map(Limits.from_json, MachineMeta.of(entry).limits)
                      if found.device == "cpu"}
    worst = []
    print("\nbandwidth, GB/s: the calibrated triad and best beside numpy's STREAM Add (same size, threads)")
    print(f"{'threads':>7}  {'working set':>11}  {'triad':>7}  {'best':>7}  {'numpy':>7}  {'triad/numpy':>11}")
    for threads, found in sorted(by_threads.items()):
        for band in found.bandwidth:
            ours, theirs = band.gbps["triad"], numpy_triad(band.size, threads)
            worst.append(verdict(ours / theirs, BANDWIDTH_WITHIN))
            print(f"{threads:>7}  {size_text(band.size):>11}  {ours:7.1f}  {band.best:7.1f}  {theirs:7.1f}  "
                  f"{ours / theirs:11.2f}  {worst[-1]}")
    print("\nmatmul, TFLOP/s: the calibrated rate beside torch.utils.benchmark.Timer (same matmul, threads)")
    print(f"{'threads':>7}  {'dtype':>8}  {'n':>5}  {'ours':>8}  {'Timer':>8}  {'ours/Timer':>10}")
    for threads, found in sorted(by_threads.items()):
        for dtype, rate in found.tflops.items():
            theirs = timer_rate(dtype, found.matmul_n[dtype], threads)
            worst.append(verdict(rate / theirs, MATMUL_WITHIN))
            print(f"{threads:>7}  {dtype:>8}  {found.matmul_n[dtype]:>5}  {rate:8.4f}  {theirs:8.4f}  "
                  f"{rate / theirs:10.2f}  {worst[-1]}")
    off = [w for w in worst if w != "ok"]
    print(f"\n{len(worst) - len(off)} of {len(worst)} figures within their bounds")
    try:
        record = RunRecord.read(args.record) if args.record.name == "report.json" and args.record.exists() else None
    except BadRecord as exc:
        print(f"\n{exc}", file=sys.stderr)
        return 2
    if record is None:
        print(f"\nno run record at {args.record}: `doit verify` writes one, then run this again to place its cases")
        return 0
    print(f"\nthe cases of {args.record} against the machine they ran on:")
    print(f"{'case':<28} {'bytes':>10} {'FLOPs':>10} {'GB/s':>8} {'TFLOP/s':>9} {'SOL':>6}  {'bound':<7}  speedup")
    for row in record.cases:
        speed = row.speed
        if speed is None or speed.gbps is None:
            print(f"{row.case:<28} {'-':>10}  ({row.status}{': ' + row.skipped if row.skipped else ''})"[:110])
            continue
        flops = f"{speed.flops:.3g}" if speed.flops else "-"
        tflops = f"{speed.tflops:.3g}" if speed.tflops else "-"
        sol = f"{speed.sol:.2f}" if speed.sol is not None else "-"
        speedup = f"{row.speedup:.2f}x over {row.baseline}" if row.speedup is not None and row.baseline else "-"
        print(f"{row.case:<28} {speed.bytes:>10} {flops:>10} {speed.gbps:8.3g} {tflops:>9} {sol:>6}  "
              f"{speed.bound:<7}  {speedup}")
    print(f"\nmedian fraction of the speed of light: "
          f"{statistics.median(r.speed.sol for r in record.cases if r.speed and r.speed.sol) or 0:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
