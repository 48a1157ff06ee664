"""Bring your own data: inputs and goldens from a directory, checked, keyed by content."""
import textwrap

import pytest
import torch
from project import Project, ran, stage_results

import golden_tasks
from golden_tasks import Case, In, InOut, Out, Scalar, ScalarSpec, SpecError, TensorSpec, jit
from golden_tasks.planning.data import describe

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine


@jit(backend="eager")
def axpy(x: In, y: InOut, alpha: Scalar, out: Out):
    out.copy_(y + alpha * x)
    y.mul_(2)


def golden_axpy(t):
    t["out"].copy_(t["y"] + t["alpha"] * t["x"])
    t["y"].mul_(2)


def specs():
    return [TensorSpec("x", (4, 3), torch.float32, torch.randn), TensorSpec("y", (4, 3), torch.float32, torch.randn),
            ScalarSpec("alpha", torch.float32, 0.5), TensorSpec("out", (4, 3), torch.float32)]


def capture(root, x=None, y=None):
    """Save data as a model hook would: inputs to in/, expected outputs to out/."""
    x = torch.randn(4, 3) if x is None else x
    y = torch.randn(4, 3) if y is None else y
    (root / "in").mkdir(parents=True, exist_ok=True)
    (root / "out").mkdir(exist_ok=True)
    torch.save(x, root / "in" / "x.pt")
    torch.save(y, root / "in" / "y.pt")
    torch.save(0.5, root / "in" / "alpha.pt")
    torch.save(y + 0.5 * x, root / "out" / "out.pt")
    torch.save(y * 2, root / "out" / "y.pt")
    return x, y


def case(**kw):
    return Case("axpy", specs=specs, kernel=axpy, golden=golden_axpy, **kw).resolved()


def test_missing_files_are_listed_all_at_once(tmp_path):
    (tmp_path / "in").mkdir()
    torch.save(torch.zeros(4, 3), tmp_path / "in" / "y.pt")
    with pytest.raises(SpecError) as failure:
        describe(case(inputs_from=tmp_path, golden_from=tmp_path), axpy.params())
    message = str(failure.value)
    for missing in ("in/x.pt", "in/alpha.pt", "out/y.pt", "out/out.pt"):
        assert str(tmp_path / missing) in message
    assert str(tmp_path / "in" / "y.pt") not in message


def test_shape_dtype_and_scalar_mismatches_name_both_sides(tmp_path):
    capture(tmp_path)
    torch.save(torch.zeros(4, 3, dtype=torch.bfloat16), tmp_path / "in" / "x.pt")
    torch.save(0.25, tmp_path / "in" / "alpha.pt")
    with pytest.raises(SpecError) as failure:
        describe(case(inputs_from=tmp_path), axpy.params())
    assert f"{tmp_path / 'in' / 'x.pt'}: shape (4, 3) bfloat16, but spec 'x' is shape (4, 3) float32" in str(
        failure.value)
    assert "holds 0.25, but scalar 'alpha' is 0.5" in str(failure.value)


def test_digests_enter_the_plan(tmp_path):
    capture(tmp_path)
    data, files = describe(case(inputs_from=tmp_path, golden_from=tmp_path), axpy.params())
    assert set(data["data_in"]) == {"x", "y", "alpha"} and set(data["data_out"]) == {"y", "out"}
    assert len(files) == 5


@pytest.mark.e2e
def test_run_with_captured_inputs_and_goldens(tmp_path):
    x, y = capture(tmp_path / "captured")

    def unused_golden(t):
        raise AssertionError("saved goldens take precedence over the golden function")
    result = golden_tasks.run(fn=axpy, specs=specs, golden=unused_golden, rounds=2,
                              inputs_from=tmp_path / "captured", golden_from=tmp_path / "captured")
    assert result.passed, result.error
    (tmp_path / "captured" / "out" / "out.pt").unlink()
    torch.save(torch.zeros(4, 3), tmp_path / "captured" / "out" / "out.pt")  # a wrong golden now
    failed = golden_tasks.run(fn=axpy, specs=specs, golden=unused_golden, rounds=2,
                              inputs_from=tmp_path / "captured", golden_from=tmp_path / "captured")
    assert not failed.passed and "output 'out'" in failed.error
    assert failed.stages["golden"] == "ran" and failed.stages["inputs"] == "cached"


@pytest.mark.e2e
def test_a_runtime_dir_feeds_another_run(tmp_path):
    """Data saved by one run (its runtime dir) is a data directory for the next."""
    first = golden_tasks.run(fn=axpy, specs=specs, golden=golden_axpy, rounds=2, runs_dir=tmp_path / "runs")
    assert first.passed

    def unused_golden(t):
        raise AssertionError("saved goldens take precedence over the golden function")
    again = golden_tasks.run(fn=axpy, specs=specs, golden=unused_golden, rounds=2, name="axpy_again", seed=5,
                             inputs_from=first.work_dir, golden_from=first.work_dir, runs_dir=tmp_path / "runs")
    assert again.passed, again.error
    saved = torch.from_file(str(first.work_dir / "data" / "in" / "x.bin"), size=12, dtype=torch.float32)
    reused = torch.from_file(str(again.work_dir / "data" / "in" / "x.bin"), size=12, dtype=torch.float32)
    assert torch.equal(saved, reused)  # seed=5 was not used: the inputs came from the first run


MODULE = textwrap.dedent('''
    import functools
    import torch
    from golden_tasks import Case
    from kernels.rms_norm import golden_rms_norm, rms_norm, specs

    CASES = [Case("rms_norm_captured", specs=functools.partial(specs, torch.float32), kernel=rms_norm,
                  golden=golden_rms_norm, rtol=1e-5, atol=1e-6, inputs_from="captured")]
''')


@pytest.mark.e2e
def test_doit_rereads_exactly_what_a_changed_data_file_feeds(tmp_path):
    proj = Project(tmp_path / "p", ("rms_norm",))
    (proj.path / "kernels" / "rms_norm_captured.py").write_text(MODULE)
    (proj.path / "captured" / "in").mkdir(parents=True)
    code, results, report, _ = proj.doit("verify:rms_norm_captured", "backend=eager")
    assert code != 0 and results["plan:rms_norm_captured"] == "fail"
    (error,) = [t["error"] for t in report["tasks"] if t["name"] == "plan:rms_norm_captured"]
    assert all(f"captured/in/{n}.pt" in error for n in ("x", "weight", "eps"))
    torch.save(torch.randn(64, 300), proj.path / "captured" / "in" / "x.pt")
    torch.save(torch.randn(300), proj.path / "captured" / "in" / "weight.pt")
    torch.save(torch.tensor(1e-6), proj.path / "captured" / "in" / "eps.pt")
    code, results, _, err = proj.doit("verify:rms_norm_captured", "backend=eager")
    assert code == 0, err
    torch.save(torch.randn(300), proj.path / "captured" / "in" / "weight.pt")
    code, results, _, _ = proj.doit("verify:rms_norm_captured", "backend=eager")
    assert code == 0
    stages = stage_results(results)
    assert {stages[f"{s}:rms_norm_captured"] for s in ("abi", "compile")} == {"up-to-date"}
    assert {"inputs:rms_norm_captured", "golden:rms_norm_captured", "dispatch:rms_norm_captured"} <= ran(stages)
