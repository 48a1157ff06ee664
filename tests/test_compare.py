import torch

from golden_tasks.compare import Allclose, Policy, allclose

POLICY = Policy(rtol=1e-3, atol=1e-5)


def test_pass_reports_figures():
    e = torch.linspace(1, 2, 10)
    r = allclose("out", e * (1 + 1e-4), e, POLICY)
    assert r.passed and r.mismatches == 0 and r.total == 10 and 0 < r.max_rel <= 1.01e-4


def test_mismatch_report_names_output_count_worst_and_first():
    e = torch.zeros(4, 5)
    a = e.clone()
    a[1, 2], a[3, 4] = 0.5, 2.0
    r = allclose("out", a, e, POLICY)
    assert not r.passed and r.mismatches == 2
    lines = r.message.splitlines()
    assert lines[0] == "output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)"
    assert lines[1].startswith("  worst at (3, 4): actual 2, expected 0, abs err 2")
    assert "(1, 2): actual 0.5, expected 0" in r.message


def test_nan_fails_unless_ignored_where_golden_is_nan():
    e = torch.tensor([1.0, float("nan"), 3.0])
    assert not allclose("o", torch.tensor([1.0, 5.0, 3.0]), e, POLICY).passed
    assert allclose("o", torch.tensor([1.0, 5.0, 3.0]), e, Policy(1e-3, 1e-5, ignore_nan=True)).passed
    # a NaN in the kernel's output where the golden is defined always fails
    r = allclose("o", torch.tensor([float("nan"), 0.0, 3.0]), e, Policy(1e-3, 1e-5, ignore_nan=True))
    assert not r.passed and "worst at (0,)" in r.message
    all_nan = torch.full((3,), float("nan"))
    assert "NaN everywhere" in allclose("o", e, all_nan, Policy(1e-3, 1e-5, ignore_nan=True)).message


def test_infinities_match_only_themselves():
    e = torch.tensor([float("inf"), 1.0])
    assert allclose("o", e.clone(), e, POLICY).passed
    assert not allclose("o", torch.tensor([-float("inf"), 1.0]), e, POLICY).passed


def test_per_comparator_tolerances_override_the_policy():
    e = torch.ones(3)
    assert not allclose("o", e * 1.01, e, POLICY).passed
    assert Allclose(rtol=2e-2)("o", e * 1.01, e, POLICY).passed


def test_shape_mismatch():
    assert "shape (2,) != golden shape (3,)" in allclose("o", torch.ones(2), torch.ones(3), POLICY).message


def test_bf16_outputs_are_compared_in_double():
    e = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert allclose("o", e.clone(), e, POLICY).passed
