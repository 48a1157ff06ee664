"""How far `golden-tasks compare` sees unchanged code move from run to run, measured on this machine.

Verifies the kernel library (kernels/) once in a temporary copy with its own cache, then re-measures
every timing `--runs` times (`doit verify fresh=1`: every verdict cached, every kernel timed again, one
at a time: benchmarks run side by side with -n measure each other) and compares every run with the
first, as a CI gate would compare a run with its baseline. Prints:

- per case, the largest move of its median over the runs (|B/A - 1|) and its rounds' own noise
  (Timing.median_rse), and the smallest change the default rule reports as SLOWER at that noise;
- the drift those moves imply (the root mean square of the log-ratios, over sqrt(2): one run's share),
  the value of `--drift` that would cover them;
- how many of the comparisons say SLOWER or FASTER with the default settings.

Goal (issue 29): no SLOWER or FASTER among re-measures of unchanged code, while a 1.3x slowdown of a
kernel timed to its rounds' usual noise is still reported.

    python benchmarks/compare_noise.py [--runs 10]
"""
import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from golden_tasks.model.records import RunRecord, Timing
from golden_tasks.model.verdicts import Speed
from golden_tasks.reports.runs_compare import DRIFT, judge

ROOT = Path(__file__).resolve().parents[1]


def doit(path: Path, *args) -> None:
    env = {**os.environ, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs"),
           "GOLDEN_TASKS_HTML": "0", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=path, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def timings(record: RunRecord) -> dict:
    return {row.case: row.kernel_timing for row in record.cases if row.kernel_timing}


def with_noise(median: float, rse: float, rounds: int = 100) -> Timing:
    """A timing of this median whose median has this relative standard error (Timing.median_rse)."""
    return Timing(median=median, rounds=rounds, iqr=rse * median * rounds ** 0.5 * 1.349 / (math.pi / 2) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="re-measures of the unchanged library (default 10)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "library"
        path.mkdir()
        shutil.copy(ROOT / "dodo.py", path)
        shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
        doit(path, "-n", "2", "verify")
        records = []
        for i in range(args.runs):
            doit(path, "verify", "fresh=1")
            records.append(RunRecord.read(path / "runs" / "report.json"))
            print(f"re-measure {i + 1} of {args.runs} done", file=sys.stderr)
    first, later = timings(records[0]), [timings(r) for r in records[1:]]
    logs, verdicts = [], {}
    print(f"{'case':<28} {'median us':>10} {'noise':>7} {'largest move':>13} {'SLOWER from':>12}")
    for case, base in first.items():
        moves = [t[case].median / base.median for t in later if case in t]
        logs += [math.log(m) for m in moves]
        for t in (t[case] for t in later if case in t):
            verdict = judge(base, t)
            verdicts.setdefault(verdict.verdict, []).append(case)
        noise = base.median_rse or 0.0
        reported = 3 * math.sqrt(2 * noise**2 + 2 * DRIFT**2)  # the rule's 3 standard errors at r = 1
        print(f"{case:<28} {base.median:>10.4g} {noise:>7.2%} {max(abs(m - 1) for m in moves):>13.2%} "
              f"{1 + reported:>11.3f}x")
    drift = math.sqrt(sum(x * x for x in logs) / len(logs)) / math.sqrt(2)
    print(f"\nruns: {args.runs}; comparisons with the first: {len(logs)}; drift of one run (rms log-ratio / sqrt 2): "
          f"{drift:.2%}; the default --drift: {DRIFT:.0%}")
    print("verdicts with the defaults: " + ", ".join(f"{v}: {len(c)}" for v, c in sorted(verdicts.items())))
    for verdict in (Speed.SLOWER, Speed.FASTER):
        if verdict in verdicts:
            print(f"{verdict}: {', '.join(sorted(set(verdicts[verdict])))}")
    slowed = judge(with_noise(100.0, 0.01), with_noise(130.0, 0.01)).verdict
    print(f"a 1.3x slowdown at 1% noise in each run: {slowed}")


if __name__ == "__main__":
    main()
