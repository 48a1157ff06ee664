"""Multi-rank kernels: the collectives of tensor-, context- and expert-parallel models.

Each kernel runs once per rank (torch.distributed, gloo here) with that rank's
view of its parameters: a "stacked" spec's leading dim is the rank, so rank r
sees slice r; an unplaced spec is whole on every rank. Every golden is the
single-process math on the whole tensors, in float64. Specs take the world size
(`ranks`), so `doit verify ranks=4` runs every case at four ranks.

- allreduce: the sum of every rank's x, on every rank.
- row_parallel_linear: X @ W with W split by rows (the input dim): local
  matmul of each rank's column block of X by its rows of W, then all-reduce.
- column_parallel_linear: X @ W with W split by columns (the output dim):
  local matmul, then all-gather of the column blocks.
- cp_prefill_attention: causal MQA prefill with the sequence split across
  ranks (context parallel): an all-gather of the KV chunks gives every rank the
  whole sequence's keys; each attends its own queries.
- ep_moe: top-1 mixture of experts with the experts split across ranks (expert
  parallel): all-to-all dispatch of each token to its expert's rank, the expert
  matmul there, all-to-all combine back, scaled by the gate.

They name no baseline: each body is already plain torch and torch.distributed, run eagerly.
"""
import functools

import torch
import torch.distributed as dist

from golden_tasks import STACKED, Case, In, Out, TensorSpec, jit


def gathered(local):
    """Every rank's `local`, in rank order (an all-gather)."""
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local)
    return parts


@jit(ranks=2)
def allreduce(x: In, out: Out):
    out.copy_(x)
    dist.all_reduce(out)


def golden_allreduce(t):
    t["out"].copy_(t["x"].double().sum(0))


@jit(ranks=2)
def row_parallel_linear(x: In, weight: In, out: Out):
    out.copy_(x @ weight)
    dist.all_reduce(out)


def golden_row_parallel_linear(t):
    x = torch.cat(list(t["x"].double()), dim=1)  # [M, K]: the ranks' column blocks side by side
    t["out"].copy_(x @ torch.cat(list(t["weight"].double()), dim=0))


@jit(ranks=2)
def column_parallel_linear(x: In, weight: In, out: Out):
    out.copy_(torch.cat(gathered(x @ weight), dim=1))


def golden_column_parallel_linear(t):
    t["out"].copy_(t["x"].double() @ torch.cat(list(t["weight"].double()), dim=1))


@jit(ranks=2)
def cp_prefill_attention(q: In, kv: In, out: Out):
    rank, chunk = dist.get_rank(), q.shape[0]
    keys = torch.cat(gathered(kv))  # [S, D]: the whole sequence
    positions = rank * chunk + torch.arange(chunk)
    scores = torch.einsum("thd,kd->thk", q, keys) * q.shape[-1] ** -0.5
    causal = torch.arange(keys.shape[0])[None, :] <= positions[:, None]
    probs = torch.softmax(scores.masked_fill(~causal[:, None, :], float("-inf")), dim=-1)
    out.copy_(torch.einsum("thk,kd->thd", probs, keys))


def golden_cp_prefill_attention(t):
    ranks, chunk, heads, dim = t["q"].shape
    q, keys = t["q"].double().reshape(ranks * chunk, heads, dim), t["kv"].double().reshape(ranks * chunk, dim)
    scores = torch.einsum("thd,kd->thk", q, keys) * dim ** -0.5
    causal = torch.ones(ranks * chunk, ranks * chunk, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal[:, None, :], float("-inf")), dim=-1)
    t["out"].copy_(torch.einsum("thk,kd->thd", probs, keys).reshape(t["out"].shape))


@jit(ranks=2)
def ep_moe(x: In, expert: In, gate: In, weights: In, out: Out):
    rank, local = dist.get_rank(), weights.shape[0]
    dest = expert // local  # the rank holding each token's expert
    order = torch.argsort(dest, stable=True)
    sent = torch.bincount(dest, minlength=dist.get_world_size())
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent)
    sent, received = sent.tolist(), received.tolist()
    tokens = x.new_empty((sum(received), x.shape[1]))
    experts = expert.new_empty(sum(received))
    dist.all_to_all_single(tokens, x[order], received, sent)
    dist.all_to_all_single(experts, expert[order], received, sent)
    done = torch.einsum("td,tdf->tf", tokens, weights[experts - rank * local])
    back = torch.empty_like(x)
    dist.all_to_all_single(back, done, sent, received)
    combined = torch.empty_like(x)
    combined[order] = back
    out.copy_(combined * gate[:, None])


def golden_ep_moe(t):
    every = t["weights"].double().flatten(0, 1)  # [E, D, D]: rank r holds experts r*local ...
    y = torch.einsum("rtd,rtdf->rtf", t["x"].double(), every[t["expert"]])
    t["out"].copy_(y * t["gate"].double()[..., None])


def allreduce_specs(ranks=2, values=4096):
    return [TensorSpec("x", (ranks, values), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("out", (values,), torch.float32)]


def linear_specs(split: str, ranks=2, m=32, k=64, n=48):
    """x [M, K] times weight [K, N]; `split` "rows": K = k per rank (row-parallel), "columns":
    N = n per rank (column-parallel)."""
    if split == "rows":
        return [TensorSpec("x", (ranks, m, k), torch.float32, torch.randn, resident=STACKED),
                TensorSpec("weight", (ranks, k, n), torch.float32, torch.randn, resident=STACKED),
                TensorSpec("out", (m, n), torch.float32)]
    return [TensorSpec("x", (m, k), torch.float32, torch.randn),
            TensorSpec("weight", (ranks, k, n), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("out", (m, n * ranks), torch.float32)]


def cp_specs(ranks=2, chunk=32, heads=4, dim=64):
    return [TensorSpec("q", (ranks, chunk, heads, dim), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("kv", (ranks, chunk, dim), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("out", (ranks, chunk, heads, dim), torch.float32, resident=STACKED)]


def moe_specs(ranks=2, tokens=64, dim=32, local=2):
    experts = functools.partial(torch.randint, 0, ranks * local, (ranks, tokens))
    return [TensorSpec("x", (ranks, tokens, dim), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("expert", (ranks, tokens), torch.int64, experts, resident=STACKED),
            TensorSpec("gate", (ranks, tokens), torch.float32, torch.rand, resident=STACKED),
            TensorSpec("weights", (ranks, local, dim, dim), torch.float32, torch.randn, resident=STACKED),
            TensorSpec("out", (ranks, tokens, dim), torch.float32, resident=STACKED)]


SPECS = {"allreduce": allreduce_specs, "row_parallel_linear": functools.partial(linear_specs, "rows"),
         "column_parallel_linear": functools.partial(linear_specs, "columns"), "cp_prefill_attention": cp_specs,
         "ep_moe": moe_specs}


def case(name: str, ranks: int = None, **options) -> Case:
    """The case of kernel `name` (at the kernel's world size unless `ranks` says otherwise). Every
    output is fp32 sums in another order than the float64 golden's: a few ulp of its magnitude."""
    return Case(name if ranks is None else f"{name}_{ranks}ranks", specs=SPECS[name], kernel=globals()[name],
                golden=globals()[f"golden_{name}"], ranks=ranks, rtol=1e-4, atol=1e-4, **options)


CASES = [case(name) for name in SPECS]
