"""DeepSeek-V4 sparse-attention cores: MQA over a gathered list of KV rows, with an attention sink.

Every query head attends over the same list of K rows (one 512-wide KV head,
V = K). The kernels run a tiled online softmax: per tile of WIN columns the
probabilities are rounded to bf16 against the tile's max and multiplied with
bf16 K in fp32, tiles merge by rescaling. The goldens are the reference's
naive full softmax per token in float64. Helpers here are shared with the
decode kernels (kernels/decode_attention.py).

Cases: `sparse_attn` (decode core: paged rows, inverse RoPE, grouped output
packing) and `sparse_attn_prefill` (contiguous rows, causal windows plus
compressed rows, plain output).
"""
import functools

import torch

from golden_tasks import Case, In, Out, error_distribution, jit, ratio_allclose
from kernels._dsv4 import DIMS, ROUNDINGS_KEPT, rope_table, scenario, spec

# --- kernel side


def gather(pool: torch.Tensor, rows: torch.Tensor):
    """(rows of `pool` viewed as [N, D], valid): rows < 0 or >= N are invalid (and read row 0)."""
    flat = pool.reshape(-1, pool.shape[-1])
    valid = (rows >= 0) & (rows < flat.shape[0])
    return flat[torch.where(valid, rows, 0).long()], valid


def attend(q, keys, valid, sink, tile):
    """Tiled online-softmax MQA with a sink: q [T,H,D] bf16, keys [T,K,D] bf16, valid [T,K] -> o [T,H,D] fp32.

    A token with no valid row outputs 0.
    """
    scale = q.shape[-1] ** -0.5
    qf = q.float()
    m = torch.full(q.shape[:2], float("-inf"))
    l = torch.zeros(q.shape[:2])
    o = torch.zeros(q.shape, dtype=torch.float32)
    for start in range(0, keys.shape[1], tile):
        k = keys[:, start:start + tile].float()
        mask = valid[:, None, start:start + tile]
        s = torch.einsum("thd,tkd->thk", qf, k) * scale
        s = torch.where(mask, s, -1e20)
        m_tile = s.amax(-1)
        p = torch.where(mask, torch.exp(s - m_tile[..., None]), 0.0)
        # bf16 probabilities against the tile's max, accumulated in fp32
        o_tile = torch.einsum("thk,tkd->thd", p.bfloat16().float(), k)
        m_new = torch.maximum(m, m_tile)
        old, new = torch.exp(m - m_new), torch.exp(m_tile - m_new)
        l = old * l + new * p.sum(-1)
        o = old[..., None] * o + new[..., None] * o_tile
        m = m_new
    o = o / (l + torch.exp(sink[None, :] - m))[..., None]
    return torch.where(valid.any(-1)[:, None, None], o, 0.0)


def rotate_pairs(x, cos, sin, inverse):
    """RoPE on interleaved pairs (2i, 2i+1) of x [T, ..., R] with tables [T, R] (first R/2 columns read)."""
    half = x.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    c, s = cos[:, :half].float().reshape(shape), sin[:, :half].float().reshape(shape)
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    if inverse:
        s = -s
    return torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)


def finish(o, cos, sin, o_packed):
    """bf16 output, inverse RoPE on the rope dims, packed: o_packed[g, t, hh*D + d] = o[t, g*H/G + hh, d]."""
    rope = cos.shape[-1]
    o = o.bfloat16()
    tail = rotate_pairs(o[..., -rope:], cos, sin, inverse=True).bfloat16()
    o = torch.cat([o[..., :-rope], tail], dim=-1)
    groups, tokens = o_packed.shape[0], o.shape[0]
    o_packed[:, :tokens].copy_(o.reshape(tokens, groups, -1).transpose(0, 1))


@jit(options=ROUNDINGS_KEPT)
def sparse_attn(q: In, ori_kv: In, indices: In, attn_sink: In, freqs_cos: In, freqs_sin: In, o_packed: Out):
    """Decode core: attention over the physical rows `indices` [T, K] of the paged cache (-1: none)."""
    keys, valid = gather(ori_kv, indices)
    o = attend(q, keys, valid, attn_sink, tile=DIMS.window)
    finish(o, freqs_cos, freqs_sin, o_packed)


@jit(options=ROUNDINGS_KEPT)
def sparse_attn_prefill(q: In, kv: In, indices: In, attn_sink: In, out: Out):
    """Prefill core: attention over rows `indices` [T, K] of a contiguous kv [N, D] (-1: none)."""
    keys, valid = gather(kv, indices)
    out.copy_(attend(q, keys, valid, attn_sink, tile=DIMS.window).to(out.dtype))


# --- golden side


def golden_attend(q, keys, valid, sink):
    """One token, naive: softmax over its valid rows plus the sink's logit, in float64. q [H,D], keys [K,D]."""
    k = keys[valid].double()
    if k.shape[0] == 0:
        return torch.zeros(q.shape, dtype=torch.float64)
    s = q.double() @ k.T * q.shape[-1] ** -0.5
    m = s.max(-1, keepdim=True).values
    e = torch.exp(s - m)
    return (e @ k) / (e.sum(-1, keepdim=True) + torch.exp(sink.double()[:, None] - m))


def golden_rope(x, cos, sin, inverse):
    """Interleaved RoPE of one token's rows x [..., R] in float64: e' = e*c -+ o*s, o' = o*c +- e*s."""
    half = x.shape[-1] // 2
    c, s = cos[:half].double(), sin[:half].double()
    if inverse:
        s = -s
    out = x.double().clone()
    out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
    out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
    return out


def golden_finish(t: int, o, cos, sin, o_packed):
    """Token t's output o [H, D]: inverse RoPE on the rope dims, bf16, into its packed row."""
    rope = cos.shape[-1]
    o = o.clone()
    o[:, -rope:] = golden_rope(o[:, -rope:], cos[t], sin[t], inverse=True)
    groups = o_packed.shape[0]
    o_packed[:, t] = o.reshape(groups, -1).to(o_packed.dtype)


def physical_rows(pool, rows):
    """Rows of a paged cache listed by physical index; -1 and out-of-range rows are invalid."""
    flat = pool.reshape(-1, pool.shape[-1])
    valid = (rows >= 0) & (rows < flat.shape[0])
    return flat[rows.clamp(0, flat.shape[0] - 1).long()], valid


def golden_sparse_attn(t):
    keys, valid = physical_rows(t["ori_kv"], t["indices"])
    for i in range(t["q"].shape[0]):
        o = golden_attend(t["q"][i], keys[i], valid[i], t["attn_sink"])
        golden_finish(i, o, t["freqs_cos"], t["freqs_sin"], t["o_packed"])


def golden_sparse_attn_prefill(t):
    keys, valid = physical_rows(t["kv"], t["indices"])
    for i in range(t["q"].shape[0]):
        t["out"][i] = golden_attend(t["q"][i], keys[i], valid[i], t["attn_sink"]).to(t["out"].dtype)


# --- cases

def decode_core_indices(d, seed):
    """Each token's window rows, then two tiles of rows drawn from the whole pool with -1 holes."""
    sc = scenario(d, d.hca_ratio, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    extra = torch.randint(0, sc.kv_pool * d.block, (d.tokens, 2 * d.window), generator=gen, dtype=torch.int32)
    extra[torch.rand(extra.shape, generator=gen) < 0.25] = -1
    return torch.cat([sc.window_rows(), extra], dim=1)


def attention_specs(d, sc):
    """q, attn_sink, the rope tables and o_packed of scenario `sc`: what every decode entry shares."""
    return {
        "q": spec("q", (d.tokens, d.heads, d.head_dim), torch.bfloat16, torch.randn),
        "attn_sink": spec("attn_sink", (d.heads,), torch.float32, torch.randn),
        "freqs_cos": spec("freqs_cos", (d.tokens, d.rope), torch.bfloat16, rope_table(sc.positions, d.rope, torch.cos)),
        "freqs_sin": spec("freqs_sin", (d.tokens, d.rope), torch.bfloat16, rope_table(sc.positions, d.rope, torch.sin)),
        # rows t >= T are undefined: NaN in the golden's copy, ignored by the comparison
        "o_packed": spec("o_packed", (d.o_groups, d.tokens_padded, d.heads // d.o_groups * d.head_dim),
                         torch.bfloat16, float("nan")),
    }


def sparse_attn_specs(d, seed):
    sc = scenario(d, d.hca_ratio, seed)
    shared = attention_specs(d, sc)
    return [shared["q"], spec("ori_kv", (sc.kv_pool, d.block, 1, d.head_dim), torch.bfloat16, torch.randn),
            spec("indices", (d.tokens, 3 * d.window), torch.int32, decode_core_indices(d, seed)),
            shared["attn_sink"], shared["freqs_cos"], shared["freqs_sin"], shared["o_packed"]]


def prefill_indices(d, seed):
    """Per request of P tokens: the causal window, then the request's visible compressed rows (newest first)."""
    p, r = d.prefill_tokens, d.csa_ratio
    tokens = d.batch * p
    cmp_base = tokens  # compressed rows follow the token rows in kv
    indices = torch.full((tokens, 3 * d.window), -1, dtype=torch.int32)
    for b in range(d.batch):
        for pos in range(p):
            window = torch.arange(max(0, pos - d.window + 1), pos + 1) + b * p
            visible = torch.arange((pos + 1) // r - 1, -1, -1)[:2 * d.window] + cmp_base + b * (p // r)
            indices[b * p + pos, :window.numel()] = window
            indices[b * p + pos, d.window:d.window + visible.numel()] = visible
    return indices


def prefill_specs(d, seed):
    tokens = d.batch * d.prefill_tokens
    rows = tokens + d.batch * (d.prefill_tokens // d.csa_ratio)
    return [spec("q", (tokens, d.heads, d.head_dim), torch.bfloat16, torch.randn),
            spec("kv", (rows, d.head_dim), torch.bfloat16, torch.randn),
            spec("indices", (tokens, 3 * d.window), torch.int32, prefill_indices(d, seed)),
            spec("attn_sink", (d.heads,), torch.float32, torch.randn),
            spec("out", (tokens, d.heads, d.head_dim), torch.bfloat16)]


# Numerical contract (bf16 probabilities against the tile max, fp32 accumulation, bf16 output).
# The kernel rounds each probability to bf16 (relative error <= 2^-9) where the golden's are
# exact; the errors need not cancel in the weighted sum, so the output may be off by up to
# 2^-9 x the weighted mean |v|, below 2^-9 for these unit-scale V rows except in the tail.
# Both sides then round to bf16: one step (2^-8 relative) either way. Hence atol 2^-9,
# rtol 2^-7, and max_error_ratio for the tail where the per-probability errors line up.
# (The reference's atol 1e-4 presumes a golden with the same tiles; ours is the full softmax.)
# The report also carries the error distribution (rel-L2, cosine, percentiles) of every run.
ATTENTION_TOLERANCE = error_distribution(
    judge=ratio_allclose(atol=2 ** -9, rtol=2 ** -7, max_error_ratio=0.005, ignore_nan=True))

CASES = [
    Case("sparse_attn", specs=functools.partial(sparse_attn_specs, DIMS, 0), kernel=sparse_attn,
         golden=golden_sparse_attn, compare={"o_packed": ATTENTION_TOLERANCE},
         baselines={"eager": sparse_attn.fn}),  # its body run eagerly: plain torch at its dtypes
    Case("sparse_attn_prefill", specs=functools.partial(prefill_specs, DIMS, 0), kernel=sparse_attn_prefill,
         golden=golden_sparse_attn_prefill, compare={"out": ATTENTION_TOLERANCE},
         baselines={"eager": sparse_attn_prefill.fn}),
]
