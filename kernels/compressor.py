"""DeepSeek-V4 KV compressors: pool every R tokens' KV into one compressed row.

Each token computes kv = x @ wkv^T and score = x @ wgate^T + ape[pos % R] and
writes (kv | score) into its row of the compressor state, a per-request ring
of pages. At a boundary ((pos+1) % R == 0) the window's rows are pooled with a
per-channel softmax over the rows, RMS-normed, rotated (forward RoPE at the
window start) and written as bf16 to compressed slot pos // R. Only the
first boundary of a chunk compresses.

Ratio 128 (HCA) pools the R rows of its window. Ratio 4 (CSA) overlaps: kv
and score are two heads wide, and the pool is the front halves of the
previous window's 4 rows plus the back halves of the current window's 4
(rows before position 0: kv 0, score -inf).

The kernel pools in one vectorised pass: rows of positions inside the chunk
come from the chunk's fresh rows, older ones from the state as it was before
the step (later tokens of the chunk overwrite ring rows the boundary still
needs). The golden replays the tokens one by one, as the reference does.
"""
import functools

import torch

from golden_tasks import Case, In, InOut, jit
from golden_tasks.compare import Allclose
from kernels._dsv4 import DIMS, ROUNDINGS_KEPT, randn_scaled, rope_table, scenario, spec, step_specs
from kernels.sparse_attention import golden_rope, rotate_pairs

RMS_EPS = 1e-6

# --- kernel side


def compress(x, wkv, wgate, ape, norm_w, state, state_table, cmp_cos, cmp_sin, cmp_kv, cmp_table, positions,
             chunk):
    """One decode step of a compressor; updates `state` and `cmp_kv` in place.

    Contract: every chunk token's state page and the compressed slot of each
    request's chunk are mapped (the fixtures' block tables guarantee it).
    """
    tokens, ratio, width, head = x.shape[0], ape.shape[0], wkv.shape[0], cmp_kv.shape[-1]
    overlap = width == 2 * head
    pos = positions.reshape(-1).long()
    xf = x.float()
    fresh = torch.cat([xf @ wkv.float().T, xf @ wgate.float().T + ape[pos % ratio]], dim=-1)

    spage, ring = state.shape[1], state_table.shape[1] * state.shape[1]
    flat_state = state.view(-1, 2 * width)
    req = torch.arange(tokens) // chunk

    def state_rows(r, p):
        page = state_table[r, (p % ring) // spage].long()
        return page * spage + p % spage, page >= 0

    span = 2 * ratio if overlap else ratio
    q = pos[:, None] - span + 1 + torch.arange(span)  # the pooled positions, oldest first
    start = pos.view(-1, chunk)[:, 0][req][:, None]
    old_row, mapped = state_rows(req[:, None], q.clamp(min=0))
    rows = torch.where((q >= start)[..., None], fresh[(req[:, None] * chunk + q - start).clamp(0, tokens - 1)],
                       flat_state[old_row.clamp(min=0)])
    kv, score = rows[..., :width], rows[..., width:]
    if overlap:  # front halves of the previous window, back halves of the current one
        kv = torch.cat([kv[:, :ratio, :head], kv[:, ratio:, head:]], dim=1)
        score = torch.cat([score[:, :ratio, :head], score[:, ratio:, head:]], dim=1)
    present = ((q >= 0) & mapped)[..., None]
    weights = torch.softmax(torch.where(present, score, float("-inf")), dim=1)
    pooled = (torch.where(present, kv, 0.0) * weights).sum(1)
    normed = pooled * torch.rsqrt(pooled.pow(2).mean(-1, keepdim=True) + RMS_EPS) * norm_w.float()
    rope = cmp_cos.shape[-1]
    row = torch.cat([normed[:, :-rope], rotate_pairs(normed[:, -rope:], cmp_cos, cmp_sin, inverse=False)], dim=-1)

    # each request's first boundary token writes its row; the others rewrite their own slot unchanged
    boundary = ((pos + 1) % ratio == 0).view(-1, chunk)
    has = boundary.any(1)
    writer = torch.arange(0, tokens, chunk) + boundary.int().argmax(1)
    slot = torch.where(has, pos[writer], pos.view(-1, chunk)[:, 0]) // ratio
    block = cmp_kv.shape[1]
    target = cmp_table[torch.arange(has.shape[0]), slot // block].long() * block + slot % block
    flat_cmp = cmp_kv.view(-1, head)
    flat_cmp.index_put_((target,), torch.where(has[:, None], row[writer].to(cmp_kv.dtype), flat_cmp[target]))
    flat_state.index_put_((state_rows(req, pos)[0],), fresh)


@jit(options=ROUNDINGS_KEPT)
def compressor(x: In, wkv: In, wgate: In, ape: In, norm_w: In, compress_state: InOut, state_block_table: In,
               cmp_cos: In, cmp_sin: In, cmp_kv: InOut, cmp_block_table: In, position_ids: In):
    """One decode step of either compressor: the ratio and the overlap come from the shapes."""
    compress(x, wkv, wgate, ape, norm_w, compress_state, state_block_table, cmp_cos, cmp_sin, cmp_kv,
             cmp_block_table, position_ids, DIMS.chunk)


# --- golden side


def golden_compress(t, chunk):
    """The reference, token by token in order: write the state row, pool at the chunk's first boundary."""
    ratio, width, head = t["ape"].shape[0], t["wkv"].shape[0], t["cmp_kv"].shape[-1]
    overlap = width == 2 * head
    state, table, cmp_kv = t["compress_state"], t["state_block_table"], t["cmp_kv"]
    spage, ring, block = state.shape[1], table.shape[1] * state.shape[1], cmp_kv.shape[1]
    positions = t["position_ids"].reshape(-1).tolist()
    x = t["x"].double()

    def state_row(r, p):
        page = int(table[r, (p % ring) // spage])
        return (page, p % spage) if p >= 0 and page >= 0 else None

    compressed = set()
    for i, pos in enumerate(positions):
        r = i // chunk
        kv = x[i] @ t["wkv"].double().T
        score = x[i] @ t["wgate"].double().T + t["ape"][pos % ratio].double()
        page, row = state_row(r, pos)
        state[page, row] = torch.cat([kv, score]).to(state.dtype)
        if (pos + 1) % ratio or r in compressed:
            continue
        compressed.add(r)
        span = range(pos - (2 if overlap else 1) * ratio + 1, pos + 1)
        kvs, scores = [], []
        for n, p in enumerate(span):
            where = state_row(r, p)
            cols = (slice(0, head) if n < ratio else slice(head, width)) if overlap else slice(0, width)
            if where is None:
                kvs.append(torch.zeros(head, dtype=torch.float64))
                scores.append(torch.full((head,), float("-inf"), dtype=torch.float64))
            else:
                full = state[where].double()
                kvs.append(full[:width][cols])
                scores.append(full[width:][cols])
        pooled = (torch.stack(kvs) * torch.softmax(torch.stack(scores), dim=0)).sum(0)
        normed = pooled / torch.sqrt(pooled.pow(2).mean() + RMS_EPS) * t["norm_w"].double()
        rope = t["cmp_cos"].shape[-1]
        normed[-rope:] = golden_rope(normed[-rope:], t["cmp_cos"][i], t["cmp_sin"][i], inverse=False)
        slot = pos // ratio
        cmp_kv[int(t["cmp_block_table"][r, slot // block]), slot % block, 0] = normed.to(cmp_kv.dtype)


# --- cases


def compressor_specs(d, ratio, seed):
    """The compressor's parameters in ABI order (shared by the decode entries that compress)."""
    sc = scenario(d, ratio, seed)
    width = 2 * d.head_dim if sc.overlap else d.head_dim
    window_start = sc.positions - ratio + 1
    return [
        spec("x", (d.tokens, d.hidden), torch.bfloat16, torch.randn),
        spec("wkv", (width, d.hidden), torch.bfloat16, randn_scaled, (width, d.hidden), d.hidden ** -0.5),
        spec("wgate", (width, d.hidden), torch.bfloat16, randn_scaled, (width, d.hidden), d.hidden ** -0.5),
        spec("ape", (ratio, width), torch.float32, randn_scaled, (ratio, width), 0.5, torch.float32),
        spec("norm_w", (d.head_dim,), torch.bfloat16, torch.rand),
        # rows of earlier steps (and stale ones): unit-scale kv and scores
        spec("compress_state", (sc.state_pool, d.state_block, 2 * width), torch.float32, torch.randn),
        spec("state_block_table", sc.state_table.shape, torch.int32, sc.state_table),
        spec("cmp_cos", (d.tokens, d.rope), torch.bfloat16, rope_table(window_start, d.rope, torch.cos)),
        spec("cmp_sin", (d.tokens, d.rope), torch.bfloat16, rope_table(window_start, d.rope, torch.sin)),
        spec("cmp_kv", (sc.cmp_pool, d.block, 1, d.head_dim), torch.bfloat16, torch.randn),
        spec("cmp_block_table", sc.cmp_table.shape, torch.int32, sc.cmp_table),
    ]


def standalone_specs(d, ratio, seed):
    return compressor_specs(d, ratio, seed) + step_specs(d, ratio, seed)[:1]


# The state rows are fp32 sums over `hidden` products of bf16 values: fp32 against float64
# accumulation differs by a few ulp of the largest term (~1e-6 absolute at unit scale).
STATE_TOLERANCE = Allclose(rtol=1e-5, atol=1e-5)
# A compressed row is rounded to bf16 from values that agree to ~1e-6: one rounding step
# apart at most (2^-7 relative); atol for elements that cancel to ~0 in the rotation.
CMP_TOLERANCE = Allclose(rtol=2 ** -7, atol=1e-5)
COMPARE = {"compress_state": STATE_TOLERANCE, "cmp_kv": CMP_TOLERANCE}

CASES = [  # each compared with the kernel's body run eagerly: plain torch at its dtypes
    Case("compressor_ratio128", specs=functools.partial(standalone_specs, DIMS, DIMS.hca_ratio, 0),
         kernel=compressor, golden=functools.partial(golden_compress, chunk=DIMS.chunk),
         compare=COMPARE, baselines={"eager": compressor.fn}),
    Case("compressor_ratio4", specs=functools.partial(standalone_specs, DIMS, DIMS.csa_ratio, 0),
         kernel=compressor, golden=functools.partial(golden_compress, chunk=DIMS.chunk),
         compare=COMPARE, baselines={"eager": compressor.fn}),
]
