"""DeepSeek-V4 attention: profiles and the decode-step fixtures shared by its case modules.

Sizes come in profiles (`doit verify profile=flash`): "small" keeps the
structure of production at a size that runs in milliseconds on two CPU cores,
"flash" is the production configuration (for GPUs and memory checks). The
math is in ../shared/reference/deepseek-v4-attention.md.

A decode step is one chunk of S tokens for each of B requests, token-major
(t = b*S + s). `Scenario` draws, from the case seed alone, everything that
gives the step its shape: each request's position, the paged block tables
(shuffled physical pages; -1 for pages that slid out of the window or are
not allocated yet), the window rows, the compressed-slot tables. Random
tensor contents (q, caches, weights) are drawn by the pipeline per spec.
"""
import dataclasses
import functools
import math

import torch

import golden_tasks
from golden_tasks import TensorSpec


@dataclasses.dataclass(frozen=True)
class Dims:
    heads: int
    o_groups: int
    head_dim: int
    rope: int
    window: int  # sliding window, also the attention tile (WIN == tile)
    block: int  # rows per page of every paged cache
    batch: int
    chunk: int  # S: tokens per request in one decode step (1 real + drafts)
    hca_ratio: int
    csa_ratio: int
    topk: int  # compressed rows CSA attends to
    topk_width: int  # columns of the indexer's output (padded with -1)
    max_cmp: int  # HCA: visible compressed rows cap
    idx_visible: int  # CSA indexer: scored compressed rows cap
    idx_heads: int
    idx_dim: int
    hidden: int
    q_lora: int
    state_block: int  # rows per page of the compressor state
    max_pos: int  # positions are drawn below this
    prefill_tokens: int  # per request, for the prefill case

    @property
    def tokens(self):
        return self.batch * self.chunk

    @property
    def tokens_padded(self):
        return -(-self.tokens // 16) * 16


PROFILES = {
    "small": Dims(heads=8, o_groups=2, head_dim=64, rope=16, window=16, block=8, batch=2, chunk=4,
                  hca_ratio=16, csa_ratio=4, topk=32, topk_width=64, max_cmp=8192, idx_visible=4096,
                  idx_heads=4, idx_dim=32, hidden=64, q_lora=32, state_block=8, max_pos=300,
                  prefill_tokens=24),
    "flash": Dims(heads=64, o_groups=8, head_dim=512, rope=64, window=128, block=32, batch=64, chunk=8,
                  hca_ratio=128, csa_ratio=4, topk=512, topk_width=4096, max_cmp=8192, idx_visible=4096,
                  idx_heads=64, idx_dim=128, hidden=4096, q_lora=1024, state_block=8, max_pos=2**15,
                  prefill_tokens=1024),
}
PROFILES["default"] = PROFILES["small"]


def profile_dims() -> Dims:
    """The Dims of the active profile (golden_tasks.profile())."""
    return PROFILES[golden_tasks.profile(PROFILES)]


DIMS = profile_dims()

# Inductor options for these kernels: keep every bf16 rounding the math states (the attention's
# bf16 probabilities, the indexer's bf16 q before int8 quantization). By default Inductor
# elides a downcast-upcast pair inside a fused kernel, and a q that skips its rounding
# quantizes to other int8 values.
ROUNDINGS_KEPT = {"emulate_precision_casts": True}


class Pager:
    """Hands out a shuffled pool of physical pages, so consecutive logical pages are scattered."""

    def __init__(self, pages: int, gen: torch.Generator):
        self.free = torch.randperm(pages, generator=gen).tolist()
        self.pages = pages

    def table(self, batch: int, width: int, mapped) -> torch.Tensor:
        """[batch, width] page table: column j of request b is a fresh page iff mapped(b, j), else -1."""
        table = torch.full((batch, width), -1, dtype=torch.int32)
        for b in range(batch):
            for j in range(width):
                if mapped(b, j):
                    table[b, j] = self.free.pop()
        return table


@dataclasses.dataclass
class Scenario:
    """One decode step's structure, drawn from `seed`. See the module docstring."""
    d: Dims
    ratio: int
    overlap: bool  # the ratio-4 compressor pools two windows
    seed: int

    def __post_init__(self):
        d, r = self.d, self.ratio
        gen = torch.Generator().manual_seed(self.seed)
        # Request 0 is young (its window is still filling; its first chunk may start at 0);
        # request 1's chunk straddles a compression boundary; the rest are anywhere.
        starts = [int(torch.randint(0, d.window // 2, (), generator=gen)),
                  r * int(torch.randint(max(2, d.max_pos // (2 * r)), d.max_pos // r, (), generator=gen)) - 2]
        starts += torch.randint(0, d.max_pos - d.chunk, (d.batch - 2,), generator=gen).tolist()
        self.starts = torch.tensor(starts[:d.batch], dtype=torch.int64)
        self.positions = (self.starts[:, None] + torch.arange(d.chunk)).reshape(-1)
        self.seq_lens = self.starts + d.chunk
        bs = d.block
        # KV pages: only those holding a position some token's window can see; older ones were freed.
        kv_width = -(-(d.max_pos + d.chunk) // bs)
        first_live = (self.starts - d.window + 1).clamp(min=0) // bs
        kv_pages = d.batch * (d.window // bs + 2)
        self.kv_pool = kv_pages + kv_pages // 2  # spare pages hold stale rows of other requests
        self.kv_table = Pager(self.kv_pool, gen).table(
            d.batch, kv_width, lambda b, j: first_live[b] <= j <= (self.seq_lens[b] - 1) // bs)
        # Compressed slots: every slot up to the request's length, pages drawn from a shared pool
        # sized for the longest requests (shapes must not depend on the seed: one compile serves all).
        cmp_rows = (self.seq_lens // r).tolist()
        self.cmp_width = -(-(d.max_pos + d.chunk) // r // bs)
        self.cmp_pool = d.batch * (self.cmp_width + 1)
        self.cmp_table = Pager(self.cmp_pool, gen).table(d.batch, self.cmp_width,
                                                         lambda b, j: j * bs <= cmp_rows[b])
        # Compressor state: a ring of `ring` rows per request (the rows of one pooling window).
        self.ring = 2 * r if self.overlap else r
        ring_pages = self.ring // d.state_block
        self.state_pool = d.batch * ring_pages + 2
        self.state_table = Pager(self.state_pool, gen).table(d.batch, ring_pages, lambda b, j: True)

    def kv_rows(self, b: int, pos: torch.Tensor) -> torch.Tensor:
        """Physical KV rows of request b's positions (-1 where unmapped)."""
        page = self.kv_table[b, pos // self.d.block].long()
        return torch.where(page >= 0, page * self.d.block + pos % self.d.block, -1)

    def slot_mapping(self) -> torch.Tensor:
        b = torch.arange(self.d.batch).repeat_interleave(self.d.chunk)
        return torch.stack([self.kv_rows(int(bi), p) for bi, p in zip(b, self.positions)]).to(torch.int32)

    def window_rows(self) -> torch.Tensor:
        """[T, WIN]: physical rows of positions max(0, pos-WIN+1)..pos, oldest first, then -1."""
        d = self.d
        rows = torch.full((d.tokens, d.window), -1, dtype=torch.int32)
        for t, pos in enumerate(self.positions.tolist()):
            span = torch.arange(max(0, pos - d.window + 1), pos + 1)
            rows[t, :span.numel()] = self.kv_rows(t // d.chunk, span)
        return rows

    def window_lens(self) -> torch.Tensor:
        return (self.positions + 1).clamp(max=self.d.window).to(torch.int32)


@functools.lru_cache(maxsize=8)
def scenario(d: Dims, ratio: int, seed: int) -> Scenario:
    """The step for compress ratio `ratio`; ratio 4 is CSA's overlapping compressor."""
    return Scenario(d, ratio, ratio == d.csa_ratio, seed)


# --- RoPE tables: [rows, ROPE] holding [cos_half | cos_half] (only the first half is read)

def rope_table(positions: torch.Tensor, rope: int, fn) -> torch.Tensor:
    inv_freq = 10000.0 ** (-torch.arange(rope // 2, dtype=torch.float64) / (rope // 2))
    half = fn(positions.double()[:, None] * inv_freq)
    return torch.cat([half, half], dim=1).to(torch.bfloat16)


def randn_scaled(shape, scale, dtype=torch.bfloat16):
    """Standard normal times `scale` (init_value callables run under the pipeline's per-spec seed)."""
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)


def random_int8(shape):
    return torch.randint(-127, 128, shape, dtype=torch.int8)


def positive(shape, low, high):
    return torch.empty(shape, dtype=torch.float32).uniform_(low, high)


def hadamard(n: int) -> torch.Tensor:
    """Sylvester Hadamard matrix scaled to be orthonormal, in bf16."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(torch.bfloat16)


def spec(name, shape, dtype, init=None, *args):
    """A TensorSpec whose init is a tensor, a torch factory, or `init(*args)` (seeded per spec)."""
    if args:
        init = functools.partial(init, *args)
    return TensorSpec(name, tuple(shape), dtype, init_value=init)


def step_specs(d, ratio, seed, positions_shape=None):
    """position_ids and kv_seq_lens, adjacent in every entry that takes them."""
    sc = scenario(d, ratio, seed)
    shape = positions_shape or (d.tokens,)
    return [spec("position_ids", shape, torch.int32, sc.positions.to(torch.int32).reshape(shape)),
            spec("kv_seq_lens", (d.batch,), torch.int32, sc.seq_lens.to(torch.int32))]
