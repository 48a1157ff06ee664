"""golden_tasks.run: the pipeline in-process, with the same cache and keys."""
import json

import pytest
import torch

import golden_tasks
from golden_tasks import In, Out, Scalar, ScalarSpec, TensorSpec, jit

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine


@jit(backend="eager")
def scaled_sum(x: In, scale: Scalar, out: Out):
    out.copy_(x.sum(-1) * scale)


@jit(backend="eager")
def scaled_sum_broken(x: In, scale: Scalar, out: Out):
    """Deliberately wrong: drops the last column."""
    out.copy_(x[:, :-1].sum(-1) * scale)


def golden(t):
    t["out"].copy_(t["x"].double().sum(-1) * t["scale"])


def golden_refactored(t):
    """Same values as `golden`, written differently."""
    t["out"].copy_(torch.einsum("ij->i", t["x"].double()) * t["scale"])


def golden_other(t):
    t["out"].copy_(t["x"].double().sum(-1) * t["scale"] * (1 + 1e-6))


def specs():
    return [TensorSpec("x", (8, 16), torch.float32, torch.randn), ScalarSpec("scale", torch.float32, 0.5),
            TensorSpec("out", (8,), torch.float32)]


def verify(fn=scaled_sum, gold=golden, **kw):
    return golden_tasks.run(fn=fn, specs=specs, golden=gold, rtol=1e-5, atol=1e-5, rounds=3, **kw)


@pytest.mark.e2e
def test_pass_then_everything_cached():
    first = verify()
    assert first.passed and first.error is None, first.error
    # every stage of the case ran; the machine was measured before (conftest.calibrated), as in a user's cache
    assert set(first.stages.values()) == {"ran", "cached"} and first.stages["calibrate"] == "cached"
    assert first.bench.rounds == 3 and first.bench.min <= first.bench.median <= first.bench.max
    assert first.golden_bench.rounds == 3
    assert (first.work_dir / "report.json").exists()
    second = verify()
    assert second.passed and set(second.stages.values()) == {"cached"}


@pytest.mark.e2e
def test_broken_kernel_fails_with_the_mismatch():
    result = verify(scaled_sum_broken)
    assert not result.passed
    assert result.stages["validate"] == "FAILED" and result.stages["bench"] == "-"
    assert "output 'out': " in result.error and "mismatched" in result.error


@pytest.mark.e2e
def test_broken_kernel_fails_even_after_a_correct_one_was_cached():
    assert verify().passed
    assert not verify(scaled_sum_broken, name="scaled_sum").passed


@pytest.mark.e2e
def test_early_cutoff_golden_with_same_outputs_does_not_revalidate():
    verify()
    refactored = verify(gold=golden_refactored)
    assert refactored.stages["golden"] == "ran"
    assert refactored.stages["validate"] == "cached"
    assert refactored.stages["bench"] == "cached" and refactored.stages["golden_bench"] == "ran"
    other = verify(gold=golden_other)
    assert other.stages["golden"] == "ran" and other.stages["validate"] == "ran"
    assert {other.stages[s] for s in ("abi", "compile", "inputs", "dispatch", "inputs2")} == {"cached"}
    assert other.stages["bench"] == "ran"  # its recheck judges the kernel against the new golden


@pytest.mark.e2e
def test_seed_changes_inputs_only_downstream():
    verify()
    reseeded = verify(seed=1)
    assert reseeded.stages["inputs"] == "ran" and reseeded.stages["compile"] == "cached"


@pytest.mark.e2e
def test_inputs_are_bitwise_reproducible(tmp_path):
    digests = []
    for root in ("a", "b"):
        verify(cache_dir=tmp_path / root)
        entries = list((tmp_path / root / "entries" / "inputs").rglob("*.json"))
        assert len(entries) == 1
        digests.append(json.loads(entries[0].read_text())["digest"])
    assert digests[0] == digests[1]


def test_abi_mismatch_is_a_failed_result_before_any_tensor():
    def wrong_order():
        s = specs()
        return [s[1], s[0], s[2]]
    result = golden_tasks.run(fn=scaled_sum, specs=wrong_order, golden=golden)
    assert not result.passed and result.stages["abi"] == "FAILED"
    assert "order differs: kernel (x, scale, out) vs specs (scale, x, out)" in result.error
    assert result.stages["inputs"] == "-"


def test_duplicate_spec_names():
    dup = [TensorSpec("x", (2,), torch.float32), TensorSpec("x", (2,), torch.float32)]
    result = golden_tasks.run(fn=scaled_sum, specs=dup, golden=golden)
    assert not result.passed and "duplicate spec names x" in result.error


@pytest.mark.e2e
def test_golden_that_raises_stops_before_the_kernel():
    def bad_golden(t):
        raise ValueError("reference blew up")
    result = verify(gold=bad_golden)
    assert not result.passed and result.stages["golden"] == "FAILED"
    assert "golden of scaled_sum raised ValueError: reference blew up" in result.error
    assert result.stages["validate"] == "-"


@pytest.mark.e2e
def test_no_golden_is_not_a_pass():
    result = verify(gold=None)
    assert not result.passed and result.report.status == "SKIPPED"


def test_plain_function_is_refused():
    with pytest.raises(TypeError, match="kernel form"):
        golden_tasks.run(fn=lambda x: x, specs=specs, golden=golden)


def test_run_takes_exactly_the_options_of_a_case():
    with pytest.raises(TypeError, match=r"^run\(\) got unknown options rtl; it takes rtol, atol, compare, "):
        golden_tasks.run(fn=scaled_sum, specs=specs, golden=golden, rtl=1e-3)


@pytest.mark.e2e
def test_aoti_backend_passes():
    result = golden_tasks.run(fn=scaled_sum, specs=specs, golden=golden, rtol=1e-5, atol=1e-5,
                              backend="aoti", rounds=3)
    assert result.passed, result.error
