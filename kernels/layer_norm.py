"""layer_norm: out = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased var)."""
import functools

import torch
import torch.nn.functional as F

from golden_tasks import Case, In, Out, Scalar, ScalarSpec, TensorSpec, jit

ROWS, COLS = 48, 200
TILE = 64  # 200 = 3·64 + 8: the last column tile is a tail


def _tile_stats(tile):
    """(count, mean, M2) of one float32 column tile, per row."""
    mean = tile.mean(-1, keepdim=True)
    return tile.shape[-1], mean, (tile - mean).square().sum(-1, keepdim=True)


def _merge(a, b):
    """Chan's parallel merge of two (count, mean, M2) partials: no E[x²]-E[x]² cancellation."""
    (na, mean_a, m2_a), (nb, mean_b, m2_b) = a, b
    n = na + nb
    delta = mean_b - mean_a
    return n, mean_a + delta * (nb / n), m2_a + m2_b + delta.square() * (na * nb / n)


@jit
def layer_norm(x: In, weight: In, bias: In, eps: Scalar, out: Out):
    """Row layer norm; mean/variance are merged from per-tile float32 statistics in one pass over x."""
    xf = x.float()
    cols = x.shape[-1]
    _, mean, m2 = functools.reduce(_merge, (_tile_stats(xf[:, s:s + TILE]) for s in range(0, cols, TILE)))
    inv_std = torch.rsqrt(m2 / cols + eps)
    out.copy_(((xf - mean) * inv_std * weight.float() + bias.float()).to(out.dtype))


def layer_norm_torch(x: In, weight: In, bias: In, eps: Scalar, out: Out):
    """Baseline: torch's layer norm at the kernel's dtype."""
    out.copy_(F.layer_norm(x, (x.shape[-1],), weight, bias, eps))


# what the kernel is compared with: torch's layer norm, eager and compiled by AOTInductor (torch.compile's compiler)
BASELINES = {"torch": layer_norm_torch, "inductor": jit(layer_norm_torch)}


def golden_layer_norm(t):
    """Reference: two-pass mean and biased variance in float64."""
    x = t["x"].double()
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    t["out"].copy_((x - mean) / torch.sqrt(var + t["eps"]) * t["weight"].double() + t["bias"].double())


def specs(dtype):
    return [
        TensorSpec("x", (ROWS, COLS), dtype, init_value=torch.randn),
        TensorSpec("weight", (COLS,), dtype, init_value=torch.randn),
        TensorSpec("bias", (COLS,), dtype, init_value=torch.randn),
        ScalarSpec("eps", torch.float32, 1e-5),
        TensorSpec("out", (ROWS, COLS), dtype),
    ]


CASES = [
    # fp32 stats in another order; "+ bias" can cancel, so the error is absolute: a few ulp of |x̂·w|+|b| ≲ 16.
    Case("layer_norm", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-5, baselines=BASELINES),
    # bf16 output: both sides round the same value, 1 ulp = 2^-7 relative, plus the fp32 absolute error.
    Case("layer_norm_bf16", specs=functools.partial(specs, torch.bfloat16), rtol=2**-7, atol=1e-5, baselines=BASELINES),
]
