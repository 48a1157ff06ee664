"""Never a wrong PASS, in-process: what keys follow, what cannot be fingerprinted, and verdicts and
messages that cannot be misread (golden_tasks.run; the doit side is in test_soundness_doit.py)."""
import pytest
import torch

import golden_tasks
from golden_tasks import In, InOut, Out, Scalar, ScalarSpec, TensorSpec, jit

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine


class Marker(Exception):
    """An exception instance keeps C state a fingerprint cannot read, and still pickles."""


MARK = Marker("reference")


@jit(backend="eager")
def copy(x: In, out: Out):
    out.copy_(x)


def golden_copy(t):
    t["out"].copy_(t["x"])


def golden_guarded(t):
    assert MARK.args == ("reference",)
    t["out"].copy_(t["x"])


def copy_specs(init=torch.randn):
    return [TensorSpec("x", (4, 8), torch.float32, init), TensorSpec("out", (4, 8), torch.float32)]


@pytest.mark.e2e
def test_what_cannot_be_fingerprinted_recomputes_on_every_run_and_passes():
    runs = [golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_guarded, rounds=1) for _ in range(2)]
    for result in runs:
        assert result.passed, result.error
        assert result.stages["golden"] == result.stages["validate"] == "ran"


@pytest.mark.e2e
def test_a_declared_file_read_at_call_time_enters_the_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scale.txt").write_text("1.0")

    def golden_scaled(t):  # reads the file when called: no fingerprint can see it
        t["out"].copy_(t["x"] * float((tmp_path / "scale.txt").read_text()))

    def verify():
        return golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_scaled, rounds=1, file_deps=["*.txt"])
    assert verify().passed
    assert set(verify().stages.values()) == {"cached"}
    (tmp_path / "scale.txt").write_text("2.0")
    edited = verify()
    assert not edited.passed and edited.stages["golden"] == "ran" and "mismatched" in edited.error
    (tmp_path / "scale.txt").write_text("1.0")
    assert set(verify().stages.values()) == {"cached"}


@pytest.mark.e2e
def test_a_declared_variable_read_at_call_time_enters_the_keys(monkeypatch):
    monkeypatch.setenv("GT_SOUNDNESS_SCALE", "1")

    def golden_scaled(t):
        t["out"].copy_(t["x"] * float(__import__("os").environ["GT_SOUNDNESS_SCALE"]))

    def verify():
        return golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_scaled, rounds=1,
                                env_deps=["GT_SOUNDNESS_SCALE"])
    assert verify().passed
    monkeypatch.setenv("GT_SOUNDNESS_SCALE", "2")
    assert not verify().passed


def test_a_missing_declared_file_names_the_case_and_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_copy, name="needs_table",
                              file_deps=["table.bin"])
    assert not result.passed
    assert "case 'needs_table': file_deps names 'table.bin', which is not a file" in result.error


@pytest.mark.e2e
def test_a_golden_that_never_writes_an_out_says_so():
    def golden_forgets(t):
        t["x"].mul(2)  # computes, but never writes t["out"]
    result = golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_forgets, name="forgetful")
    assert not result.passed and result.stages["golden"] == "FAILED"
    assert "golden of forgetful never wrote its output 'out'" in result.error


@pytest.mark.e2e
def test_a_golden_that_replaces_its_buffer_or_writes_the_initial_value_is_not_flagged():
    def golden_rebinds(t):
        t["out"] = t["x"].clone()
    assert golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_rebinds, rounds=1).passed

    @jit(backend="eager")
    def zero(x: In, out: Out):
        out.zero_()

    def golden_zero(t):
        t["out"].zero_()  # the same bits as the initial zeros, but written
    assert golden_tasks.run(fn=zero, specs=copy_specs, golden=golden_zero, rounds=1).passed


@pytest.mark.e2e
def test_a_nan_input_is_named_when_outputs_mismatch():
    def with_nan():
        x = torch.randn(4, 8)
        x[1, 2] = float("nan")
        return x
    result = golden_tasks.run(fn=copy, specs=lambda: copy_specs(with_nan), golden=golden_copy, name="nan_in")
    assert not result.passed
    assert "input 'x' holds 1 NaN/Inf, first at (1, 2)" in result.error


@pytest.mark.parametrize("specs, shown", [
    (lambda: "x", "got 'x'"),
    (lambda: [TensorSpec("x", (2,), torch.float32), {"name": "out"}], "got [TensorSpec("),
    (42, "got 42"),
])
def test_specs_that_are_not_a_list_of_specs_name_the_case(specs, shown):
    result = golden_tasks.run(fn=copy, specs=specs, golden=golden_copy, name="bad_specs")
    assert not result.passed
    assert "case 'bad_specs': specs must be a list of TensorSpec and ScalarSpec" in result.error and shown in result.error


def test_a_kernel_without_outputs_is_an_error_not_a_pass():
    @jit(backend="eager")
    def reads_only(x: In, scale: Scalar):
        x.sum()
    result = golden_tasks.run(fn=reads_only, specs=[TensorSpec("x", (2,), torch.float32),
                                                    ScalarSpec("scale", torch.float32, 1.0)],
                              golden=lambda t: None, name="no_outputs")
    assert not result.passed
    assert "case 'no_outputs': kernel reads_only has no Out or InOut parameter" in result.error


@jit
def accumulate_half(x: In, out: InOut):
    """Accumulates row by row in float16, as written."""
    for i in range(x.shape[0]):
        out.copy_(out + x[i])


def golden_accumulate_half(t):
    """The same float16 accumulation, run eagerly: bitwise what the kernel says."""
    for i in range(t["x"].shape[0]):
        t["out"].copy_(t["out"] + t["x"][i])


@pytest.mark.e2e
def test_the_default_backend_computes_in_the_precision_the_kernel_is_written_in():
    """Inductor would keep the running sum in float32; a verifier must see the float16 rounding."""
    specs = [TensorSpec("x", (64, 256), torch.float16, torch.rand), TensorSpec("out", (256,), torch.float16)]
    for backend in ("aoti", "eager"):
        result = golden_tasks.run(fn=accumulate_half, specs=specs, golden=golden_accumulate_half, rtol=0, atol=0,
                                  rounds=1, backend=backend)
        assert result.passed, f"{backend}: {result.error}"


def test_a_case_that_cannot_cross_into_the_isolated_process_says_so():
    import threading
    lock = threading.Lock()

    def golden_locked(t):
        with lock:
            t["out"].copy_(t["x"])
    result = golden_tasks.run(fn=copy, specs=copy_specs, golden=golden_locked, name="locked")
    assert not result.passed
    assert "case 'locked': its kernel, golden and comparators run in an isolated process, so they must pickle" \
        in result.error and "_thread.lock" in result.error
