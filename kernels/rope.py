"""rope: rotary embedding on interleaved pairs (x[..., 0::2], x[..., 1::2]) of each head.

For pair i of token t: (x0, x1) -> (x0·cos - x1·sin, x0·sin + x1·cos), with
cos/sin = cos/sin(t · BASE^(-i/(head_dim/2))) given as (tokens, head_dim/2) tables.
"""
import functools

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit

TOKENS, HEADS, HEAD_DIM = 32, 4, 48
BASE = 10000.0


def _angles():
    """Rotation angles from token positions, in float64 so both tables agree."""
    pos = torch.arange(TOKENS, dtype=torch.float64)[:, None]
    inv_freq = BASE ** (-torch.arange(HEAD_DIM // 2, dtype=torch.float64) / (HEAD_DIM // 2))
    return pos * inv_freq


def cos_table():
    return _angles().cos()


def sin_table():
    return _angles().sin()


@jit
def rope(x: In, cos: In, sin: In, out: Out):
    """Rotates each (even, odd) pair with real arithmetic on an (..., pairs, 2) view, in float32."""
    tokens, heads, dim = x.shape
    pairs = x.float().reshape(tokens, heads, dim // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    # Tables are per token; broadcast them over heads.
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    rotated = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    out.copy_(rotated.reshape(tokens, heads, dim).to(out.dtype))


def rope_torch(x: In, cos: In, sin: In, out: Out):
    """Baseline: the rotation as torch's complex product (in float32: torch has no bfloat16 complex)."""
    tokens, heads, dim = x.shape
    z = torch.view_as_complex(x.float().reshape(tokens, heads, dim // 2, 2))
    rotation = torch.complex(cos.float(), sin.float())[:, None, :]
    out.copy_(torch.view_as_real(z * rotation).reshape(tokens, heads, dim))


# what the kernel is compared with: torch's complex product, eager and compiled by AOTInductor (torch.compile's
# compiler)
BASELINES = {"torch": rope_torch, "inductor": jit(rope_torch)}


def golden_rope(t):
    """Reference: each pair as a complex number times cos + i·sin, in float64."""
    x = t["x"].double()
    tokens, heads, dim = x.shape
    z = torch.view_as_complex(x.reshape(tokens, heads, dim // 2, 2).contiguous())
    rot = torch.complex(t["cos"].double(), t["sin"].double())[:, None, :]
    t["out"].copy_(torch.view_as_real(z * rot).reshape(tokens, heads, dim))


def specs(dtype):
    return [
        TensorSpec("x", (TOKENS, HEADS, HEAD_DIM), dtype, init_value=torch.randn),
        TensorSpec("cos", (TOKENS, HEAD_DIM // 2), dtype, init_value=cos_table),
        TensorSpec("sin", (TOKENS, HEAD_DIM // 2), dtype, init_value=sin_table),
        TensorSpec("out", (TOKENS, HEADS, HEAD_DIM), dtype),
    ]


CASES = [
    # Two fp32 products and a sum that can cancel: absolute error ≲ 1.5 ulp of |x| ≲ 5, i.e. < 1e-6.
    Case("rope", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-6, baselines=BASELINES),
    # bf16 output: both sides round the same value, 1 ulp = 2^-7 relative, plus the fp32 absolute error.
    Case("rope_bf16", specs=functools.partial(specs, torch.bfloat16), rtol=2**-7, atol=1e-6, baselines=BASELINES),
]
