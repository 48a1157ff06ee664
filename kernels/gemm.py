"""gemm: c = a @ b for a (M, K) and b (K, N)."""
import functools

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit

M, K, N = 64, 96, 80
K_TILE = 40  # 96 = 2·40 + 16: the last K tile is a tail


@jit
def gemm(a: In, b: In, c: Out):
    """Blocked over K: each K tile's product is added into a float32 accumulator."""
    k = a.shape[1]
    af, bf = a.float(), b.float()
    acc = af[:, :K_TILE] @ bf[:K_TILE]
    for s in range(K_TILE, k, K_TILE):
        acc = torch.addmm(acc, af[:, s:s + K_TILE], bf[s:s + K_TILE])
    c.copy_(acc.to(c.dtype))


def gemm_torch(a: In, b: In, c: Out):
    """Baseline: torch's matmul at the kernel's dtype, into the output."""
    torch.mm(a, b, out=c)


# what the kernel is compared with: torch's matmul, eager and compiled by AOTInductor (torch.compile's compiler)
BASELINES = {"torch": gemm_torch, "inductor": jit(gemm_torch)}


def golden_gemm(t):
    """Reference: one float64 matmul."""
    t["c"].copy_(t["a"].double() @ t["b"].double())


def specs(dtype, m=M):
    return [
        TensorSpec("a", (m, K), dtype, init_value=torch.randn),
        TensorSpec("b", (K, N), dtype, init_value=torch.randn),
        TensorSpec("c", (m, N), dtype),
    ]


CASES = [
    # fp32 dot products of K=96 in another order; sums cancel, so the error is absolute:
    # ~ sqrt(K)·u·Σ|a·b| ≈ 10 · 6e-8 · 60 ≈ 4e-5 (observed ≤ 1.2e-5).
    Case("gemm", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-4, baselines=BASELINES),
    # bf16 output: both sides round the same value, 1 ulp = 2^-7 relative, plus the fp32 absolute error.
    Case("gemm_bf16", specs=functools.partial(specs, torch.bfloat16), rtol=2**-7, atol=1e-4, baselines=BASELINES),
    # gemm across the rows a model's traffic gives it, one AOTInductor build per M (its point M-64 is gemm itself,
    # whose cached stages it shares), against torch's matmul
    Case("gemm_shapes", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-4,
         baselines={"torch": gemm_torch}, sweep={"m": [1, M, 256]}),
]
