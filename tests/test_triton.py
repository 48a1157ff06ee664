"""Triton kernels (the @triton_kernel form) on a machine without a GPU: under Triton's interpreter, through
real doit in a temporary project. The library's float32 cases pass and its bfloat16 ones are SKIPPED;
mutants of the kernels fail validation; a read past an input is caught; an edit to a jitted helper re-runs
what it can affect; without the triton extra the cases are SKIPPED, never passed."""
import json
import subprocess
import sys

import pytest
from project import Project

pytest.importorskip("triton", reason="the triton extra is not installed")

from golden_tasks.forms import triton_form
from golden_tasks.project.toolchain import gpu_visible

pytestmark = [pytest.mark.skipif(gpu_visible(), reason="the interpreter's tests: this machine runs Triton on its GPU"),
              pytest.mark.usefixtures("calibrated")]  # golden_tasks.run measures no machine

MODULES = ("triton_kernels", "triton_decode_swa", "gemm", "rms_norm", "softmax", "decode_attention",
           "sparse_attention", "compressor", "indexer")
FAITHFUL = ("rms_norm_triton", "softmax_triton", "matmul_triton", "decode_swa_triton_f32")
BF16 = ("rms_norm_triton_bf16", "softmax_triton_bf16", "matmul_triton_bf16", "decode_swa_triton")

# id: (module, [(line as written, the bug)], the case it must fail): each edit matches once
MUTANTS = {
    "mask_off_by_one": ("triton_kernels", [("x = tl.load(X + cols, mask=cols < n, other=0.0)",
                                            "x = tl.load(X + cols, mask=cols <= n, other=0.0)")], "rms_norm_triton"),
    "missing_tail_tile": ("triton_kernels", [("for start in range(0, K, BLOCK_K):",
                                              "for start in range(0, K - BLOCK_K + 1, BLOCK_K):")], "matmul_triton"),
    "wrong_stride": ("triton_kernels", [("_softmax_row[(rows,)](x, out, n, x.stride(0)",
                                         "_softmax_row[(rows,)](x, out, n, x.stride(1)")], "softmax_triton"),
    "float16_accumulator": ("triton_kernels", [("acc = tl.zeros([TILE], dtype=tl.float32)",
                                                "acc = tl.zeros([TILE], dtype=tl.float16)"),
                                               ("acc += x * x", "acc += (x * x).to(tl.float16)")], "rms_norm_triton"),
    "window_off_by_one": ("triton_decode_swa", [("(j < tl.load(SWA_LENS + t))", "(j < tl.load(SWA_LENS + t) - 1)")],
                          "decode_swa_triton_f32"),
}

OWN = '''
import torch

from golden_tasks import Case, In, Out, TensorSpec, triton_kernel
from golden_tasks.triton import tl, triton

N = 100


@triton.jit
def _shifted(X, OUT, n, WITHIN: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = x[i] + 0 * x[i + 1]: right whatever x[i + 1] holds, unless it is NaN."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nxt = tl.load(X + i + 1, mask=(i + 1 < n) if WITHIN else (i < n), other=0.0)
    tl.store(OUT + i, tl.load(X + i, mask=i < n) + 0.0 * nxt, mask=i < n)


@triton_kernel
def reads_past_end(x: In, out: Out, *, BLOCK: int = 32):
    _shifted[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), WITHIN=False, BLOCK=BLOCK)


@triton_kernel
def reads_within(x: In, out: Out, *, BLOCK: int = 32):
    _shifted[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), WITHIN=True, BLOCK=BLOCK)


@triton.jit
def _rounded(X, OUT, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    tl.store(OUT + i, x.to(tl.bfloat16).to(tl.float32), mask=i < n)  # float32 arguments, bfloat16 inside


@triton_kernel
def rounds_through_bf16(x: In, out: Out):
    _rounded[(4,)](x, out, x.numel(), BLOCK=32)


@triton.autotune(configs=[triton.Config({"BLOCK": 16}, num_warps=2), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def _tuned(X, OUT, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + i, 2.0 * tl.load(X + i, mask=i < n), mask=i < n)


@triton_kernel
def autotuned(x: In, out: Out):
    _tuned[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, out, x.numel())


@triton.jit
def _scaled(X, OUT, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n)
    if SCALE is not None:  # a None constexpr: Triton's own idiom for an optional setting
        x = x * SCALE
    tl.store(OUT + i, x, mask=i < n)


@triton_kernel
def none_default(x: In, out: Out, *, SCALE: float = None, BLOCK: int = 32):
    _scaled[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), SCALE=SCALE, BLOCK=BLOCK)


@triton_kernel
def returns_its_output(x: In, out: Out):
    """As Triton's tutorials' wrappers are written: the output allocated here and returned."""
    output = torch.empty_like(x)
    _scaled[(4,)](x, output, x.numel(), SCALE=None, BLOCK=32)
    return output


@triton.heuristics(values={"BLOCK": lambda args: 32})
@triton.jit
def _heuristic(X, OUT, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + i, tl.load(X + i, mask=i < n), mask=i < n)


@triton_kernel
def heuristic(x: In, out: Out):
    _heuristic[(4,)](x, out, x.numel())


def golden_same(t):
    t["out"].copy_(t["x"])


def golden_rounded(t):
    t["out"].copy_(t["x"].bfloat16().float())


def golden_twice(t):
    t["out"].copy_(2.0 * t["x"])


SPECS = [TensorSpec("x", (N,), torch.float32, torch.randn), TensorSpec("out", (N,), torch.float32)]
CASES = [
    Case("reads_past_end", SPECS, kernel=reads_past_end, golden=golden_same, rtol=0.0, atol=0.0),
    Case("reads_within", SPECS, kernel=reads_within, golden=golden_same, rtol=0.0, atol=0.0),
    Case("rounds_through_bf16", SPECS, kernel=rounds_through_bf16, golden=golden_rounded, rtol=0.0, atol=0.0),
    Case("autotuned", SPECS, kernel=autotuned, golden=golden_twice, rtol=0.0, atol=0.0),
    Case("other_block", SPECS, kernel=reads_within, golden=golden_same, rtol=0.0, atol=0.0, options={"BLOCK": 64}),
    Case("unknown_option", SPECS, kernel=reads_within, golden=golden_same, options={"TILE": 64}),
    Case("heuristic", SPECS, kernel=heuristic, golden=golden_same),
    Case("none_default", SPECS, kernel=none_default, golden=golden_same, rtol=0.0, atol=0.0),
    Case("scale_given", SPECS, kernel=none_default, golden=golden_twice, rtol=0.0, atol=0.0, options={"SCALE": 2.0}),
    Case("returns_its_output", SPECS, kernel=returns_its_output, golden=golden_same),
]
'''

# As Triton's tutorials begin: the device asked of Triton's driver as the module is imported
QUERIES = """
from golden_tasks.triton import triton

DEVICE = triton.runtime.driver.active.get_active_torch_device()
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("triton"), MODULES)
    (proj.path / "kernels" / "triton_own.py").write_text(OWN)
    (proj.path / "kernels" / "triton_queries.py").write_text(QUERIES)
    return proj


def _rows(report: dict) -> dict:
    return {c["case"]: c for c in report["cases"]}


def _run(proj: Project, *cases) -> tuple:
    code, results, _, err = proj.doit("-n", "2", "--continue", *[f"verify:{c}" for c in cases])
    return code, results, _rows(json.loads((proj.path / "runs" / "report.json").read_text())), err


@pytest.mark.e2e
def test_the_library_triton_cases_pass_under_the_interpreter_and_bfloat16_ones_are_skipped(project):
    code, _, rows, err = _run(project, *FAITHFUL, *BF16)
    assert code == 0, err
    for case in FAITHFUL:
        row = rows[case]
        assert row["status"] == "PASS", (case, row)
        # timed, but the time is the interpreter's: said so, and no speedup is drawn from it
        assert row["kernel_us"] and row["speedup"] is None and row["kernel_timing"]["rounds"] == 4
        assert any("not a performance figure" in w for w in row["warnings"])
    for case in BF16:
        assert rows[case]["status"] == "SKIPPED" and "bfloat16" in rows[case]["skipped"], rows[case]
        assert rows[case]["stages"]["dispatch"] == "skipped"


@pytest.mark.e2e
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_of_a_triton_kernel_fails_validation(project, mutant):
    module, edits, case = MUTANTS[mutant]
    for line, bug in edits:
        project.edit(module, line, bug)
    try:
        code, results, _, err = project.doit(f"verify:{case}")
    finally:
        project.restore(module)
    assert code != 0
    assert results[f"dispatch:{case}"] in ("success", "up-to-date"), err  # it ran: a crash says nothing
    assert results[f"validate:{case}"] == "fail", f"{mutant} survived {case}"


@pytest.mark.e2e
def test_reads_past_an_input_poison_the_output_and_the_rules_of_the_interpreter_hold(project):
    """The interpreter checks no bounds: an input sits between NaN guards, so a read past its end (masked
    by `i < n` where `i + 1 < n` is meant) fails, where the honest control passes. A float32 kernel that
    rounds through bfloat16 inside is SKIPPED, by what it computes, not by its arguments' dtypes. An
    autotuned kernel runs pinned to its first configuration (triton.heuristics is refused); meta-parameters come
    from the options."""
    code, _, rows, err = _run(project, "reads_past_end", "reads_within", "rounds_through_bf16", "autotuned",
                              "other_block", "unknown_option", "heuristic")
    assert code != 0
    attack = rows["reads_past_end"]
    assert attack["status"] == "FAIL" and attack["stages"]["validate"] == "FAILED", attack
    # what the NaN means is said, and the max err counts it: the largest error over the rest is 0
    assert "a read past an input's end (a load whose mask lets an index through) is a likely cause" in \
        attack["errors"]["validate"]
    assert attack["nan"] >= 1 and attack["max_abs"] == 0.0
    assert rows["reads_within"]["status"] == "PASS" and rows["other_block"]["status"] == "PASS"
    skipped = rows["rounds_through_bf16"]
    assert skipped["status"] == "SKIPPED" and "_rounded uses bfloat16 (triton_own.py:" in skipped["skipped"]
    assert rows["autotuned"]["status"] == "PASS"
    (launch,) = [json.loads((project.cache / "objects" / e["objects"]["launch.json"]["digest"][:2]
                             / e["objects"]["launch.json"]["digest"]).read_text())
                 for e in project.entries("compile") if e["case"] == "autotuned"]
    assert launch["pinned"] == {"_tuned": {"BLOCK": 16, "num_warps": 2, "num_ctas": 1, "num_stages": 3}}
    assert rows["autotuned"]["config"] == {"pinned": launch["pinned"]}  # the report says what was timed
    bad = rows["unknown_option"]
    assert bad["stages"]["compile"] == "FAILED" and "option 'TILE' is not one of its meta-parameters (BLOCK" in \
        bad["errors"]["compile"]
    assert "only triton.jit and triton.autotune are supported" in rows["heuristic"]["errors"]["compile"]
    # the options enter the compile key: the same launcher at another BLOCK is another artifact
    keys = {e["case"]: e["key"] for e in project.entries("compile")}
    assert keys["other_block"] != keys["reads_within"]


@pytest.mark.e2e
def test_what_a_port_of_tritons_tutorials_meets_is_accepted_or_explained(project):
    """A None meta-parameter (Triton's constexprs take it) is a meta-parameter like any other; a launcher that
    returns its output leaves its Out unwritten, and the failure says that it returned a new tensor; a module
    that asks Triton's driver for the device as it is imported fails its plan saying that the interpreter has
    no driver, and what to write instead."""
    code, _, rows, err = _run(project, "none_default", "scale_given", "returns_its_output", "triton_queries")
    assert code != 0
    assert rows["none_default"]["status"] == rows["scale_given"]["status"] == "PASS", err
    returned = rows["returns_its_output"]
    assert returned["status"] == "FAIL" and returned["unwritten"] == 100, returned
    assert returned["reason"].startswith("validate: validation FAILED for returns_its_output: output 'out': 100 of "
                                         "100 elements not written (first at (0,)): the kernel returned a new float32 "
                                         "tensor of shape (100,): an Out is written in place, never returned")
    queried = rows["triton_queries"]
    assert queried["status"] == "FAIL" and "0 active drivers" in queried["reason"], queried
    assert "Triton's interpreter (no GPU here) has no driver to ask" in queried["reason"]
    assert "golden_tasks.triton.DEVICE" in queried["reason"]


@pytest.mark.e2e
def test_editing_a_jitted_helper_reruns_exactly_the_stages_it_can_affect(project):
    """rms_norm_triton's _sum_of_squares, a helper its kernel calls: compile, dispatch, validate and bench run
    again (the sum now differs in its last bits); the inputs and goldens, which no kernel code reaches, are
    reused."""
    _run(project, "rms_norm_triton")  # made here, or by an earlier test
    code, _, rows, err = _run(project, "rms_norm_triton")
    assert code == 0 and all(s == "cached" for s in rows["rms_norm_triton"]["stages"].values()), err
    project.edit("triton_kernels", "acc += x * x", "acc += x * x * 1.0000001")
    try:
        code, _, rows, err = _run(project, "rms_norm_triton")
    finally:
        project.restore("triton_kernels")
    stages = rows["rms_norm_triton"]["stages"]
    assert code == 0, err
    assert {s for s, state in stages.items() if state == "ran"} == {"compile", "dispatch", "validate", "bench"}
    assert all(stages[s] == "cached" for s in ("abi", "inputs", "golden", "inputs2", "golden2", "golden_bench"))


@pytest.mark.e2e
def test_without_the_triton_extra_the_cases_are_skipped_never_passed(tmp_path):
    """A Python where triton cannot be imported (every process of the run: a sitecustomize on PYTHONPATH):
    the kernel module still imports (golden_tasks.triton's stand-ins) and its cases are SKIPPED, saying why."""
    hidden = tmp_path / "no-triton"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['triton'] = None  # as if not installed\n")
    proj = Project(tmp_path / "p", ("triton_kernels", "gemm", "rms_norm", "softmax"))
    code, _, _, err = proj.doit("verify:rms_norm_triton", "verify:matmul_triton", env={"PYTHONPATH": str(hidden)})
    rows = _rows(json.loads((proj.path / "runs" / "report.json").read_text()))
    assert code == 0, err
    for row in rows.values():
        assert row["status"] == "SKIPPED" and "triton is not installed" in row["skipped"], row


def test_the_interpreter_gets_a_bfloat16_dot_wrong_silently_which_is_why_such_cases_skip(tmp_path):
    """The hazard the SKIPPED rule guards against, measured: the library's matmul under the interpreter on
    bfloat16 tensors raises nothing and returns garbage, where float32 is right."""
    script = f"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {str(Project(tmp_path / "p", ("triton_kernels", "gemm", "rms_norm", "softmax")).path)!r})
import torch
from kernels.triton_kernels import matmul_triton
for dtype in (torch.float32, torch.bfloat16):
    torch.manual_seed(0)
    a, b = torch.randn(64, 64, dtype=dtype), torch.randn(64, 64, dtype=dtype)
    c = torch.empty(64, 64, dtype=dtype)
    matmul_triton(a, b, c)
    print((c.double() - a.double() @ b.double()).abs().max().item())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    f32, bf16 = map(float, out.stdout.split())
    assert f32 < 1e-4 and not bf16 < 1.0, out.stdout


def test_what_the_interpreter_cannot_be_trusted_with_is_found_in_the_source_it_reaches():
    """bfloat16 and libdevice are found in the @triton.jit functions a launcher reaches, through helpers,
    but not in comments; a launcher with neither and float32 arguments is trusted."""
    assert triton_form.unfaithful(_launches_clean, []) == []
    assert triton_form.unfaithful(_launches_libdevice, []) == [
        f"_uses_libdevice uses libdevice (test_triton.py:{_uses_libdevice.fn.__code__.co_firstlineno + 4})"]


from golden_tasks.triton import tl, triton  # noqa: E402


@triton.jit
def _uses_libdevice(X):
    # bfloat16 in a comment is not code
    x = tl.load(X)
    tl.store(X, tl.extra.libdevice.exp(x))


def _launches_libdevice(x):
    _uses_libdevice[(1,)](x)


@triton.jit
def _clean(X):
    # what it does not do: bfloat16, libdevice
    tl.store(X, 2.0 * tl.load(X))


def _launches_clean(x):
    _clean[(1,)](x)
