"""Triton kernels (the @triton_kernel form), verified against the goldens of rms_norm, softmax and gemm.

Each runs on a GPU, or under Triton's interpreter on CPU tensors where there is none; the bfloat16
cases are SKIPPED there (numpy, under the interpreter, has no bfloat16) and run on a GPU. Tiles are
smaller than the rows, so every kernel masks a tail tile.
"""
import functools

import torch

from golden_tasks import Case, In, Out, Scalar, triton_kernel
from golden_tasks.triton import tl, triton
from kernels import gemm, rms_norm, softmax


@triton.jit
def _sum_of_squares(X, n, TILE: tl.constexpr):
    """The sum of x² over a row of `n` elements at X, in float32, a tile at a time."""
    acc = tl.zeros([TILE], dtype=tl.float32)
    for start in range(0, n, TILE):
        cols = start + tl.arange(0, TILE)
        x = tl.load(X + cols, mask=cols < n, other=0.0).to(tl.float32)
        acc += x * x
    return tl.sum(acc, axis=0)


@triton.jit
def _rms_norm_row(X, W, OUT, n, row_stride, eps, TILE: tl.constexpr):
    row = X + tl.program_id(0) * row_stride
    out = OUT + tl.program_id(0) * row_stride
    inv_rms = 1.0 / tl.sqrt(_sum_of_squares(row, n, TILE) / n + eps)
    for start in range(0, n, TILE):
        cols = start + tl.arange(0, TILE)
        mask = cols < n
        x = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + cols, (x * inv_rms * w).to(OUT.dtype.element_ty), mask=mask)


@triton_kernel
def rms_norm_triton(x: In, weight: In, eps: Scalar, out: Out, *, TILE: int = 128, num_warps: int = 4):
    """A program per row; the sum of squares accumulates in float32 (a helper shared with nothing else)."""
    rows, n = x.shape
    _rms_norm_row[(rows,)](x, weight, out, n, x.stride(0), eps, TILE=TILE, num_warps=num_warps)


@triton.jit
def _softmax_row(X, OUT, n, row_stride, TILE: tl.constexpr):
    """Online softmax: one pass for each lane's running (max, sum), rescaled as its max grows, then one
    writing the outputs."""
    row = X + tl.program_id(0) * row_stride
    out = OUT + tl.program_id(0) * row_stride
    run_max = tl.full([TILE], -float("inf"), tl.float32)
    run_sum = tl.zeros([TILE], dtype=tl.float32)
    for start in range(0, n, TILE):
        cols = start + tl.arange(0, TILE)
        x = tl.load(row + cols, mask=cols < n, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        seen = new_max > -float("inf")  # a lane with nothing yet: exp(-inf - -inf) would be NaN
        run_sum = tl.where(seen, run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max), 0.0)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    row_sum = tl.sum(tl.where(run_max > -float("inf"), run_sum * tl.exp(run_max - row_max), 0.0), axis=0)
    for start in range(0, n, TILE):
        cols = start + tl.arange(0, TILE)
        mask = cols < n
        x = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out + cols, (tl.exp(x - row_max) / row_sum).to(OUT.dtype.element_ty), mask=mask)


@triton_kernel
def softmax_triton(x: In, out: Out, *, TILE: int = 64, num_warps: int = 4):
    rows, n = x.shape
    _softmax_row[(rows,)](x, out, n, x.stride(0), TILE=TILE, num_warps=num_warps)


@triton.jit
def _matmul_tile(A, B, C, M, N, K, a_m, a_k, b_k, b_n, c_m, c_n,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of C = A @ B, accumulated in float32 over K tiles with tl.dot."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        rk = start + tl.arange(0, BLOCK_K)
        a = tl.load(A + rm[:, None] * a_m + rk[None, :] * a_k, mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(B + rk[:, None] * b_k + rn[None, :] * b_n, mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")  # not TF32: the fp32 case's tolerance is fp32's
    tl.store(C + rm[:, None] * c_m + rn[None, :] * c_n, acc.to(C.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton_kernel
def matmul_triton(a: In, b: In, c: Out, *, BLOCK_M: int = 32, BLOCK_N: int = 32, BLOCK_K: int = 64,
                  num_warps: int = 4, num_stages: int = 2):
    (m, k), n = a.shape, b.shape[1]
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _matmul_tile[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                       BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=num_warps, num_stages=num_stages)


def _case(name, kernel, module, golden, dtype, tolerance, **options):
    """A case of `module`'s op, compared with torch's own (the module's "torch" baseline)."""
    return Case(name, specs=functools.partial(module.specs, dtype), kernel=kernel, golden=golden,
                options=options or None, baselines={"torch": module.BASELINES["torch"]}, **tolerance)


CASES = [
    # the tolerances of the cases whose goldens these are, for the same reasons (see their modules)
    _case("rms_norm_triton", rms_norm_triton, rms_norm, rms_norm.golden_rms_norm, torch.float32,
          {"rtol": 1e-5, "atol": 1e-6}),
    _case("rms_norm_triton_bf16", rms_norm_triton, rms_norm, rms_norm.golden_rms_norm, torch.bfloat16,
          {"rtol": 2**-7, "atol": 1e-6}),
    _case("softmax_triton", softmax_triton, softmax, softmax.golden_softmax, torch.float32,
          {"rtol": 1e-5, "atol": 1e-8}),
    _case("softmax_triton_bf16", softmax_triton, softmax, softmax.golden_softmax, torch.bfloat16,
          {"rtol": 2**-7, "atol": 1e-8}),
    _case("matmul_triton", matmul_triton, gemm, gemm.golden_gemm, torch.float32, {"rtol": 1e-5, "atol": 1e-4}),
    _case("matmul_triton_bf16", matmul_triton, gemm, gemm.golden_gemm, torch.bfloat16,
          {"rtol": 2**-7, "atol": 1e-4}),
]
