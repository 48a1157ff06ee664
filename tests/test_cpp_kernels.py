"""The C++ kernels of kernels/cpp_kernels.py at shapes their cases do not cover: a single row or
element, sizes that are not multiples of the SIMD width, of gemm's register tile or of its cache
blocks. Each output is held to the rounding-error bound of the kernel's fp32 arithmetic
(u = 2^-24) against the JIT module's golden, evaluated in float64."""
import json
import re
import shutil
from xml.etree import ElementTree

import pytest
import torch
from project import ROOT, Project

from golden_tasks import ScalarSpec, TensorSpec
from golden_tasks.model.errors import StageFailed
from golden_tasks.model.specs import dtype_of
from kernels import cpp_kernels, gemm, rms_norm, softmax

U = 2.0 ** -24
TINY = torch.finfo(torch.float32).tiny  # gt_expf flushes results below it to 0


def call(kernel, golden, values: dict, tmp_path, device="cpu") -> dict:
    """Compile `kernel` for `values` (parameter name → float32 tensor or scalar), call it on copies
    on `device` and the golden on float64 copies; {output name: (kernel's, golden's)}, on the CPU."""
    params = kernel.params()
    specs = [ScalarSpec(p.name, dtype_of(p.dtype), values[p.name]) if p.by_value
             else TensorSpec(p.name, tuple(values[p.name].shape), torch.float32) for p in params]
    fn = kernel.compile([s.stamped(p.direction) for s, p in zip(specs, params)], {}, tmp_path).load()
    args = [values[p.name] if p.by_value else values[p.name].to(device, copy=True) for p in params]
    fn(*args)
    expected = {n: v.double() if isinstance(v, torch.Tensor) else v for n, v in values.items()}
    golden(expected)
    return {p.name: (arg.double().cpu(), expected[p.name]) for p, arg in zip(params, args) if p.direction != "in"}


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (13, 2, 17), (7, 300, 45), (67, 513, 129)])
def test_gemm_is_exact_on_integers(m, k, n, tmp_path):
    """Small integers: every product and partial sum is exact in fp32, so any order gives the
    golden exactly, and a tile or block that drops, repeats or misplaces a term cannot hide."""
    a, b = (torch.randint(-4, 5, shape).float() for shape in ((m, k), (k, n)))
    actual, expected = call(cpp_kernels.gemm_cpp, gemm.golden_gemm,
                            {"a": a, "b": b, "c": torch.zeros(m, n), "m": m, "k": k, "n": n}, tmp_path)["c"]
    assert torch.equal(actual, expected)


@pytest.mark.parametrize(("m", "k", "n"), [(7, 300, 45), (67, 513, 129)])
def test_gemm_within_the_summation_bound(m, k, n, tmp_path):
    """|error| <= (k + 2)·u·(|a| @ |b|): k roundings of the sum, one per k block added into c."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    actual, expected = call(cpp_kernels.gemm_cpp, gemm.golden_gemm,
                            {"a": a, "b": b, "c": torch.zeros(m, n), "m": m, "k": k, "n": n}, tmp_path)["c"]
    assert ((actual - expected).abs() <= (k + 2) * U * (a.double().abs() @ b.double().abs())).all()


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (5, 17), (3, 1000)])
def test_rms_norm_within_its_bound(rows, cols, tmp_path):
    """Sum of squares <= (cols + 1)·u relative in any order, halved by the sqrt, then ~5 roundings."""
    x, weight = torch.randn(rows, cols), torch.randn(cols)
    actual, expected = call(cpp_kernels.rms_norm_cpp, rms_norm.golden_rms_norm,
                            {"x": x, "weight": weight, "out": torch.zeros(rows, cols), "rows": rows,
                             "cols": cols, "eps": 1e-6}, tmp_path)["out"]
    torch.testing.assert_close(actual, expected, rtol=(cols / 2 + 6) * U, atol=0)


@pytest.mark.parametrize(("rows", "cols", "scale"), [(1, 1, 1.0), (5, 17, 1.0), (3, 1000, 1.0), (4, 333, 40.0)])
def test_softmax_within_its_bound(rows, cols, scale, tmp_path):
    """Relative error <= (2·max|x - max| + cols + 8)·u: x - max rounds (twice: numerator and sum),
    gt_expf <= 1.01 ulp, the sum, the reciprocal and the product; scale=40 reaches exponents
    far below gt_expf's underflow, where it gives 0 and the golden less than FLT_MIN."""
    x = torch.randn(rows, cols) * scale
    spread = (x.max(-1, keepdim=True).values - x).max().item()
    actual, expected = call(cpp_kernels.softmax_cpp, softmax.golden_softmax,
                            {"x": x, "out": torch.zeros(rows, cols), "rows": rows, "cols": cols}, tmp_path)["out"]
    torch.testing.assert_close(actual, expected, rtol=(2 * spread + cols + 8) * U, atol=TINY)
    assert scale == 1 or (actual == 0).any()  # the underflow path ran


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_rms_norm_cuda(tmp_path):
    """On a GPU, held to the CPU kernel's bound (a tree sum is no worse); without one it compiles
    and refuses to load."""
    rows, cols = 5, 1000  # cols > the block's 256 threads: each thread sums several columns
    values = {"x": torch.randn(rows, cols), "weight": torch.randn(cols), "out": torch.zeros(rows, cols),
              "rows": rows, "cols": cols, "eps": 1e-6}
    if not torch.cuda.is_available():
        with pytest.raises(StageFailed, match="CUDA kernel and CUDA is not available"):
            call(cpp_kernels.rms_norm_cuda, rms_norm.golden_rms_norm, values, tmp_path)
        return
    actual, expected = call(cpp_kernels.rms_norm_cuda, rms_norm.golden_rms_norm, values, tmp_path, "cuda")["out"]
    torch.testing.assert_close(actual, expected, rtol=(cols / 2 + 6) * U, atol=0)


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine runs the CUDA case (the GPU check verifies it)")
def test_the_cpp_cases_verify_with_doit_and_cuda_is_skipped_not_passed(tmp_path):
    proj = Project(tmp_path / "p", ("cpp_kernels", "rms_norm", "softmax", "gemm"))
    shutil.copytree(ROOT / "kernels" / "cpp", proj.path / "kernels" / "cpp")
    cases = ["rms_norm_cpp", "softmax_cpp", "gemm_cpp", "rms_norm_cuda"]
    proc = proj.console("-n", "2", *[f"verify:{c}" for c in cases])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((proj.path / "runs" / "report.json").read_text())
    rows = {r["case"]: r for r in summary["cases"]}
    # a skip is not a failure (pytest's rule): the run passed, and every report counts the skip
    assert [rows[c]["status"] for c in cases] == ["PASS", "PASS", "PASS", "SKIPPED"] and summary["passed"]
    assert summary["counts"] == {"SKIPPED": 1, "PASS": 3} and proc.stdout.splitlines()[-1] == "4 cases: 1 SKIPPED, 3 PASS"
    assert rows["rms_norm_cuda"]["stages"]["compile"] == "ran" and rows["rms_norm_cuda"]["kernel_us"] is None
    assert [rows["rms_norm_cuda"]["stages"][s] for s in ("dispatch", "validate", "bench")] == ["skipped"] * 3
    policy = rows["rms_norm_cuda"]["stages"]["policy"]  # the columns: abi compile inputs golden dispatch policy validate
    assert re.search(rf"^rms_norm_cuda +SKIPPED( +\S+){{4}} +skipped +{policy} +skipped ", proc.stdout, re.M), proc.stdout
    junit = ElementTree.parse(proj.path / "runs" / "report.xml").getroot()
    assert (junit.get("failures"), junit.get("errors"), junit.get("skipped")) == ("0", "0", "1")
    assert rows["rms_norm_cuda"]["skipped"].startswith("a CUDA kernel and no CUDA device here")
    assert "rms_norm_cuda: SKIPPED: a CUDA kernel and no CUDA device here" in proc.stdout
