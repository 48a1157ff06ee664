"""DeepSeek-V4 decode attention, the three layer types: decode_swa, decode_hca, decode_csa.

One decode step of B requests x S tokens (t = b*S + s) against paged bf16 KV
caches, MQA with one 512-wide KV head (V = K), an attention sink per head,
inverse RoPE on the output's rope dims and the output packed by head group:
o_packed[g, t, hh*D + d] = o[t, g*H/G + hh, d], rows t >= T undefined.

- decode_swa: a sliding window of WIN rows per token (swa_indices, swa_lens).
- decode_hca: writes the chunk's KV rows (slot_mapping) into ori_kv, runs the
  ratio-128 compressor (state and compressed cache are InOut), then attends
  over the window plus every visible compressed row:
  n = min((pos+1)//R, kv_seq_len//R, cap).
- decode_hca_tp: decode_hca on W ranks, its heads split across them
  (tensor parallel) and the output all-gathered; checked against
  decode_hca's golden.
- decode_csa: the same with the overlapping ratio-4 compressor, then the int8
  indexer picks the top-k visible compressed rows (slot kept iff
  0 <= slot < (pos+1)//4), then attends over the window plus those rows.

ABI order, shared by the three entries: q, [kv, slot_mapping], ori_kv, the
window, [compressor: x .. cmp_sin], [cmp_kv, cmp_block_table], [indexer:
qr_i8 .. idx_kv_scale], [position_ids, kv_seq_lens], attn_sink, freqs_cos,
freqs_sin, o_packed. Inputs, layouts and tolerances: docs/cases/.
"""
import dataclasses
import functools

import torch
import torch.distributed as dist

import golden_tasks
from golden_tasks import Case, In, InOut, Out, jit
from kernels._dsv4 import DIMS, ROUNDINGS_KEPT, scenario, spec, step_specs
from kernels.compressor import COMPARE as COMPRESSOR_COMPARE
from kernels.compressor import compress, compressor_specs, golden_compress
from kernels.indexer import golden_index, index_topk, indexer_specs
from kernels.sparse_attention import (
    ATTENTION_TOLERANCE,
    attend,
    attention_specs,
    finish,
    gather,
    golden_attend,
    golden_finish,
    physical_rows,
)

# --- kernel side


def write_rows(ori_kv, slot_mapping, kv):
    """Every chunk token's KV row into its slot, before anyone attends (causality comes from the windows)."""
    ori_kv.view(-1, ori_kv.shape[-1]).index_put_((slot_mapping.long(),), kv)


def compressed_rows(cmp_kv, cmp_table, slots, valid, chunk):
    """Keys and validity of logical compressed slots [T, n] of each token's request, lowered through the table."""
    block = cmp_kv.shape[1]
    req = torch.arange(slots.shape[0]) // chunk
    page = torch.gather(cmp_table[req], 1, (slots.clamp(min=0) // block).long())
    rows = torch.where(valid & (page >= 0), page * block + slots.clamp(min=0) % block, -1)
    return gather(cmp_kv, rows)


def attend_window_and(q, ori_kv, window, extra_keys, extra_valid, attn_sink, freqs_cos, freqs_sin, o_packed):
    """The core over [window tile (rows >= 0) | extra rows], then inverse RoPE and packing."""
    keys, valid = gather(ori_kv, window)
    o = attend(q, torch.cat([keys, extra_keys], 1), torch.cat([valid, extra_valid], 1), attn_sink, tile=DIMS.window)
    finish(o, freqs_cos, freqs_sin, o_packed)


@jit(options=ROUNDINGS_KEPT)
def decode_swa(q: In, ori_kv: In, swa_indices: In, swa_lens: In, attn_sink: In, freqs_cos: In, freqs_sin: In,
               o_packed: Out):
    keys, valid = gather(ori_kv, swa_indices)
    valid = valid & (torch.arange(swa_indices.shape[1]) < swa_lens[:, None])
    finish(attend(q, keys, valid, attn_sink, tile=DIMS.window), freqs_cos, freqs_sin, o_packed)


def hca_keys(kv, slot_mapping, ori_kv, window_swa_indices, x, wkv, wgate, ape, norm_w, compress_state,
             state_block_table, cmp_cos, cmp_sin, cmp_kv, cmp_block_table, position_ids, kv_seq_lens):
    """decode_hca up to the attention: the cache writes and the compressor, then the keys and
    validity of [window | every visible compressed row] per token."""
    write_rows(ori_kv, slot_mapping, kv)
    compress(x, wkv, wgate, ape, norm_w, compress_state, state_block_table, cmp_cos, cmp_sin, cmp_kv,
             cmp_block_table, position_ids, DIMS.chunk)
    ratio, tokens = ape.shape[0], position_ids.shape[0]
    req = torch.arange(tokens) // DIMS.chunk
    slots = torch.arange(cmp_block_table.shape[1] * cmp_kv.shape[1]).expand(tokens, -1)
    visible = torch.minimum(torch.minimum((position_ids.long() + 1) // ratio, kv_seq_lens[req].long() // ratio),
                            torch.tensor(DIMS.max_cmp))
    keys, valid = compressed_rows(cmp_kv, cmp_block_table, slots, slots < visible[:, None], DIMS.chunk)
    window_keys, window_valid = gather(ori_kv, window_swa_indices)
    return torch.cat([window_keys, keys], 1), torch.cat([window_valid, valid], 1)


@jit(options=ROUNDINGS_KEPT)
def decode_hca(q: In, kv: In, slot_mapping: In, ori_kv: InOut, window_swa_indices: In, x: In, wkv: In, wgate: In,
               ape: In, norm_w: In, compress_state: InOut, state_block_table: In, cmp_cos: In, cmp_sin: In,
               cmp_kv: InOut, cmp_block_table: In, position_ids: In, kv_seq_lens: In, attn_sink: In, freqs_cos: In,
               freqs_sin: In, o_packed: Out):
    keys, valid = hca_keys(kv, slot_mapping, ori_kv, window_swa_indices, x, wkv, wgate, ape, norm_w, compress_state,
                           state_block_table, cmp_cos, cmp_sin, cmp_kv, cmp_block_table, position_ids, kv_seq_lens)
    finish(attend(q, keys, valid, attn_sink, tile=DIMS.window), freqs_cos, freqs_sin, o_packed)


@jit(ranks=2)
def decode_hca_tp(q: In, kv: In, slot_mapping: In, ori_kv: InOut, window_swa_indices: In, x: In, wkv: In,
                  wgate: In, ape: In, norm_w: In, compress_state: InOut, state_block_table: In, cmp_cos: In,
                  cmp_sin: In, cmp_kv: InOut, cmp_block_table: In, position_ids: In, kv_seq_lens: In, attn_sink: In,
                  freqs_cos: In, freqs_sin: In, o_packed: Out):
    """decode_hca with its heads split across ranks (tensor parallel): every rank writes the caches
    and compresses alike, attends with its H/W heads, and an all-gather of the heads gives every
    rank the whole output."""
    keys, valid = hca_keys(kv, slot_mapping, ori_kv, window_swa_indices, x, wkv, wgate, ape, norm_w, compress_state,
                           state_block_table, cmp_cos, cmp_sin, cmp_kv, cmp_block_table, position_ids, kv_seq_lens)
    world, rank = dist.get_world_size(), dist.get_rank()
    heads = q.shape[1] // world
    mine = slice(rank * heads, (rank + 1) * heads)
    o = attend(q[:, mine], keys, valid, attn_sink[mine], tile=DIMS.window)
    parts = [torch.empty_like(o) for _ in range(world)]
    dist.all_gather(parts, o.contiguous())
    finish(torch.cat(parts, dim=1), freqs_cos, freqs_sin, o_packed)


@jit(options=ROUNDINGS_KEPT)
def decode_csa(q: In, kv: In, slot_mapping: In, ori_kv: InOut, window_swa_indices: In, x: In, wkv: In, wgate: In,
               ape: In, norm_w: In, compress_state: InOut, state_block_table: In, cmp_cos: In, cmp_sin: In,
               cmp_kv: InOut, cmp_block_table: In, qr_i8: In, qr_scale: In, idx_wq_b: In, wq_b_scale: In,
               weights_proj: In, hadamard: In, idx_kv: In, idx_kv_scale: In, position_ids: In, kv_seq_lens: In,
               attn_sink: In, freqs_cos: In, freqs_sin: In, o_packed: Out):
    write_rows(ori_kv, slot_mapping, kv)
    compress(x, wkv, wgate, ape, norm_w, compress_state, state_block_table, cmp_cos, cmp_sin, cmp_kv,
             cmp_block_table, position_ids, DIMS.chunk)
    ratio = ape.shape[0]
    slots, _ = index_topk(x, cmp_block_table, qr_i8, qr_scale, idx_wq_b, wq_b_scale, weights_proj, hadamard, idx_kv,
                          idx_kv_scale, position_ids, kv_seq_lens, freqs_cos, freqs_sin, ratio, DIMS.chunk, DIMS.topk,
                          DIMS.idx_visible)
    causal = (slots >= 0) & (slots < (position_ids.reshape(-1, 1).long() + 1) // ratio)
    keys, valid = compressed_rows(cmp_kv, cmp_block_table, slots, causal, DIMS.chunk)
    attend_window_and(q, ori_kv, window_swa_indices, keys, valid, attn_sink, freqs_cos, freqs_sin, o_packed)


# --- golden side


def golden_rows(pool, table, slots):
    """Rows of logical slots [n] of one request's paged cache, float64, with validity (page mapped, in range)."""
    block = pool.shape[1]
    pages = [int(table[s // block]) for s in slots]
    valid = torch.tensor([0 <= p < pool.shape[0] for p in pages], dtype=torch.bool)
    rows = torch.stack([pool[p if ok else 0, s % block, 0] for p, s, ok in zip(pages, slots, valid)]) if slots \
        else pool.new_zeros((0, pool.shape[-1]))
    return rows, valid


def golden_write_rows(t):
    flat = t["ori_kv"].view(-1, t["ori_kv"].shape[-1])
    for i, slot in enumerate(t["slot_mapping"].tolist()):
        flat[slot] = t["kv"][i]


def golden_attend_over(t, i, extra_rows, extra_valid):
    """Token i over its window rows (slot >= 0) followed by `extra_rows`."""
    window, valid = physical_rows(t["ori_kv"], t["window_swa_indices"][i])
    o = golden_attend(t["q"][i], torch.cat([window, extra_rows]), torch.cat([valid, extra_valid]), t["attn_sink"])
    golden_finish(i, o, t["freqs_cos"], t["freqs_sin"], t["o_packed"])


def golden_decode_swa(t):
    for i in range(t["q"].shape[0]):
        rows, valid = physical_rows(t["ori_kv"], t["swa_indices"][i])
        valid &= torch.arange(rows.shape[0]) < int(t["swa_lens"][i])
        golden_finish(i, golden_attend(t["q"][i], rows, valid, t["attn_sink"]), t["freqs_cos"], t["freqs_sin"],
                      t["o_packed"])


def golden_decode_hca(t):
    golden_write_rows(t)
    golden_compress(t, DIMS.chunk)
    ratio = t["ape"].shape[0]
    for i, pos in enumerate(t["position_ids"].tolist()):
        r = i // DIMS.chunk
        n = min((pos + 1) // ratio, int(t["kv_seq_lens"][r]) // ratio, DIMS.max_cmp)
        rows, valid = golden_rows(t["cmp_kv"], t["cmp_block_table"][r], list(range(n)))
        golden_attend_over(t, i, rows, valid)


def golden_decode_csa(t):
    golden_write_rows(t)
    golden_compress(t, DIMS.chunk)
    ratio = t["ape"].shape[0]
    for i, pos in enumerate(t["position_ids"].reshape(-1).tolist()):
        slots, _ = golden_index(t, i, ratio, DIMS.chunk, DIMS.topk, DIMS.idx_visible)
        kept = [s for s in slots if 0 <= s < (pos + 1) // ratio]
        rows, valid = golden_rows(t["cmp_kv"], t["cmp_block_table"][i // DIMS.chunk], kept)
        golden_attend_over(t, i, rows, valid)


# --- cases


def swa_specs(d, seed):
    sc = scenario(d, d.hca_ratio, seed)
    shared = attention_specs(d, sc)
    return [shared["q"], spec("ori_kv", (sc.kv_pool, d.block, 1, d.head_dim), torch.bfloat16, torch.randn),
            spec("swa_indices", (d.tokens, d.window), torch.int32, sc.window_rows()),
            spec("swa_lens", (d.tokens,), torch.int32, sc.window_lens()),
            shared["attn_sink"], shared["freqs_cos"], shared["freqs_sin"], shared["o_packed"]]


def compressed_decode_specs(d, ratio, seed, indexer=False):
    """decode_hca's parameters, or decode_csa's (ratio 4, with the indexer's)."""
    sc = scenario(d, ratio, seed)
    shared = attention_specs(d, sc)
    return ([shared["q"],
             spec("kv", (d.tokens, d.head_dim), torch.bfloat16, torch.randn),
             spec("slot_mapping", (d.tokens,), torch.int32, sc.slot_mapping()),
             spec("ori_kv", (sc.kv_pool, d.block, 1, d.head_dim), torch.bfloat16, torch.randn),
             spec("window_swa_indices", (d.tokens, d.window), torch.int32, sc.window_rows())]
            + compressor_specs(d, ratio, seed)
            + (indexer_specs(d, seed) if indexer else [])
            + step_specs(d, ratio, seed, (d.tokens, 1) if indexer else None)
            + [shared["attn_sink"], shared["freqs_cos"], shared["freqs_sin"], shared["o_packed"]])


# The attention output's tolerance is the core's (kernels/sparse_attention.py); the cache
# writes are copies (exact) and the compressor's outputs keep their own (kernels/compressor.py).
COMPARE = {"o_packed": ATTENTION_TOLERANCE, **COMPRESSOR_COMPARE}

def case(name: str, seed: int = 0) -> Case:
    """Flagship case `name` with its decode step and data drawn from `seed` (the library uses 0)."""
    specs, kernel, golden, compare = {
        "decode_swa": (functools.partial(swa_specs, DIMS, seed), decode_swa, golden_decode_swa,
                       {"o_packed": ATTENTION_TOLERANCE}),
        "decode_hca": (functools.partial(compressed_decode_specs, DIMS, DIMS.hca_ratio, seed), decode_hca,
                       golden_decode_hca, COMPARE),
        # checked against the single-process golden: the heads split and gathered change nothing
        "decode_hca_tp": (functools.partial(compressed_decode_specs, DIMS, DIMS.hca_ratio, seed), decode_hca_tp,
                          golden_decode_hca, COMPARE),
        "decode_csa": (functools.partial(compressed_decode_specs, DIMS, DIMS.csa_ratio, seed, indexer=True),
                       decode_csa, golden_decode_csa, COMPARE),
    }[name]
    # compared with its own body run eagerly (plain torch at its dtypes, what AOTInductor's compile bought); the
    # tensor-parallel kernel runs eagerly already
    baselines = {"eager": kernel.fn} if kernel.ranks == 1 else {}
    return Case(name, specs=specs, kernel=kernel, golden=golden, compare=compare, seed=seed, baselines=baselines)


def hca_specs_at(batch: int, context: int):
    """decode_hca's parameters for `batch` requests whose positions are drawn below `context`."""
    return compressed_decode_specs(dataclasses.replace(DIMS, batch=batch, max_pos=context), DIMS.hca_ratio, 0)


# decode_hca across its load, by profile: requests per step and how far back their contexts reach. Each holds the
# flagship's own point (batch-2.context-300 by default), which shares the flagship's cached stages; flash's stays
# at production's batch (planning a larger one draws page tables for minutes)
LOADS = {"small": {"batch": [2, 8], "context": [300, 2400]}, "flash": {"batch": [64], "context": [2**12, 2**15]}}
LOADS["default"] = LOADS["small"]

FLAGSHIPS = ("decode_swa", "decode_hca", "decode_csa")
CASES = [case(name) for name in (*FLAGSHIPS, "decode_hca_tp")] + [
    dataclasses.replace(case("decode_hca"), name="decode_hca_shapes", specs=hca_specs_at,
                        sweep=LOADS[golden_tasks.profile(LOADS)])]
