"""The C++ and CUDA versions of rms_norm, softmax and gemm (sources in kernels/cpp/), and
rms_norm on two ranks.

Each case reuses its JIT module's golden and tensor specs: the same shapes and,
seeded by case seed and spec name, the same inputs. The C signature adds the
sizes, so the specs here are the JIT tensors, then the sizes as int64 scalars,
then the JIT scalars (eps): pointers first, as the sources take them.
"""
import functools

import torch

from golden_tasks import STACKED, Case, In, Out, Scalar, ScalarSpec, TensorSpec, cpp
from kernels import gemm, rms_norm, softmax

F32, I64 = torch.float32, torch.int64


def c_specs(jit_specs, dtype, **sizes):
    """`jit_specs(dtype)` in C parameter order: its tensors, then one int64 scalar per `sizes`
    entry (name=(tensor, dim): that dimension of the tensor's shape), then its scalars."""
    specs = jit_specs(dtype)
    tensors = {s.name: s for s in specs if isinstance(s, TensorSpec)}
    dims = [ScalarSpec(name, I64, tensors[t].shape[d]) for name, (t, d) in sizes.items()]
    return [*tensors.values(), *dims, *(s for s in specs if isinstance(s, ScalarSpec))]


@cpp("cpp/rms_norm.cpp")
def rms_norm_cpp(x: In[F32], weight: In[F32], out: Out[F32], rows: Scalar[I64], cols: Scalar[I64],
                 eps: Scalar[F32]): ...


@cpp("cpp/softmax.cpp")
def softmax_cpp(x: In[F32], out: Out[F32], rows: Scalar[I64], cols: Scalar[I64]): ...


@cpp("cpp/gemm.cpp")
def gemm_cpp(a: In[F32], b: In[F32], c: Out[F32], m: Scalar[I64], k: Scalar[I64], n: Scalar[I64]): ...


@cpp("cpp/rms_norm.cu")
def rms_norm_cuda(x: In[F32], weight: In[F32], out: Out[F32], rows: Scalar[I64], cols: Scalar[I64],
                  eps: Scalar[F32]): ...


# The same sources on two ranks (data parallel: no communication): each rank normalizes its own
# block of rows. With the CUDA source the ranks meet in an NCCL group, one GPU each.
@cpp("cpp/rms_norm.cpp", symbol="rms_norm_cpp", ranks=2)
def rms_norm_cpp_ranks(x: In[F32], weight: In[F32], out: Out[F32], rows: Scalar[I64], cols: Scalar[I64],
                       eps: Scalar[F32]): ...


@cpp("cpp/rms_norm.cu", symbol="rms_norm_cuda", ranks=2)
def rms_norm_cuda_ranks(x: In[F32], weight: In[F32], out: Out[F32], rows: Scalar[I64], cols: Scalar[I64],
                        eps: Scalar[F32]): ...


# The baselines: torch's own ops (the JIT modules' "torch" baselines) with the C signature. The CUDA cases have
# none: these run on the CPU, and a GPU kernel's speedup over a CPU would say nothing about the kernel.
def rms_norm_torch(x, weight, out, rows, cols, eps):
    rms_norm.rms_norm_torch(x, weight, eps, out)


def softmax_torch(x, out, rows, cols):
    softmax.softmax_torch(x, out)


def gemm_torch(a, b, c, m, k, n):
    gemm.gemm_torch(a, b, c)


ROW_SIZES = {"rows": ("x", 0), "cols": ("x", 1)}
rms_norm_specs = functools.partial(c_specs, rms_norm.specs, F32, **ROW_SIZES)


def rows_per_rank_specs(ranks=2):
    """rms_norm's specs with x and out stacked: rank r gets rows [r*R/W, (r+1)*R/W), R/W per rank."""
    whole = {s.name: s for s in rms_norm.specs(F32)}
    rows, cols = whole["x"].shape
    per_rank = -(-rows // ranks)
    return [TensorSpec("x", (ranks, per_rank, cols), F32, torch.randn, resident=STACKED), whole["weight"],
            TensorSpec("out", (ranks, per_rank, cols), F32, resident=STACKED),
            ScalarSpec("rows", I64, per_rank), ScalarSpec("cols", I64, cols), whole["eps"]]

# u = 2^-24, the fp32 unit roundoff; the goldens are float64, their own error is negligible. The
# simd reductions keep L >= 8 partial sums (AVX2; 16 with AVX-512), each over cols/L terms, then
# combine them: a sum of positive terms is off by at most (cols/L + log2 L)·u relative.
CASES = [
    # Sum of squares over cols=300: <= (38 + 3)·u = 2.4e-6, halved by the sqrt; then +eps, sqrt,
    # divide and two products, ~5 roundings = 3e-7: under 1.5e-6 relative. rtol=1e-5 as the JIT case.
    Case("rms_norm_cpp", specs=rms_norm_specs, kernel=rms_norm_cpp, golden=rms_norm.golden_rms_norm,
         rtol=1e-5, atol=1e-6, baselines={"torch": rms_norm_torch}),
    # x - max rounds (|x - max| < 9 for randn: 9u = 5e-7 relative in the exponential), gt_expf is
    # within 1.01 ulp (1.2e-7), the sum over cols=200 <= (25 + 3)·u = 1.7e-6, then the reciprocal
    # and the product: under 2.6e-6 relative. rtol=1e-5 as the JIT case.
    Case("softmax_cpp", specs=functools.partial(c_specs, softmax.specs, F32, **ROW_SIZES), kernel=softmax_cpp,
         golden=softmax.golden_softmax, rtol=1e-5, atol=1e-8, baselines={"torch": softmax_torch}),
    # Each c[i, j] is a sequential fp32 (FMA) sum of K=96 products: |error| <= K·u·Σ|a·b| ≈ 3.5e-4
    # worst case, but the roundings are independent, so ~sqrt(K)·u·Σ|a·b| ≈ 10·6e-8·60 ≈ 4e-5 in
    # practice (observed ≤ 1.5e-5): atol=1e-4 as the JIT case; sums cancel, so rtol adds little.
    Case("gemm_cpp", specs=functools.partial(c_specs, gemm.specs, F32, m=("a", 0), k=("a", 1), n=("b", 1)),
         kernel=gemm_cpp, golden=gemm.golden_gemm, rtol=1e-5, atol=1e-4, baselines={"torch": gemm_torch}),
    # A tree over 256 threads (cols/256 ≤ 2 sequential terms, then 8 levels): ~10u, and rsqrtf's
    # 2 ulp: rtol=1e-5. Dispatch, validate and bench need a GPU: without one the case is SKIPPED.
    Case("rms_norm_cuda", specs=rms_norm_specs, kernel=rms_norm_cuda, golden=rms_norm.golden_rms_norm,
         rtol=1e-5, atol=1e-6),
    # Each rank runs rms_norm_cpp on its rows: its bound.
    Case("rms_norm_cpp_ranks", specs=rows_per_rank_specs, kernel=rms_norm_cpp_ranks,
         golden=rms_norm.golden_rms_norm, rtol=1e-5, atol=1e-6, baselines={"torch": rms_norm_torch}),
    # Skipped without as many GPUs as ranks.
    Case("rms_norm_cuda_ranks", specs=rows_per_rank_specs, kernel=rms_norm_cuda_ranks,
         golden=rms_norm.golden_rms_norm, rtol=1e-5, atol=1e-6),
]
