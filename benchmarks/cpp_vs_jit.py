"""The C++ kernels against their JIT (AOTInductor) versions and the golden, measured side by side.

For rms_norm, softmax and gemm (fp32), the C++ case of kernels/cpp_kernels.py and
the JIT module's case each run through `golden_tasks.run` in one temporary
cache (and TorchInductor cache); both must pass. The medians of 100 timed rounds
after 5 warmups are compared, and with the golden's (from the C++ run: the same
function on the same inputs). Kernel times include the call wrapper: ctypes for
C++, the AOTInductor runner for JIT.

    python benchmarks/cpp_vs_jit.py
    GOLDEN_TASKS_THREADS=1 python benchmarks/cpp_vs_jit.py     (single-threaded kernels and golden)

Threads default to every core. On a machine busy with other work, a parallel
region waits at its barrier for a thread the scheduler has parked: calls then
take a scheduler tick (~8 ms) instead of microseconds. One thread avoids it.
"""
import importlib
import os
import sys
import tempfile
from pathlib import Path

import golden_tasks
from golden_tasks.project import config

ROOT = Path(__file__).resolve().parents[1]
PAIRS = (("rms_norm_cpp", "rms_norm"), ("softmax_cpp", "softmax"), ("gemm_cpp", "gemm"))


def median_us(module, name: str, cache: str):
    """Run the case `name` of `module`; the medians of its kernel and its golden, microseconds."""
    case = next(c for c in module.CASES if c.name == name).resolved(module)
    result = golden_tasks.run(case.kernel, case.specs, case.golden, name=name, rtol=case.rtol, atol=case.atol,
                              compare=case.compare, backend=case.backend, warmup=5, rounds=100,
                              cache_dir=cache, runs_dir=f"{cache}/runs")
    if not result.passed:
        sys.exit(f"{name} did not pass:\n{result.error}")
    return result.bench.median, result.golden_bench.median


def main():
    sys.path.insert(0, str(ROOT))  # the project root, for `kernels`
    from kernels import cpp_kernels

    rows = []
    with tempfile.TemporaryDirectory(prefix="golden-cpp-jit-") as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{tmp}/inductor"
        for cpp_name, jit_name in PAIRS:
            cpp_us, golden_us = median_us(cpp_kernels, cpp_name, f"{tmp}/cache")
            aoti_us, _ = median_us(importlib.import_module(f"kernels.{jit_name}"), jit_name, f"{tmp}/cache")
            rows.append((jit_name, cpp_us, aoti_us, golden_us))
    print(f"medians of 100 rounds, microseconds; threads: {config.current().threads_per_worker()}")
    print(f"{'kernel':10} {'C++':>8} {'AOTI':>8} {'golden':>8} {'C++/AOTI':>9} {'golden/C++':>11}")
    for name, cpp_us, aoti_us, golden_us in rows:
        print(f"{name:10} {cpp_us:8.1f} {aoti_us:8.1f} {golden_us:8.1f} {cpp_us / aoti_us:9.2f} "
              f"{golden_us / cpp_us:10.2f}x")


if __name__ == "__main__":
    main()
