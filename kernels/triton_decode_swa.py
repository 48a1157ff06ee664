"""decode_swa as a Triton kernel, verified against the flagship's golden (kernels/decode_attention.py).

A program per token: its query heads against the WIN rows of its sliding window, gathered from the
paged cache by physical row (-1 and rows past the token's window length masked), softmax with the
head's attention sink, probabilities rounded to the cache's dtype before they weight the rows (the
flagship's bf16 probabilities), output rounded, inverse RoPE on the interleaved rope pairs of the last
ROPE dims, packed by head group. The window is one tile (WIN == the attention tile), so the softmax
needs no rescaling across tiles.

decode_swa_triton is the flagship's bf16 step: SKIPPED under Triton's interpreter (no GPU), run on a
GPU. decode_swa_triton_f32 is the same step in float32, which the interpreter computes faithfully.
"""
import dataclasses
import functools

import torch

from golden_tasks import Case, In, Out, triton_kernel
from golden_tasks.compare import Allclose
from golden_tasks.triton import tl, triton
from kernels._dsv4 import DIMS
from kernels.decode_attention import decode_swa, golden_decode_swa, swa_specs
from kernels.sparse_attention import ATTENTION_TOLERANCE


@triton.jit
def _weighted_rows(P, base, rows, valid, cols, limit, HEAD_DIM: tl.constexpr):
    """P [heads, WIN] times columns `cols` (those < limit) of the window's cache rows at `base`: [heads, cols]."""
    k = tl.load(base + rows[:, None] * HEAD_DIM + cols[None, :], mask=valid[:, None] & (cols[None, :] < limit),
                other=0.0).to(tl.float32)
    return tl.dot(P, k, input_precision="ieee")


@triton.jit
def _decode_swa_token(Q, ORI_KV, SWA_INDICES, SWA_LENS, SINK, COS, SIN, O_PACKED,
                      kv_rows, q_t, q_h, idx_t, cos_t, o_g, o_t, heads, heads_per_group, sm_scale,
                      HEAD_DIM: tl.constexpr, ROPE: tl.constexpr, WIN: tl.constexpr, BLOCK_H: tl.constexpr,
                      HALF: tl.constexpr):
    t = tl.program_id(0)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HEAD_DIM)
    j = tl.arange(0, WIN)
    live = h < heads
    q = tl.load(Q + t * q_t + h[:, None] * q_h + d[None, :], mask=live[:, None], other=0.0).to(tl.float32)
    rows = tl.load(SWA_INDICES + t * idx_t + j)
    valid = (rows >= 0) & (rows < kv_rows) & (j < tl.load(SWA_LENS + t))
    rows = tl.where(valid, rows, 0)
    k = tl.load(ORI_KV + rows[:, None] * HEAD_DIM + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
    s = tl.where(valid[None, :], s, -1e20)
    m = tl.max(s, axis=1)
    p = tl.where(valid[None, :], tl.exp(s - m[:, None]), 0.0)
    # the probabilities in the cache's dtype (the flagship's bf16), accumulated in float32
    weights = p.to(ORI_KV.dtype.element_ty).to(tl.float32)
    scale = 1.0 / (tl.sum(p, axis=1) + tl.exp(tl.load(SINK + h, mask=live, other=0.0) - m))
    scale = tl.where(tl.sum(valid.to(tl.int32), axis=0) > 0, scale, 0.0)  # no row at all: 0
    # the output as its packed row: head h in group h // heads_per_group, at (h % heads_per_group) * HEAD_DIM
    out = O_PACKED + (h // heads_per_group)[:, None] * o_g + t * o_t + (h % heads_per_group)[:, None] * HEAD_DIM
    nope = tl.arange(0, HEAD_DIM)
    o = _weighted_rows(weights, ORI_KV, rows, valid, nope, HEAD_DIM - ROPE, HEAD_DIM) * scale[:, None]
    tl.store(out + nope[None, :], o.to(O_PACKED.dtype.element_ty),
             mask=live[:, None] & (nope[None, :] < HEAD_DIM - ROPE))
    # the rope dims: pairs (2i, 2i+1) rotated back by the token's angle, from the rounded output
    i = tl.arange(0, HALF)
    pair = i < ROPE // 2
    even = HEAD_DIM - ROPE + 2 * i
    o_even = _weighted_rows(weights, ORI_KV + HEAD_DIM - ROPE, rows, valid, 2 * i, ROPE, HEAD_DIM)
    o_odd = _weighted_rows(weights, ORI_KV + HEAD_DIM - ROPE + 1, rows, valid, 2 * i, ROPE, HEAD_DIM)
    o_even = (o_even * scale[:, None]).to(O_PACKED.dtype.element_ty).to(tl.float32)
    o_odd = (o_odd * scale[:, None]).to(O_PACKED.dtype.element_ty).to(tl.float32)
    c = tl.load(COS + t * cos_t + i, mask=pair, other=0.0).to(tl.float32)[None, :]
    sn = tl.load(SIN + t * cos_t + i, mask=pair, other=0.0).to(tl.float32)[None, :]
    stored = live[:, None] & pair[None, :]
    tl.store(out + even[None, :], (o_even * c + o_odd * sn).to(O_PACKED.dtype.element_ty), mask=stored)
    tl.store(out + even[None, :] + 1, (o_odd * c - o_even * sn).to(O_PACKED.dtype.element_ty), mask=stored)


@triton_kernel
def decode_swa_triton(q: In, ori_kv: In, swa_indices: In, swa_lens: In, attn_sink: In, freqs_cos: In, freqs_sin: In,
                      o_packed: Out, *, num_warps: int = 4):
    tokens, heads, head_dim = q.shape
    groups, rope = o_packed.shape[0], freqs_cos.shape[1]
    _decode_swa_token[(tokens,)](
        q, ori_kv, swa_indices, swa_lens, attn_sink, freqs_cos, freqs_sin, o_packed,
        ori_kv.numel() // head_dim, q.stride(0), q.stride(1), swa_indices.stride(0), freqs_cos.stride(0),
        o_packed.stride(0), o_packed.stride(1), heads, heads // groups, head_dim ** -0.5,
        HEAD_DIM=head_dim, ROPE=rope, WIN=swa_indices.shape[1], BLOCK_H=max(16, triton.next_power_of_2(heads)),
        HALF=max(16, rope // 2), num_warps=num_warps)


def f32_specs(d, seed):
    """decode_swa's parameters with its bf16 tensors in float32 (what the interpreter computes faithfully)."""
    return [dataclasses.replace(s, dtype=torch.float32) if s.dtype == torch.bfloat16 else s
            for s in swa_specs(d, seed)]


# float32 throughout: the kernel's sums of HEAD_DIM products against the golden's float64 differ by a few
# fp32 ulp of the largest term (~1e-6 at unit scale); rows t >= T are NaN in both, ignored.
F32_TOLERANCE = Allclose(rtol=1e-4, atol=1e-5, ignore_nan=True)

# The bf16 step is compared with the flagship's body (plain torch) run eagerly. The float32 step has no baseline:
# that body rounds its probabilities to bfloat16, as the flagship does, which float32's tolerance does not allow.
CASES = [
    Case("decode_swa_triton", specs=functools.partial(swa_specs, DIMS, 0), kernel=decode_swa_triton,
         golden=golden_decode_swa, compare={"o_packed": ATTENTION_TOLERANCE}, baselines={"eager": decode_swa.fn}),
    Case("decode_swa_triton_f32", specs=functools.partial(f32_specs, DIMS, 0), kernel=decode_swa_triton,
         golden=golden_decode_swa, compare={"o_packed": F32_TOLERANCE}),
]
