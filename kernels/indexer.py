"""DeepSeek-V4 CSA indexer: score every visible compressed row with int8 dot products, keep the top k.

q = (qr_i8 @ idx_wq_b) * qr_scale * wq_b_scale, per indexer head; forward RoPE
on its last ROPE dims (bf16); times an orthonormal Hadamard matrix; int8 per
(token, head) with scale 127 / max(amax, 1e-4). weights = (x @ weights_proj)
* dim^-0.5 * heads^-0.5. score[s, j] = kv_scale[j] * sum_h weights[s, h] *
relu(q_scale[s, h] * (q_i8[s, h] . k_i8[j])) over the indexer cache's int8
rows (paged like the compressed cache). visible = min(kv_seq_len // 4,
(pos + 1) // 4, cap); the output is the top min(TOPK, visible) logical slots
by descending score, ties to the older slot, padded with -1 (scores with
-FLT_MAX).

Where the int8 quantization rounds, kernel and golden must round the same
values, or a one-step flip moves the top-k: integer dot products are exact
(in fp32 below 2^24), the Hadamard product is taken in float64, where it is
exact, and the fp32 scalings are elementwise in the reference's order.
"""
import functools

import torch

from golden_tasks import Case, In, Out, jit, topk_pair_compare
from golden_tasks.compare import Allclose
from kernels._dsv4 import (
    DIMS,
    ROUNDINGS_KEPT,
    hadamard,
    positive,
    randn_scaled,
    random_int8,
    rope_table,
    scenario,
    spec,
    step_specs,
)
from kernels.sparse_attention import golden_rope, rotate_pairs

FLT_MAX = torch.finfo(torch.float32).max

# --- kernel side


def index_topk(x, cmp_table, qr_i8, qr_scale, idx_wq_b, wq_b_scale, weights_proj, hadamard, idx_kv, idx_kv_scale,
               positions, seq_lens, cos, sin, ratio, chunk, k, cap):
    """(logical slots [T, k] with -1 padding, their scores [T, k] with -FLT_MAX padding)."""
    tokens, dim = x.shape[0], hadamard.shape[0]
    heads = idx_wq_b.shape[1] // dim
    # int8 x int8 over q_lora <= 1040 terms: |sum| < 2^24, exact in fp32
    q = (qr_i8.float() @ idx_wq_b.float()) * qr_scale[:, None] * wq_b_scale[None, :]
    q = q.view(tokens, heads, dim).bfloat16()
    rope = cos.shape[-1]
    q = torch.cat([q[..., :-rope], rotate_pairs(q[..., -rope:], cos, sin, inverse=False).bfloat16()], dim=-1)
    q = q.double() @ hadamard.double()
    scale = 127.0 / q.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    q_i8 = torch.round(q * scale).float()
    q_scale = scale.reciprocal().float()
    weights = (x.float() @ weights_proj.float()) * (dim ** -0.5 * heads ** -0.5)

    block = idx_kv.shape[1]
    req = torch.arange(tokens) // chunk
    j = torch.arange(cmp_table.shape[1] * block)
    page = cmp_table[req][:, j // block].long()
    rows = torch.where(page >= 0, page * block + j % block, 0)
    keys = idx_kv.reshape(-1, dim)[rows].float()
    dots = torch.einsum("thd,tjd->thj", q_i8, keys)  # |q.k| <= 127^2 * dim < 2^24: exact
    score = idx_kv_scale.reshape(-1)[rows] * (weights[..., None] * torch.relu(q_scale * dots)).sum(1)
    pos = positions.reshape(-1).long()
    visible = torch.minimum(torch.minimum(seq_lens[req].long() // ratio, (pos + 1) // ratio),
                            torch.tensor(cap))
    valid = (j[None, :] < visible[:, None]) & (page >= 0)
    # a stable sort: equal scores (rows every head's relu zeroes score exactly 0) go to the older slot
    ranked = torch.sort(torch.where(valid, score, float("-inf")), dim=-1, descending=True, stable=True)
    values, slots = ranked.values[:, :k], ranked.indices[:, :k]
    chosen = values > float("-inf")
    return torch.where(chosen, slots, -1), torch.where(chosen, values, -FLT_MAX)


@jit(options=ROUNDINGS_KEPT)
def indexer(x: In, cmp_block_table: In, qr_i8: In, qr_scale: In, idx_wq_b: In, wq_b_scale: In, weights_proj: In,
            hadamard: In, idx_kv: In, idx_kv_scale: In, position_ids: In, kv_seq_lens: In, freqs_cos: In,
            freqs_sin: In, idx_topk: Out, idx_scores: Out):
    slots, scores = index_topk(x, cmp_block_table, qr_i8, qr_scale, idx_wq_b, wq_b_scale, weights_proj, hadamard,
                               idx_kv, idx_kv_scale, position_ids, kv_seq_lens, freqs_cos, freqs_sin,
                               DIMS.csa_ratio, DIMS.chunk, DIMS.topk, DIMS.idx_visible)
    k = slots.shape[1]
    idx_topk[:, :k].copy_(slots)
    idx_topk[:, k:].fill_(-1)
    idx_scores[:, :k].copy_(scores)
    idx_scores[:, k:].fill_(-FLT_MAX)


# --- golden side


def golden_index(t, i, ratio, chunk, k, cap):
    """Token i's (slots, scores), naive: every visible row scored in float64 with int64 dot products."""
    dim = t["hadamard"].shape[0]
    heads = t["idx_wq_b"].shape[1] // dim
    r, pos = i // chunk, int(t["position_ids"].reshape(-1)[i])
    q = (t["qr_i8"][i].long() @ t["idx_wq_b"].long()).float() * t["qr_scale"][i] * t["wq_b_scale"]
    q = q.view(heads, dim).bfloat16().double()
    rope = t["freqs_cos"].shape[-1]
    q[:, -rope:] = golden_rope(q[:, -rope:], t["freqs_cos"][i], t["freqs_sin"][i], inverse=False) \
        .bfloat16().double()
    q = q @ t["hadamard"].double()
    scale = 127.0 / q.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    q_i8, q_scale = torch.round(q * scale).long(), 1 / scale
    weights = (t["x"][i].double() @ t["weights_proj"].double()) * dim ** -0.5 * heads ** -0.5
    visible = min(int(t["kv_seq_lens"][r]) // ratio, (pos + 1) // ratio, cap)
    block = t["idx_kv"].shape[1]
    slots = torch.arange(visible)
    pages, rows = t["cmp_block_table"][r, slots // block].long(), slots % block
    dots = (q_i8 @ t["idx_kv"][pages, rows].long().T).double()  # [heads, visible], exact in int64
    scores = t["idx_kv_scale"][pages, rows].double() * (weights[:, None] * torch.relu(q_scale * dots)).sum(0)
    scores = scores.tolist()
    order = sorted(range(visible), key=lambda s: -scores[s])[:k]  # stable: ties to the older slot
    return order, [scores[s] for s in order]


def golden_indexer(t):
    t["idx_topk"].fill_(-1)
    t["idx_scores"].fill_(-FLT_MAX)
    for i in range(t["x"].shape[0]):
        slots, scores = golden_index(t, i, DIMS.csa_ratio, DIMS.chunk, DIMS.topk, DIMS.idx_visible)
        t["idx_topk"][i, :len(slots)] = torch.tensor(slots, dtype=torch.int32)
        t["idx_scores"][i, :len(scores)] = torch.tensor(scores, dtype=torch.float64).float()


# --- cases


def indexer_specs(d, seed):
    """The indexer's own parameters in ABI order (after x and cmp_block_table, before position_ids)."""
    sc = scenario(d, d.csa_ratio, seed)
    width = d.idx_heads * d.idx_dim
    return [
        spec("qr_i8", (d.tokens, d.q_lora), torch.int8, random_int8, (d.tokens, d.q_lora)),
        spec("qr_scale", (d.tokens,), torch.float32, positive, (d.tokens,), 0.5 / 127, 1.5 / 127),
        spec("idx_wq_b", (d.q_lora, width), torch.int8, random_int8, (d.q_lora, width)),
        spec("wq_b_scale", (width,), torch.float32, positive, (width,), 0.5 / 127 / d.q_lora ** 0.5,
             1.5 / 127 / d.q_lora ** 0.5),
        spec("weights_proj", (d.hidden, d.idx_heads), torch.bfloat16, randn_scaled, (d.hidden, d.idx_heads),
             d.hidden ** -0.5),
        spec("hadamard", (d.idx_dim, d.idx_dim), torch.bfloat16, hadamard(d.idx_dim)),
        spec("idx_kv", (sc.cmp_pool, d.block, d.idx_dim), torch.int8, random_int8, (sc.cmp_pool, d.block, d.idx_dim)),
        spec("idx_kv_scale", (sc.cmp_pool, d.block), torch.float32, positive, (sc.cmp_pool, d.block), 0.5, 1.5),
    ]


def standalone_specs(d, seed):
    sc = scenario(d, d.csa_ratio, seed)
    return ([spec("x", (d.tokens, d.hidden), torch.bfloat16, torch.randn),
             spec("cmp_block_table", sc.cmp_table.shape, torch.int32, sc.cmp_table)]
            + indexer_specs(d, seed) + step_specs(d, d.csa_ratio, seed)
            + [spec("freqs_cos", (d.tokens, d.rope), torch.bfloat16, rope_table(sc.positions, d.rope, torch.cos)),
               spec("freqs_sin", (d.tokens, d.rope), torch.bfloat16, rope_table(sc.positions, d.rope, torch.sin)),
               spec("idx_topk", (d.tokens, d.topk_width), torch.int32),
               spec("idx_scores", (d.tokens, d.topk_width), torch.float32)])


CASES = [
    # Scores: a sum over heads of fp32 products against float64 (a few ulp); the quantized
    # inputs are identical by construction (see the module docstring). Indices may differ
    # only where scores tie within that tolerance.
    Case("indexer", specs=functools.partial(standalone_specs, DIMS, 0), kernel=indexer, golden=golden_indexer,
         compare={"idx_scores": Allclose(rtol=1e-5, atol=0.0),
                  "idx_topk": topk_pair_compare("idx_scores", rtol=1e-5)},
         baselines={"eager": indexer.fn}),  # its body run eagerly: plain torch at its dtypes
]
