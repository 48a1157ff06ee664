"""The stage modules on their own: plain inputs in, Outputs out, no doit, no store."""
import dataclasses

import pytest
import torch

from golden_tasks import Case, In, InOut, Out, Scalar, ScalarSpec, TensorSpec, jit
from golden_tasks.model.compare import Allclose, Policy
from golden_tasks.model.errors import StageFailed
from golden_tasks.model.outputs import CompileMeta, InputsMeta, Upstream, Worst
from golden_tasks.model.plan import Plan
from golden_tasks.model.rows import compiled_for
from golden_tasks.model.specs import stamp_all
from golden_tasks.stages import (
    BenchSettings,
    Outputs,
    abi,
    dispatch,
    golden,
    golden_bench,
    inputs,
    measure,
    policy,
    validate,
)


@jit(backend="eager")
def acc(x: In, total: InOut, scale: Scalar, out: Out):
    total.add_(x)
    out.copy_(x * scale)


def golden_acc(t):
    t["total"].add_(t["x"])
    t["out"].copy_(t["x"] * t["scale"])


SPECS = [TensorSpec("x", (3, 4), torch.float32, torch.randn), TensorSpec("total", (3, 4), torch.float32, 1.0),
         ScalarSpec("scale", torch.float32, 2.0), TensorSpec("out", (3, 4), torch.float32, float("nan"))]
CASE = Case("acc", specs=SPECS, kernel=acc, golden=golden_acc).resolved()
PLAN = Plan(case="acc", seed=3, params=acc.params(), bench={"warmup": 1, "rounds": 2}, timeout=60.0,
            signature=[s.signature for s in SPECS],
            compiled_for=compiled_for(acc.params(), [s.signature for s in SPECS], acc.builds_once))


@pytest.fixture
def upstream(tmp_path):
    checked = abi.run(None, PLAN, tmp_path, Upstream())
    made = inputs.run(CASE, PLAN, tmp_path, Upstream(abi=checked))
    return checked, made


def test_abi_stamps_directions_and_needs_no_case(upstream):
    checked, _ = upstream
    assert [r.direction for r in checked.meta.table] == ["in", "inout", "in", "out"]


def test_abi_collects_every_mismatch_into_one_message(tmp_path):
    plan = dataclasses.replace(PLAN, signature=[PLAN.signature[1], PLAN.signature[0]])
    with pytest.raises(StageFailed) as failure:
        abi.run(None, plan, tmp_path, Upstream())
    assert str(failure.value).splitlines() == ["ABI mismatch for acc:",
                                               "  kernel parameters with no spec: scale, out"]


def test_inputs_are_seeded_per_spec_and_hold_each_buffer_with_initial_content(upstream, tmp_path):
    checked, made = upstream
    # the Out's init_value is its initial content (NaN marking what it need not define): not an input's NaN
    assert set(made.tensors) == {"x", "total", "out"} and made.tensors["out"].isnan().all()
    assert made.meta == InputsMeta(scalars={"scale": 2.0}, nonfinite={})
    again = inputs.run(CASE, PLAN, tmp_path, Upstream(abi=checked))
    assert torch.equal(again.tensors["x"], made.tensors["x"])
    reseeded = inputs.run(CASE, dataclasses.replace(PLAN, seed=4), tmp_path, Upstream(abi=checked))
    assert not torch.equal(reseeded.tensors["x"], made.tensors["x"])
    assert torch.equal(made.tensors["total"], torch.ones(3, 4))


def test_golden_gets_its_own_out_init_and_is_timed_apart(upstream, tmp_path):
    checked, made = upstream
    result = golden.run(CASE, PLAN, tmp_path, Upstream(abi=checked, inputs=made))
    assert set(result.tensors) == {"total", "out"} and result.stats.golden_us is None
    torch.testing.assert_close(result.tensors["total"], made.tensors["x"] + 1)
    assert torch.equal(made.tensors["total"], torch.ones(3, 4))  # inputs untouched
    seen = []  # the InOut buffer each call finds: restored to the input before every call
    case = dataclasses.replace(CASE, golden=lambda t: seen.append(t["total"].clone()) or golden_acc(t))
    timing = golden_bench.run(case, PLAN, tmp_path, Upstream(abi=checked, inputs=made)).stats.golden_us
    assert timing.rounds == 2 and timing.warmup == 1 and len(seen) == 3
    assert all(torch.equal(t, torch.ones(3, 4)) for t in seen)


def compiled(tmp_path, checked):
    specs = [s.stamped(r.direction) for s, r in zip(SPECS, checked.meta.table)]
    artifact = acc.compile(specs, {"backend": "eager"}, tmp_path)
    return Outputs(files=artifact.files, meta=CompileMeta(backend=artifact.backend, module="golden_tasks.forms.jit",
                                                          table=artifact.table))


def test_dispatch_runs_on_copies(upstream, tmp_path):
    checked, made = upstream
    result = dispatch.run(None, PLAN, tmp_path, Upstream(abi=checked, compile=compiled(tmp_path, checked), inputs=made))
    assert set(result.tensors) == {"total", "out"}
    torch.testing.assert_close(result.tensors["out"], made.tensors["x"] * 2)
    assert torch.equal(made.tensors["total"], torch.ones(3, 4))


@jit(backend="eager")
def half(x: In, out: Out):
    out[:2].copy_(x[:2])


def test_an_out_without_init_value_starts_as_the_canary_and_what_is_left_is_named(tmp_path):
    from golden_tasks.model.specs import unwritten

    specs = [TensorSpec("x", (4, 3), torch.float32, torch.randn), TensorSpec("out", (4, 3), torch.float32)]
    case = Case("half", specs=specs, kernel=half, golden=lambda t: t["out"][:2].copy_(t["x"][:2])).resolved()
    plan = dataclasses.replace(PLAN, case="half", params=half.params(), signature=[s.signature for s in specs])
    checked = abi.run(None, plan, tmp_path, Upstream())
    made = inputs.run(case, plan, tmp_path, Upstream(abi=checked))
    assert set(made.tensors) == {"x"}  # the Out has no initial content
    artifact = half.compile(stamp_all(specs, checked.meta.table), {"backend": "eager"}, tmp_path)
    built = Outputs(files=artifact.files, meta=CompileMeta(backend=artifact.backend, module="golden_tasks.forms.jit",
                                                           table=artifact.table))
    result = dispatch.run(None, plan, tmp_path, Upstream(abi=checked, compile=built, inputs=made))
    assert unwritten(result.tensors["out"][2:]).all() and not unwritten(result.tensors["out"][:2]).any()
    # the golden's copy starts at zeros: rows 2-3 are zeros there, and the kernel never wrote them
    expected = golden.run(case, plan, tmp_path, Upstream(abi=checked, inputs=made))
    with pytest.raises(StageFailed) as failed:
        validated(case, plan, tmp_path, result, expected, made)
    assert "output 'out': 6 of 12 elements not written (first at (2, 0))" in str(failed.value)
    assert "init_value=torch.zeros" in str(failed.value)
    # the summary's max err says so: the canary of an unwritten float is a NaN, not counted as one
    assert failed.value.worst == Worst(max_abs=0.0, unwritten=6)
    result.tensors["out"][2:] = 0  # the honest kernel writes every element
    assert validated(case, plan, tmp_path, result, expected, made).meta.max_abs == 0.0


@pytest.mark.parametrize("wrong,worst,shown", [
    ("nan", Worst(max_abs=0.0, nan=12), "12 NaN"),  # NaN everywhere: no finite difference, and none hidden
    ("overflow", Worst(max_abs=1.0, nan=4, inf=2), "4 NaN, 2 inf"),
    ("off", Worst(max_abs=0.5), "5.00e-01"),  # finite: the real worst error
])
def test_a_failed_validation_says_what_is_worst_about_the_outputs(wrong, worst, shown):
    """The summary's max err tells what failed: elements NaN or infinite where the golden's are finite,
    else the largest absolute error (which alone ignores them: 0 beside every element NaN)."""
    from golden_tasks.model.records import CaseRow

    expected = {"out": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    actual = {"out": expected["out"].clone()}
    if wrong == "nan":
        actual["out"].fill_(float("nan"))
    elif wrong == "overflow":
        actual["out"][0] = float("nan")
        actual["out"][1, :2] = float("inf")
        actual["out"][2, 0] += 1.0
    else:
        actual["out"][1, 1] += 0.5
    with pytest.raises(StageFailed) as failed:
        validate.judge(Policy(rtol=0.0, atol=0.0), actual, expected, "c", {})
    assert failed.value.worst == worst
    counts = {k: v or None for k, v in dataclasses.asdict(worst).items() if k != "max_abs"}
    assert CaseRow(case="c", status="FAIL", max_abs=worst.max_abs, **counts).max_error() == shown


def test_dispatch_refuses_an_artifact_whose_table_differs(upstream, tmp_path):
    checked, made = upstream
    artifact = compiled(tmp_path, checked)
    artifact.meta.table[0] = dataclasses.replace(artifact.meta.table[0], shape=(3, 5))
    with pytest.raises(StageFailed, match="artifact parameter table differs from the ABI-checked one"):
        dispatch.run(None, PLAN, tmp_path, Upstream(abi=checked, compile=artifact, inputs=made))


def validated(case, plan, tmp_path, actual, expected, made):
    """The validate stage on the kernel's outputs, with the case's policy as its own stage saves it (validate is
    never handed the case)."""
    checked = abi.run(None, plan, tmp_path, Upstream())
    saved = policy.run(case, plan, tmp_path, Upstream())
    return validate.run(None, plan, tmp_path, Upstream(abi=checked, dispatch=actual, golden=expected, inputs=made,
                                                       policy=saved))


def test_validate_passes_fails_and_rejects_unknown_outputs(upstream, tmp_path):
    checked, made = upstream
    expected = golden.run(CASE, PLAN, tmp_path, Upstream(abi=checked, inputs=made))
    actual = dispatch.run(None, PLAN, tmp_path, Upstream(abi=checked, compile=compiled(tmp_path, checked), inputs=made))
    report = validated(CASE, PLAN, tmp_path, actual, expected, made)
    assert report.meta.skipped is None and [o["name"] for o in report.meta.outputs] == ["total", "out"]
    actual.tensors["out"][1, 2] += 1
    with pytest.raises(StageFailed, match=r"output 'out': 1/12 elements mismatched"):
        validated(CASE, PLAN, tmp_path, actual, expected, made)
    loose = Case("acc", specs=SPECS, kernel=acc, golden=golden_acc, compare={"out": Allclose(atol=2)}).resolved()
    assert validated(loose, PLAN, tmp_path, actual, expected, made).meta.max_abs == 1.0
    typo = Case("acc", specs=SPECS, kernel=acc, golden=golden_acc, compare={"outt": Allclose()}).resolved()
    with pytest.raises(StageFailed, match="compare names outt, which are not outputs"):
        validated(typo, PLAN, tmp_path, actual, expected, made)


def test_bench_measures_rounds():
    calls = []
    timing = measure(lambda: calls.append(1), BenchSettings(warmup=3, rounds=7))
    assert len(calls) == 10 and timing.rounds == 7 and timing.stopped == "rounds" and len(timing.times) == 7
    assert 0 <= timing.min <= timing.median <= timing.max and timing.min <= timing.mean <= timing.max


class FakeClock:
    """A clock that advances by the next of `rounds` (seconds) on every timed call."""

    def __init__(self, rounds):
        self.now, self.rounds = 0.0, iter(rounds)

    def __call__(self):
        return self.now

    def call(self):
        self.now += next(self.rounds)


def test_adaptive_rounds_stop_on_noise_budget_or_round_count():
    from golden_tasks.stages import adaptive_rounds

    rule = BenchSettings(warmup=5, min_rounds=10, max_rounds=1000, rse=0.01, budget=60.0)
    steady = FakeClock([1.0] * 5 + [0.01] * 100)  # 5 warmup calls, then identical rounds
    times, why, warmed = adaptive_rounds(steady.call, rule, clock=steady)
    assert why == "noise" and len(times) == 10 and warmed == 5  # no fewer than min_rounds, even with no noise
    noisy = FakeClock([0.01, 0.05] * 500)
    times, why, _ = adaptive_rounds(noisy.call, BenchSettings(warmup=0, min_rounds=10, rse=0.001, budget=1.0), clock=noisy)
    assert why == "budget" and len(times) == 34  # 0.03 s a round on average: the 1 s budget is spent after 34
    times, why, _ = adaptive_rounds(noisy.call, BenchSettings(warmup=0, max_rounds=20, rse=0.001), clock=noisy)
    assert why == "rounds" and len(times) == 20
    times, why, _ = adaptive_rounds(noisy.call, BenchSettings(warmup=0, rounds=7, rse=1.0, budget=0.001), clock=noisy)
    assert why == "rounds" and len(times) == 7  # a fixed count ignores the noise target and the budget
    seen = []  # every rank decides on the agreed (slowest) times: steady here, but a noisy peer keeps it going
    slow = FakeClock([0.01] * 100)
    times, why, _ = adaptive_rounds(slow.call, BenchSettings(warmup=0, min_rounds=5, max_rounds=100), clock=slow,
                                    agree=lambda us, s: seen.append(us) or (us * (2 + len(seen) % 2), s))
    assert why == "rounds" and len(times) == 100 and len(seen) == 100


def test_adaptive_warmup_is_cut_short_by_a_quarter_of_the_budget_and_refreshes_every_call():
    from golden_tasks.stages import adaptive_rounds

    expensive = FakeClock([2.0] * 20)  # a 2 s call: 5 warmup calls would spend the whole 10 s budget
    refreshed = []
    times, why, warmed = adaptive_rounds(expensive.call, BenchSettings(warmup=5, min_rounds=3, budget=10.0),
                                         before=lambda _: refreshed.append(expensive.now), clock=expensive)
    assert warmed == 2 and why == "noise" and len(times) == 3  # 2 warmups spend 4 s > 2.5 s; no noise, 3 rounds
    assert len(refreshed) == warmed + len(times)
    agreed = FakeClock([0.1] * 20)  # this rank is quick, a peer is not: every rank stops warming up together
    _, _, warmed = adaptive_rounds(agreed.call, BenchSettings(warmup=5, min_rounds=3, budget=10.0), clock=agreed,
                                   agree=lambda us, s: (us, s + 3.0))
    assert warmed == 1


def test_a_timing_reports_spread_noise_floor_and_outliers_without_dropping_them():
    from golden_tasks.model.records import Timing

    timing = Timing.of_rounds([10.0, 11.0, 10.0, 12.0, 11.0, 10.0, 50.0], "budget", warmup=2)
    assert timing.rounds == 7 and timing.max == 50.0 and timing.stopped == "budget"
    assert timing.outliers == 1 and timing.outlier_times == [50.0]
    assert timing.iqr == 1.5 and timing.std > 0 and 0 < timing.rse < 1 and timing.times[-1] == 50.0
    assert Timing.of_rounds([5.0], "rounds", warmup=0).rse is None
    summary, _ = timing.split()
    with pytest.raises(ValueError, match="holds no round times"):
        _ = summary.outlier_times


def test_the_stopping_rule_tracks_the_same_noise_floor_the_timing_reports():
    from golden_tasks.model.records import relative_standard_error
    from golden_tasks.stages import _RunningMean

    series = [10.0 + (i * 7919 % 13) ** 2 for i in range(2000)]
    running = _RunningMean()
    for count, value in enumerate(series, 1):
        running.add(value)
        if count in (2, 10, 2000):
            assert running.rse == pytest.approx(relative_standard_error(series[:count]), rel=1e-9)
    assert _RunningMean().rse == float("inf")


def test_a_mismatch_in_a_stacked_output_names_the_ranks_whose_slice_is_wrong():
    from golden_tasks.model.compare import Policy, ratio_allclose

    expected = {"out": torch.arange(24.0).reshape(4, 6), "total": torch.tensor(3.0)}
    actual = {name: t.clone() for name, t in expected.items()}
    actual["out"][1, 2] += 1
    actual["out"][3, 0] -= 1
    with pytest.raises(StageFailed) as failed:
        validate.judge(Policy(1e-5, 1e-5), actual, expected, "c", {}, placement={"out": "stacked"})
    assert "output 'out': 2/24 elements mismatched" in str(failed.value)
    assert "wrong on ranks 1, 3 (of 4: the leading dim is the rank)" in str(failed.value)
    actual["out"][3, 0] += 1
    with pytest.raises(StageFailed, match=r"wrong on rank 1 \(of 4"):
        validate.judge(Policy(1e-5, 1e-5), actual, expected, "c", {}, placement={"out": "stacked"})
    # not stacked, or judged as a whole (a ratio of bad points), the message names no rank
    for placement, compare in (({}, {}), ({"out": "stacked"}, {"out": ratio_allclose(max_error_ratio=0.01)})):
        with pytest.raises(StageFailed) as failed:
            validate.judge(Policy(1e-5, 1e-5, compare=compare), actual, expected, "c", {}, placement)
        assert "wrong on rank" not in str(failed.value)
