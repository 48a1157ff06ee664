"""rms_norm: out = x / sqrt(mean(x², last dim) + eps) * weight, per row."""
import functools

import torch
import torch.nn.functional as F

from golden_tasks import Case, In, Out, Scalar, ScalarSpec, TensorSpec, jit

ROWS, COLS = 64, 300
TILE = 128  # COLS is not a multiple of TILE: the last column tile is a 44-wide tail


@jit
def rms_norm(x: In, weight: In, eps: Scalar, out: Out):
    """Row RMS norm; the sum of squares accumulates in float32 over column tiles."""
    cols = x.shape[-1]
    # Per-tile partial sums in float32, so bf16 inputs never accumulate in bf16.
    sum_sq = sum(x[:, s:s + TILE].float().square().sum(-1, keepdim=True) for s in range(0, cols, TILE))
    inv_rms = torch.rsqrt(sum_sq / cols + eps)
    out.copy_((x.float() * inv_rms * weight.float()).to(out.dtype))


def rms_norm_torch(x: In, weight: In, eps: Scalar, out: Out):
    """Baseline: torch's RMS norm at the kernel's dtype."""
    out.copy_(F.rms_norm(x, (x.shape[-1],), weight, eps))


# what the kernel is compared with: torch's RMS norm, eager and compiled by AOTInductor (torch.compile's compiler)
BASELINES = {"torch": rms_norm_torch, "inductor": jit(rms_norm_torch)}


def golden_rms_norm(t):
    """Reference: the textbook formula in float64."""
    x = t["x"].double()
    rms = torch.sqrt((x * x).mean(dim=-1, keepdim=True) + t["eps"])
    t["out"].copy_(x / rms * t["weight"].double())


def specs(dtype):
    return [
        TensorSpec("x", (ROWS, COLS), dtype, init_value=torch.randn),
        TensorSpec("weight", (COLS,), dtype, init_value=torch.randn),
        ScalarSpec("eps", torch.float32, 1e-6),
        TensorSpec("out", (ROWS, COLS), dtype),
    ]


CASES = [
    # fp32 reduction in another order, then only products: the error stays relative, a few ulp: rtol=1e-5.
    Case("rms_norm", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-6, baselines=BASELINES),
    # Both sides round (nearly) the same value to bf16: at most 1 ulp = 2^-7 relative.
    Case("rms_norm_bf16", specs=functools.partial(specs, torch.bfloat16), rtol=2**-7, atol=1e-6, baselines=BASELINES),
]
