"""The differential cache check at scale: many random edits, each verified with the warm cache
and with an empty one (tests/differential.py); any disagreement is a wrong verdict from the cache.

    python benchmarks/differential.py [--seeds N] [--seed S] [--backend eager|aoti]

Each seed draws one edit of every site (in random order, with random alternatives), so one seed
covers every route; prints each disagreement, the counts, and the seconds per edit.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the harness lives beside the tests

from differential import SITES, Differential, random_edits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="how many seeds (each: one edit per site)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--backend", default="eager", choices=("eager", "aoti"))
    args = parser.parse_args()
    checked, problems, start = 0, [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="golden-differential-") as tmp:
        diff = Differential(Path(tmp), args.backend)
        base = diff.base()
        if set(base.values()) != {"PASS"}:
            sys.exit(f"the base project does not pass: {base}")
        for seed in range(args.seed, args.seed + args.seeds):
            for edit in random_edits(seed, len(SITES)):
                found = diff.check(edit)
                checked += 1
                problems += found
                print(f"seed {seed}  {'WRONG' if found else 'ok   '}  {edit}", flush=True)
    elapsed = time.perf_counter() - start
    print(f"\n{checked} edits, {len(problems)} wrong verdicts or uncached reverts, "
          f"{elapsed / max(checked, 1):.1f} s per edit (3 doit runs each, backend {args.backend})")
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
