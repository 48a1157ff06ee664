"""softmax: out = exp(x - max) / sum(exp(x - max)) over the last dim."""
import functools

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit

ROWS, COLS = 48, 200
TILE = 64  # 200 = 3·64 + 8: the last column tile is a tail


def _online_step(state, tile):
    """Fold one tile into the running (max, sum); the old sum is rescaled to the new max."""
    run_max, run_sum = state
    new_max = torch.maximum(run_max, tile.amax(-1, keepdim=True))
    return new_max, run_sum * torch.exp(run_max - new_max) + torch.exp(tile - new_max).sum(-1, keepdim=True)


@jit
def softmax(x: In, out: Out):
    """Online softmax: one pass over column tiles for (max, sum), one pass writing each output tile."""
    cols = x.shape[-1]
    tiles = [(s, x[:, s:s + TILE].float()) for s in range(0, cols, TILE)]
    first = tiles[0][1]
    first_max = first.amax(-1, keepdim=True)
    state = (first_max, torch.exp(first - first_max).sum(-1, keepdim=True))
    row_max, row_sum = functools.reduce(_online_step, (tile for _, tile in tiles[1:]), state)
    inv_sum = row_sum.reciprocal()
    for s, tile in tiles:
        out[:, s:s + TILE].copy_((torch.exp(tile - row_max) * inv_sum).to(out.dtype))


def softmax_torch(x: In, out: Out):
    """Baseline: torch's softmax at the kernel's dtype."""
    out.copy_(torch.softmax(x, dim=-1))


# what the kernel is compared with: torch's softmax, eager and compiled by AOTInductor (torch.compile's compiler)
BASELINES = {"torch": softmax_torch, "inductor": jit(softmax_torch)}


def golden_softmax(t):
    """Reference: max-subtracted softmax in float64."""
    x = t["x"].double()
    e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
    t["out"].copy_(e / e.sum(dim=-1, keepdim=True))


def specs(dtype):
    return [
        TensorSpec("x", (ROWS, COLS), dtype, init_value=torch.randn),
        TensorSpec("out", (ROWS, COLS), dtype),
    ]


CASES = [
    # All terms positive, quotient of products: relative error of a few fp32 ulp (x - max rounds, |x - max| ≲ 10).
    Case("softmax", specs=functools.partial(specs, torch.float32), rtol=1e-5, atol=1e-8, baselines=BASELINES),
    # bf16 output: both sides round the same value, at most 1 ulp = 2^-7 relative.
    Case("softmax_bf16", specs=functools.partial(specs, torch.bfloat16), rtol=2**-7, atol=1e-8, baselines=BASELINES),
]
