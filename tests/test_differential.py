"""The cache never gives a verdict an empty cache would not: random seeded edits across every route
(tests/differential.py). A few edits per run here; benchmarks/differential.py runs many."""
import os
import random

import pytest
from differential import CASES, Differential, random_edits

pytestmark = pytest.mark.e2e
EDITS = int(os.environ.get("GT_DIFF_EDITS", "4"))


def test_cached_verdicts_equal_empty_cache_verdicts_and_reverts_are_cached(tmp_path):
    # A new seed on every run, so the sample cannot be tuned to; GT_DIFF_SEED replays one.
    seed = int(os.environ.get("GT_DIFF_SEED") or random.SystemRandom().randrange(2**31))
    diff = Differential(tmp_path)
    assert diff.base() == {case: "PASS" for case in CASES}
    problems = [p for edit in random_edits(seed, EDITS) for p in diff.check(edit)]
    assert not problems, f"GT_DIFF_SEED={seed}:\n" + "\n".join(problems)
