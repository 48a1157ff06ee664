import cloudpickle
import numpy as np
import pytest
import torch

from golden_tasks.model.compare import (
    Allclose,
    Comparison,
    Policy,
    Sides,
    allclose,
    error_distribution,
    error_map,
    ratio_allclose,
    ratio_reldiff,
    topk_pair_compare,
)
from golden_tasks.project.fingerprint import fingerprint

POLICY = Policy(rtol=1e-3, atol=1e-5)
NAN, INF = float("nan"), float("inf")


def judge(comparator, a, e, policy=POLICY, name="o", **others):
    """The comparator's verdict on output `name`; `others` maps further outputs to (actual, expected)."""
    sides = Sides({name: a, **{k: v[0] for k, v in others.items()}}, {name: e, **{k: v[1] for k, v in others.items()}})
    return comparator(name, a, e, policy, sides)


# allclose

def test_pass_reports_figures():
    e = torch.linspace(1, 2, 10)
    r = judge(allclose, e * (1 + 1e-4), e)
    assert r.passed and r.mismatches == 0 and r.total == 10 and 0 < r.max_rel <= 1.01e-4


def test_mismatch_report_names_output_count_worst_and_first():
    e = torch.zeros(4, 5)
    a = e.clone()
    a[1, 2], a[3, 4] = 0.5, 2.0
    r = judge(allclose, a, e, name="out")
    assert not r.passed and r.mismatches == 2
    lines = r.message.splitlines()
    assert lines[0] == "output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)"
    assert lines[1].startswith("  worst at (3, 4): actual 2, expected 0, abs err 2")
    assert "(1, 2): actual 0.5, expected 0" in r.message


def test_nan_fails_unless_ignored_where_golden_is_nan():
    e = torch.tensor([1.0, NAN, 3.0])
    assert not judge(allclose, torch.tensor([1.0, 5.0, 3.0]), e).passed
    assert judge(allclose, torch.tensor([1.0, 5.0, 3.0]), e, Policy(1e-3, 1e-5, ignore_nan=True)).passed
    # a NaN in the kernel's output where the golden is defined always fails
    r = judge(allclose, torch.tensor([NAN, 0.0, 3.0]), e, Policy(1e-3, 1e-5, ignore_nan=True))
    assert not r.passed and "worst at (0,)" in r.message
    all_nan = torch.full((3,), NAN)
    assert "NaN everywhere" in judge(allclose, e, all_nan, Policy(1e-3, 1e-5, ignore_nan=True)).message


def test_infinities_match_only_themselves():
    e = torch.tensor([INF, 1.0])
    assert judge(allclose, e.clone(), e).passed
    assert not judge(allclose, torch.tensor([-INF, 1.0]), e).passed


def test_per_comparator_tolerances_override_the_policy():
    e = torch.ones(3)
    assert not judge(allclose, e * 1.01, e).passed
    assert judge(Allclose(rtol=2e-2), e * 1.01, e).passed


def test_shape_mismatch():
    assert "shape (2,) != golden shape (3,)" in judge(allclose, torch.ones(2), torch.ones(3)).message


def test_bf16_outputs_are_compared_in_double():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert judge(allclose, e.clone(), e).passed



# integer and bool outputs

BIG = 2**53  # float64 cannot tell BIG from BIG + 1
I64_MAX, I64_MIN = torch.iinfo(torch.int64).max, torch.iinfo(torch.int64).min


def ints(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_an_index_off_by_one_fails_at_the_default_rtol(dtype):
    r = judge(allclose, ints(7, 100001, dtype=dtype), ints(7, 100000, dtype=dtype), Policy(rtol=1e-5, atol=1e-8))
    assert not r.passed and r.message.splitlines()[:2] == [
        "output 'o': 1/2 elements mismatched (rtol=0, atol=0)",
        "  worst at (1,): actual 100001, expected 100000, abs err 1, rel err 1e-05"]
    assert not judge(allclose, ints(127, dtype=torch.int8), ints(126, dtype=torch.int8), Policy(1e-2, 0.5)).passed


@pytest.mark.parametrize("comparator, policy", [(allclose, Policy(1e-3, 1e-5)), (allclose, Policy(0, 0)),
                                                (Allclose(rtol=0, atol=0), POLICY)])
def test_int64_past_2_53_differing_by_one_fails(comparator, policy):
    r = judge(comparator, ints(BIG + 1), ints(BIG), policy)
    assert not r.passed and "(0,): actual 9007199254740993, expected 9007199254740992, abs err 1, rel err 1.11e-16" \
        in r.message
    assert (r.max_abs, r.mismatches) == (1.0, 1)
    assert judge(comparator, ints(BIG + 1), ints(BIG + 1), policy).passed


def test_bool_outputs_compare_exactly():
    e = torch.tensor([True, False, True])
    assert judge(allclose, e.clone(), e, Policy(rtol=1.0, atol=1.0)).passed
    r = judge(allclose, torch.tensor([True, True, True]), e, Policy(rtol=1.0, atol=1.0))
    assert not r.passed and "worst at (1,): actual 1, expected 0, abs err 1" in r.message


def test_an_explicit_integer_tolerance_applies_exactly():
    one = Allclose(atol=1)
    assert judge(one, ints(2**60 + 1, I64_MAX, I64_MIN + 1, -5), ints(2**60, I64_MAX - 1, I64_MIN, -4)).passed
    r = judge(one, ints(2**60 + 2, I64_MAX, I64_MIN), ints(2**60, I64_MAX - 2, I64_MAX))  # float64: 2**60 + 2 == 2**60
    assert not r.passed and r.mismatches == 3
    # a - e of MIN and MAX overflows int64: the difference saturates instead, and ranks worst
    assert r.message.splitlines()[1] == (f"  worst at (2,): actual {I64_MIN}, expected {I64_MAX}, abs err {2**64 - 1}, "
                                         "rel err 2")
    assert f"(1,): actual {I64_MAX}, expected {I64_MAX - 2}, abs err 2, rel err 2.17e-19" in r.message
    assert judge(Allclose(rtol=0.1), ints(110, -90), ints(100, -100)).passed  # floor(0 + 0.1 * |e|)
    assert not judge(Allclose(rtol=0.1), ints(111), ints(100)).passed
    huge = Allclose(atol=2**70)  # an integer bound is capped at 2**62: a larger difference always fails
    assert judge(huge, ints(2**62, -2**62), ints(0, 0)).passed
    assert not judge(huge, ints(2**62 + 1), ints(0)).passed and not judge(huge, ints(I64_MIN), ints(I64_MAX)).passed


def test_ratio_allclose_counts_integer_mismatches_exactly():
    e = torch.full((1000,), BIG)
    a = e.clone()
    a[3] += 1
    r = judge(ratio_allclose(), a, e)  # one bad point in 1000: within the default 0.5%
    assert r.passed and r.stats["bad"] == 1 and r.stats["max_abs"] == 1.0
    r = judge(ratio_allclose(max_error_ratio=0.0), a, e)
    assert not r.passed and "worst at (3,): actual 9007199254740993, expected 9007199254740992" in r.message
    assert judge(ratio_allclose(max_error_ratio=0.0, atol=1), a, e).passed
    r = judge(ratio_allclose(valid_rows=1, zero_tail=True), ints(BIG, BIG + 1), ints(BIG, 0))
    assert not r.passed and r.message.endswith("first at (1,): 9007199254740993")


def test_ratio_reldiff_takes_the_exact_integer_difference():
    strict = ratio_reldiff(diff_thd=0.0, pct_thd=0.0, max_diff_hd=0.0)
    r = judge(strict, ints(BIG + 1), ints(BIG))
    assert not r.passed and r.stats["max_reldiff"] == pytest.approx(2**-53)
    assert "at (0,): actual 9007199254740993, expected 9007199254740992, abs err 1" in r.message
    assert judge(strict, ints(BIG + 1), ints(BIG + 1)).passed
    r = judge(ratio_reldiff(), ints(I64_MIN), ints(I64_MAX))  # the difference saturates at 2**63 - 1, no overflow
    assert not r.passed and r.stats["max_reldiff"] == 1.0


def test_error_distribution_takes_the_exact_integer_difference():
    r = judge(error_distribution(percentiles=(100,)), ints(BIG + 1, 3), ints(BIG, 3))
    assert r.passed and r.stats["abs_err_p100"] == 1.0 and r.stats["rel_l2"] == pytest.approx(2**-53)
    assert (r.max_abs, r.stats["finite"]) == (1.0, 2)
    r = judge(error_distribution(judge=allclose), ints(BIG + 1, 3), ints(BIG, 3))
    assert not r.passed and r.message.startswith("output 'o': 1/2 elements mismatched (rtol=0, atol=0)")


def test_topk_integer_values_tie_only_exactly_and_indices_print_exactly():
    e_idx, e_vals = ints(0, 1), ints(BIG + 1, BIG)
    # index 2 is not in the golden's row: a tie only if its value equals the boundary value BIG
    assert not judge(topk_pair_compare("scores"), ints(0, 2), e_idx, name="idx",
                     scores=(ints(BIG + 1, BIG + 1), e_vals)).passed
    assert judge(topk_pair_compare("scores", atol=1), ints(0, 2), e_idx, name="idx",
                 scores=(ints(BIG + 1, BIG + 1), e_vals)).passed
    assert judge(topk_pair_compare("scores"), ints(0, 2), e_idx, name="idx", scores=(e_vals, e_vals)).passed
    big = ints(BIG, BIG + 1)
    r = judge(topk_pair_compare("scores"), big.flip(0), big, name="idx", scores=(VALS[0, :2], VALS[0, :2]))
    assert not r.passed and r.message.splitlines()[1] == (
        "    (0,): actual index 9007199254740993, expected index 9007199254740992, actual value 5, expected value 5")


@pytest.mark.parametrize("comparator", [allclose, ratio_allclose(), ratio_reldiff(), error_distribution(),
                                        error_distribution(judge=allclose)])
@pytest.mark.parametrize("actual, expected, text", [
    (ints(1, dtype=torch.int32), ints(1), "dtype torch.int32 != golden dtype torch.int64"),
    (torch.ones(1), ints(1), "dtype torch.float32 != golden dtype torch.int64"),
    (ints(1, dtype=torch.uint64), ints(1, dtype=torch.uint64),
     "dtype torch.uint64 is not supported by the comparators"),
    (torch.ones(1, dtype=torch.complex64), torch.ones(1, dtype=torch.complex64),
     "dtype torch.complex64 is not supported by the comparators"),
])
def test_a_dtype_mismatch_or_unsupported_dtype_fails_by_name(comparator, actual, expected, text):
    r = judge(comparator, actual, expected)
    assert not r.passed and r.message == f"output 'o': {text}"


def test_topk_dtype_mismatch_fails_for_indices_or_values():
    r = judge(topk_pair_compare("scores"), IDX.int(), IDX, name="idx", scores=(VALS, VALS))
    assert not r.passed and r.message == "output 'idx': dtype torch.int32 != golden dtype torch.int64"
    r = judge(topk_pair_compare("scores"), IDX, IDX, name="idx", scores=(VALS.double(), VALS))
    assert not r.passed and r.message == "output 'scores': dtype torch.float64 != golden dtype torch.float32"

# the protocol

def test_policy_check_hands_every_comparator_all_outputs():
    seen = []

    def spy(name, actual, expected, policy, outputs):
        seen.append((name, sorted(outputs.actual), sorted(outputs.expected), policy.rtol))
        return Comparison(name, True, "ok", stats={"n": 1})

    actual, expected = {"a": torch.ones(2), "b": torch.zeros(2)}, {"a": torch.ones(2), "b": torch.zeros(2)}
    results = Policy(1e-3, 0.0, compare={"b": spy}).check(actual, expected)
    assert [r.passed for r in results] == [True, True]
    assert seen == [("b", ["a", "b"], ["a", "b"], 1e-3)]
    assert results[1].to_json()["stats"] == {"n": 1} and results[0].to_json()["stats"] == {}


def test_a_comparator_class_left_uncalled_fails_by_name():
    [r] = Policy(1e-3, 0.0, compare={"o": ratio_allclose}).check({"o": torch.ones(2)}, {"o": torch.ones(2)})
    assert not r.passed and "the class RatioAllclose, not a comparator; call it" in r.message


def test_comparators_pickle_and_fingerprint_by_their_fields():
    made = [ratio_allclose(valid_rows=3, zero_tail=True), ratio_reldiff(pct_thd=0.01), topk_pair_compare("v"),
            error_distribution(judge=ratio_allclose(max_error_ratio=0.01))]
    for comparator in made:
        assert cloudpickle.loads(cloudpickle.dumps(comparator)) == comparator
    assert fingerprint(ratio_allclose(valid_rows=3)) == fingerprint(ratio_allclose(valid_rows=3))
    assert fingerprint(ratio_allclose(valid_rows=3)) != fingerprint(ratio_allclose(valid_rows=4))
    assert (fingerprint(error_distribution(judge=ratio_allclose(atol=1.0)))
            != fingerprint(error_distribution(judge=ratio_allclose(atol=2.0))))


# ratio_allclose

def with_bad(n, shape=(64, 64)):
    """(actual, expected): ones, with the first n elements of the actual off by one."""
    e = torch.ones(shape)
    a = e.clone()
    a.view(-1)[:n] += 1
    return a, e


def test_ratio_allclose_fails_above_and_passes_within_the_ratio():
    tol = {"atol": 1e-4, "rtol": 2**-7}
    r = judge(ratio_allclose(**tol), *with_bad(37))
    lines = r.message.splitlines()
    assert not r.passed and lines[0] == ("output 'o': 37/4096 elements (0.903%) outside atol=0.0001 rtol=0.0078125, "
                                         "above max_error_ratio 0.5%")
    assert lines[1].startswith("  worst at (0, 0): actual 2, expected 1") and lines[2] == "  first mismatches:"
    assert len(lines) == 3 + 5 and lines[-1].startswith("    (0, 4): actual 2")
    r = judge(ratio_allclose(**tol), *with_bad(12))
    assert r.passed and r.message == ("output 'o': 12/4096 elements (0.293%) outside atol=0.0001 rtol=0.0078125, "
                                      "within max_error_ratio 0.5%")
    assert r.stats == {"error_ratio": 12 / 4096, "bad": 12, "considered": 4096, "max_abs": 1.0, "max_rel": 1.0}
    assert (r.mismatches, r.total) == (12, 4096)


def test_ratio_allclose_takes_unset_tolerances_from_the_policy():
    r = judge(ratio_allclose(max_error_ratio=0.25), *with_bad(1, (4,)))
    assert r.passed and "outside atol=1e-05 rtol=0.001, within max_error_ratio 25%" in r.message


def test_ratio_allclose_compares_only_the_leading_rows():
    e = torch.ones(4, 6)
    a = e.clone()
    a[2:] = 9  # rows past valid_rows are the kernel's scratch
    assert not judge(ratio_allclose(), a, e).passed
    r = judge(ratio_allclose(valid_rows=2), a, e)
    assert r.passed and r.message.startswith("output 'o': 0/12 elements (0.000%)")
    a = e.clone()
    a[:, 3:] = 9
    assert judge(ratio_allclose(valid_rows=3, valid_axis=1), a, e).passed
    r = judge(ratio_allclose(valid_rows=4, valid_axis=-1), a, e)
    assert not r.passed and r.stats["bad"] == 4 and "  worst at (0, 3): actual 9" in r.message


def test_ratio_allclose_zero_tail_names_count_and_full_coordinates():
    e = torch.ones(4, 6)
    a = e.clone()
    a[2:] = 0
    assert judge(ratio_allclose(valid_rows=2, zero_tail=True), a, e).passed
    a[3, 4], a[3, 5] = 0.5, NAN
    r = judge(ratio_allclose(valid_rows=2, zero_tail=True), a, e)
    assert not r.passed and r.message.splitlines() == [
        "output 'o': 0/12 elements (0.000%) outside atol=1e-05 rtol=0.001, within max_error_ratio 0.5%",
        "  2/12 elements of the tail (index >= 2 along axis 0) are not 0, first at (3, 4): 0.5"]
    assert judge(ratio_allclose(valid_rows=2), a, e).passed  # the tail is checked only when asked


def test_ratio_allclose_zero_valid_rows_compares_nothing():
    a, e = torch.full((3, 2), 7.0), torch.ones(3, 2)
    r = judge(ratio_allclose(valid_rows=0), a, e)
    assert r.passed and r.message == "output 'o': 0 rows compared (valid_rows=0 along axis 0)"
    assert r.stats["considered"] == 0
    r = judge(ratio_allclose(valid_rows=0, zero_tail=True), a, e)
    assert not r.passed and "6/6 elements of the tail (index >= 0 along axis 0) are not 0, first at (0, 0)" in r.message
    assert judge(ratio_allclose(valid_rows=0, zero_tail=True), torch.zeros(3, 2), e).passed


@pytest.mark.parametrize("settings, text", [
    ({"valid_rows": 5}, "output 'o': valid_rows=5 outside 0..4 (axis 0 of shape (4, 6))"),
    ({"valid_rows": -1}, "output 'o': valid_rows=-1 outside 0..4 (axis 0 of shape (4, 6))"),
    ({"valid_rows": 7, "valid_axis": -1}, "output 'o': valid_rows=7 outside 0..6 (axis 1 of shape (4, 6))"),
    ({"valid_rows": 1, "valid_axis": 2}, "output 'o': valid_axis=2 is not an axis of shape (4, 6)"),
])
def test_ratio_allclose_rejects_rows_or_axis_out_of_range(settings, text):
    r = judge(ratio_allclose(**settings), torch.ones(4, 6), torch.ones(4, 6))
    assert not r.passed and r.message == text


def test_ratio_allclose_nan_or_inf_fails_whatever_the_ratio():
    e = torch.ones(4, 5)
    a = e.clone()
    a[1, 2], a[3, 0] = NAN, INF
    r = judge(ratio_allclose(max_error_ratio=1.0), a, e)
    assert not r.passed and r.message.splitlines()[1] == "  hard failure: 2 NaN/Inf in the actual, first at (1, 2), (3, 0)"
    golden = e.clone()
    golden[0, 1] = INF
    r = judge(ratio_allclose(max_error_ratio=1.0), golden.clone(), golden)  # even the same infinity
    assert not r.passed and "  hard failure: 1 NaN/Inf in the golden, first at (0, 1)" in r.message
    a = e.clone()
    a[3] = NAN
    assert judge(ratio_allclose(valid_rows=3), a, e).passed  # outside the compared rows


def test_ratio_allclose_ignore_nan_drops_golden_nan_and_fails_on_all_nan():
    e = torch.tensor([1.0, NAN, 3.0, NAN])
    a = torch.tensor([1.0, 5.0, 3.0, NAN])
    assert "NaN/Inf in the golden, first at (1,), (3,)" in judge(ratio_allclose(), a, e).message
    r = judge(ratio_allclose(ignore_nan=True), a, e)
    assert r.passed and r.stats["considered"] == 2
    assert judge(ratio_allclose(), a, e, Policy(1e-3, 1e-5, ignore_nan=True)).passed
    r = judge(ratio_allclose(ignore_nan=True, valid_rows=2), a, torch.tensor([NAN, NAN, 3.0, 4.0]))
    assert not r.passed and r.message == "output 'o': golden is NaN everywhere; nothing to compare"
    r = judge(ratio_allclose(ignore_nan=True, valid_rows=2, zero_tail=True), a, torch.tensor([NAN, NAN, 3.0, 4.0]))
    assert not r.passed and r.total == 2 and r.message.splitlines() == [  # the tail is still checked
        "output 'o': golden is NaN everywhere; nothing to compare",
        "  2/2 elements of the tail (index >= 2 along axis 0) are not 0, first at (2,): 3"]


def test_ratio_allclose_shape_mismatch():
    r = judge(ratio_allclose(), torch.ones(2, 3), torch.ones(3, 2))
    assert not r.passed and r.message == "output 'o': shape (2, 3) != golden shape (3, 2)"


# ratio_reldiff

def test_reldiff_floor_keeps_tiny_goldens_from_blowing_up():
    e = torch.full((10,), 1e-6, dtype=torch.float64)
    r = judge(ratio_reldiff(), e * 2, e)  # rd = 1e-6 / 1e-3
    assert r.passed and r.stats == {"pct_over": 0.0, "max_reldiff": pytest.approx(1e-3)}
    assert not judge(ratio_reldiff(floor=1e-7), e * 2, e).passed


def test_reldiff_fails_when_too_many_points_are_over():
    e = torch.ones(1000, dtype=torch.float64)
    a = e.clone()
    a[:5] = 1.01
    r = judge(ratio_reldiff(), a, e)
    assert r.passed and r.message == ("output 'o': 5/1000 elements (0.500%) with relative difference above 0.005 "
                                      "(floor 0.001), within pct_thd 0.5%")
    a[5] = 1.01
    r = judge(ratio_reldiff(), a, e)
    lines = r.message.splitlines()
    assert not r.passed and lines[0] == ("output 'o': 6/1000 elements (0.600%) with relative difference above "
                                         "0.005 (floor 0.001), above pct_thd 0.5%")
    assert lines[1].startswith("  worst at (") and lines[2] == "  first mismatches:" and len(lines) == 8
    assert (r.mismatches, r.total) == (6, 1000) and r.stats["pct_over"] == 0.006


def test_reldiff_hard_cap_fails_a_single_point():
    e = torch.ones(1000, dtype=torch.float64)
    a = e.clone()
    a[7] = 1.2
    r = judge(ratio_reldiff(), a, e)
    assert not r.passed and r.message.splitlines()[1] == (
        "  hard failure: relative difference 0.2 above max_diff_hd 0.1 at (7,): actual 1.2, expected 1, "
        "abs err 0.2, rel err 0.2")
    assert r.stats["max_reldiff"] == pytest.approx(0.2)
    assert judge(ratio_reldiff(max_diff_hd=0.3), a, e).passed


def test_reldiff_nan_in_actual_fails_and_ignore_nan_drops_golden_nan():
    e = torch.tensor([1.0, 2.0, NAN])
    r = judge(ratio_reldiff(pct_thd=1.0), torch.tensor([NAN, 2.0, 0.0]), e, Policy(0, 0, ignore_nan=True))
    assert not r.passed and "  hard failure: 1 NaN/Inf in the actual, first at (0,)" in r.message
    assert "golden" not in r.message
    assert judge(ratio_reldiff(), torch.tensor([1.0, 2.0, 5.0]), e, Policy(0, 0, ignore_nan=True)).passed
    assert "1 NaN/Inf in the golden, first at (2,)" in judge(ratio_reldiff(), torch.tensor([1.0, 2.0, 5.0]), e).message


# topk_pair_compare

IDX = torch.tensor([[0, 1, 2], [3, 4, -1]])
VALS = torch.tensor([[5.0, 4.0, 4.0], [2.0, 1.0, 0.0]])


TOPK = topk_pair_compare("scores")


def topk(a_idx, a_vals=VALS, comparator=TOPK):
    return judge(comparator, a_idx, IDX, name="idx", scores=(a_vals, VALS))


def test_topk_accepts_ties_and_counts_them():
    r = topk(torch.tensor([[0, 2, 1], [3, 4, -1]]))
    assert r.passed and r.message == ("output 'idx': 6 selections match the golden, 2 of them as ties in 'scores' "
                                      "(rtol=0, atol=0)")
    assert r.stats == {"ties": 2, "differ": 0}


def test_topk_rejects_differences_that_are_not_ties():
    a_vals = VALS.clone()
    a_vals[0, 2] = 3.5
    r = topk(torch.tensor([[0, 1, 7], [3, 4, -1]]), a_vals)
    assert not r.passed and r.stats == {"ties": 0, "differ": 1} and r.message.splitlines() == [
        "output 'idx': 1/6 selections differ from the golden and are not ties in 'scores' (rtol=0, atol=0)",
        "    (0, 2): actual index 7, expected index 2, actual value 3.5, expected value 4"]
    assert topk(torch.tensor([[0, 1, 7], [3, 4, -1]]), a_vals, topk_pair_compare("scores", rtol=0.2)).passed


def test_topk_values_alone_do_not_excuse_wrong_indices():
    # the golden's values with other indices: 9 is no tie at the boundary (4), 0 and 1 are not tied (5 vs 4)
    r = topk(torch.tensor([[9, 1, 2], [3, 4, -1]]))
    assert not r.passed and r.stats == {"ties": 0, "differ": 1}
    assert not topk(torch.tensor([[1, 0, 2], [3, 4, -1]])).passed
    assert topk(torch.tensor([[0, 1, 8], [3, 4, -1]])).passed  # 8 ties with the boundary value 4


def test_topk_padding_on_one_side_is_never_a_tie():
    r = topk(torch.tensor([[0, 1, 2], [3, 4, 5]]))  # the values match (0 == 0) but the golden padded
    assert not r.passed and r.message.endswith("(1, 2): actual index 5, expected index -1, actual value 0, "
                                               "expected value 0 (padding on one side only)")
    assert not topk(torch.tensor([[0, 1, -1], [3, 4, -1]])).passed


def test_topk_duplicate_index_in_a_row_fails():
    r = topk(torch.tensor([[0, 1, 1], [3, 4, -1]]))  # (0, 2) would be a tie in value
    assert not r.passed and r.message.splitlines() == [
        "output 'idx': 0/6 selections differ from the golden and are not ties in 'scores' (rtol=0, atol=0)",
        "  hard failure: 1 rows of the actual hold an index twice, first row (0,) (index 1)"]
    padded = torch.tensor([[0, -1, -1], [3, -1, -1]])  # repeated padding is not a duplicate
    assert judge(topk_pair_compare("scores"), padded, padded, name="idx", scores=(VALS, VALS)).passed


def test_topk_missing_values_or_shapes_differing_fail():
    r = judge(topk_pair_compare("scores"), IDX, IDX, name="idx")
    assert not r.passed and r.message == ("output 'idx': value output 'scores' is missing "
                                          "(actual outputs: idx; golden outputs: idx)")
    r = topk(IDX, VALS[:, :2])
    assert not r.passed and "actual (2, 3), golden (2, 3), 'scores' actual (2, 2), golden (2, 3)" in r.message


# error_distribution

def test_error_distribution_figures_on_a_known_example():
    e = torch.linspace(1, 2, 101, dtype=torch.float64)
    r = judge(error_distribution(thresholds=(1e-3, 2e-2), percentiles=(0, 50, 100)), e * (1 + 1e-2), e)
    assert r.passed and r.message.startswith("measured only (no verdict): output 'o': rel-L2 0.01, cosine 1.000000; "
                                             "rel err > 0.001: 100%, > 0.02: 0%; abs err p0 0.01 p50 0.015 p100 0.02")
    s = r.stats
    assert s["rel_l2"] == pytest.approx(1e-2) and s["cosine"] == pytest.approx(1.0)
    assert (s["rel_err_over_0.001"], s["rel_err_over_0.02"], s["finite"], s["excluded"]) == (1.0, 0.0, 101, 0)
    assert [s["abs_err_p0"], s["abs_err_p50"], s["abs_err_p100"]] == pytest.approx([0.01, 0.015, 0.02])


def test_error_distribution_percentiles_interpolate_like_numpy():
    e = torch.ones(7, dtype=torch.float64)
    err = torch.tensor([0.3, 0.0, 0.1, 0.6, 0.2, 0.5, 0.4], dtype=torch.float64)
    r = judge(error_distribution(), e + err, e)
    got = [r.stats[f"abs_err_p{p:g}"] for p in (50, 90, 99, 99.9)]
    assert got == pytest.approx(np.percentile(err.numpy(), [50, 90, 99, 99.9]))
    assert r.stats["cosine"] < 1


def test_error_distribution_counts_nan_unless_ignored():
    e, a = torch.tensor([1.0, NAN, 2.0]), torch.tensor([1.0, 0.0, 2.0])
    assert judge(error_distribution(), a, e).stats["excluded"] == 1
    r = judge(error_distribution(), a, e, Policy(0, 0, ignore_nan=True))
    assert r.stats["excluded"] == 0 and r.stats["finite"] == 2 and r.stats["rel_l2"] == 0


def test_error_distribution_with_a_judge_takes_its_verdict():
    e = torch.linspace(1, 2, 100)
    r = judge(error_distribution(judge=allclose), e * (1 + 1e-2), e)
    assert not r.passed and r.message.startswith("output 'o': 100/100 elements mismatched")
    assert "\n  distribution: rel-L2 0.01, cosine 1.000000;" in r.message
    r = judge(error_distribution(judge=ratio_allclose(rtol=2e-2)), e * (1 + 1e-2), e)
    assert r.passed and r.stats["error_ratio"] == 0 and r.stats["rel_l2"] == pytest.approx(1e-2, rel=1e-5)


def test_error_distribution_rejects_percentiles_out_of_range():
    with pytest.raises(ValueError, match="percentiles must lie in 0..100"):
        error_distribution(percentiles=(50, 101))


# error_map: the per-element gap and bound behind a verdict, for the HTML report's plots

def _mismatching(gap, bound):
    return ~(gap <= bound)


@pytest.mark.parametrize("comparator", [allclose, ratio_allclose(max_error_ratio=0.0),
                                        ratio_reldiff(pct_thd=0.0, max_diff_hd=1e9),
                                        error_distribution(judge=ratio_allclose(max_error_ratio=0.0))])
def test_error_map_marks_exactly_the_points_its_comparator_counts(comparator):
    torch.manual_seed(0)
    e = torch.randn(6, 10, dtype=torch.float64)
    a = e + 1e-7 * torch.randn_like(e)
    a[5, 7:] += 0.5  # a tail-tile bug
    a[0, 0] = NAN
    gap, bound = error_map(Policy(1e-3, 1e-5, compare={"o": comparator}), "o", a, e)
    assert gap.shape == bound.shape == e.shape and gap.dtype == bound.dtype == torch.float64
    bad = _mismatching(gap, bound)
    assert bad.nonzero().tolist() == [[0, 0], [5, 7], [5, 8], [5, 9]]
    assert int(bad.sum()) == judge(comparator, a, e, Policy(1e-3, 1e-5)).mismatches
    assert gap[5, 8] == pytest.approx(0.5, rel=1e-5)


def test_error_map_takes_the_comparators_own_settings_and_leaves_unjudged_points_unbounded():
    e = torch.ones(4, 3)
    a = e + 0.01
    a[3] = 9  # past valid_rows: the kernel's scratch
    e[0, 0] = NAN
    policy = Policy(0.0, 0.0, compare={"o": ratio_allclose(atol=0.02, valid_rows=3, ignore_nan=True)})
    gap, bound = error_map(policy, "o", a, e)
    assert not _mismatching(gap, bound).any()
    assert torch.isinf(bound[3]).all() and torch.isinf(bound[0, 0]) and bound[1, 1] == pytest.approx(0.02)
    assert gap[3].eq(0).all() and gap[0, 0] == 0 and gap[1, 1] == pytest.approx(0.01)
    gap, bound = error_map(Policy(0.0, 0.0), "o", a, e)  # allclose with the policy's exact tolerance
    assert bool(_mismatching(gap, bound).all())


def test_error_map_integers_are_exact_and_infinities_match_only_themselves():
    gap, bound = error_map(POLICY, "i", torch.tensor([2**53 + 1, 5]), torch.tensor([2**53, 5]))
    assert _mismatching(gap, bound).tolist() == [True, False]  # an integer output takes no tolerance
    gap, bound = error_map(POLICY, "o", torch.tensor([INF, 1.0, -INF]), torch.tensor([INF, INF, INF]))
    assert _mismatching(gap, bound).tolist() == [False, True, True]


@pytest.mark.parametrize("comparator, text", [
    (topk_pair_compare("v"), "output 'o': its comparator TopkPairCompare has no tolerance per element"),
    (error_distribution(), "output 'o': its comparator ErrorDistribution has no tolerance per element"),
    (ratio_allclose, "output 'o': its comparator RatioAllclose has no tolerance per element"),
    (lambda *args: None, "output 'o': its comparator function has no tolerance per element"),
])
def test_error_map_names_a_comparator_without_an_elementwise_bound(comparator, text):
    with pytest.raises(ValueError) as raised:
        error_map(Policy(1e-3, 1e-5, compare={"o": comparator}), "o", torch.ones(2), torch.ones(2))
    assert str(raised.value) == text


def test_error_map_refuses_a_pair_that_cannot_be_compared():
    with pytest.raises(ValueError, match=r"output 'o': shape \(3,\) != golden shape \(2,\)"):
        error_map(POLICY, "o", torch.ones(3), torch.ones(2))
