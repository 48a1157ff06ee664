"""The bench stage's time of a Triton kernel against triton.testing.do_bench on the same kernel, settings,
inputs and GPU, side by side in one run: their ratio should be within 5%.

Like with like: do_bench empties the L2 cache before every call and reports the mean of CUDA-event
timings, so the cases are verified with `flush=1` (the bench stage evicts the GPU's L2 before each round)
and the bench stage's *mean* is compared. Each library Triton case that runs on a GPU is verified cold in a
temporary copy of the library (its own cache), then do_bench times the same launcher, at the same
meta-parameters, on the case's inputs made on the GPU.

Needs an NVIDIA GPU with CUDA (the interpreter's times are no performance figures): without one it says
so and measures nothing.

    python benchmarks/triton_vs_do_bench.py [--cases matmul_triton_bf16 ...] [--record RUNS/report.json]
                                            [--json OUT.json]

--record reads the bench means from the run record of a run that verified the cases with flush=1 (the GPU
check's: benchmarks/gpu_check.py) instead of verifying them again; --json writes the rows for a script.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = ("matmul_triton_bf16", "rms_norm_triton_bf16", "softmax_triton_bf16", "decode_swa_triton", "matmul_triton",
         "rms_norm_triton", "softmax_triton", "decode_swa_triton_f32")


def verified(where: Path, cases) -> dict:
    """case -> (status, the bench stage's mean in us) of a cold `doit verify` of `cases` with flush=1."""
    shutil.copy(ROOT / "dodo.py", where)
    shutil.copytree(ROOT / "kernels", where / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "GOLDEN_TASKS_CACHE": str(where / "cache"), "GOLDEN_TASKS_RUNS": str(where / "runs"),
           "GOLDEN_TASKS_HTML": "0"}
    subprocess.run([sys.executable, "-m", "doit", *[f"verify:{c}" for c in cases], "flush=1"],
                   cwd=where, env=env, check=False, capture_output=True)
    return recorded(where / "runs" / "report.json")


def recorded(path: Path) -> dict:
    """case -> (status, the bench stage's mean in us) of the run record at `path`."""
    rows = json.loads(Path(path).read_text())["cases"]
    return {r["case"]: (r["status"], (r.get("kernel_timing") or {}).get("mean")) for r in rows}


def do_bench_us(case_name: str) -> float:
    """triton.testing.do_bench's mean (us) of the case's launcher on its inputs, on the GPU."""
    import importlib

    import triton.testing

    from golden_tasks.planning.case import module_cases
    from golden_tasks.stages import make

    modules = [importlib.import_module(f"kernels.{m}") for m in ("triton_kernels", "triton_decode_swa")]
    (case,) = [c.resolved(m) for m in modules for c in module_cases(m) if c.name == case_name]
    tensors = {s.name: s.argument(lambda t: make(t, case.seed).cuda()) for s in case.specs}
    launcher, options = case.kernel, case.options or {}
    args = [tensors[row.name] for row in launcher.params()]
    return triton.testing.do_bench(lambda: launcher(*args, **options), return_mode="mean") * 1e3


def compare(ours: dict, cases) -> list:
    """A row per case: its status, the bench stage's mean, do_bench's mean and their ratio (us; None where
    there is none), printed as it is measured."""
    rows = []
    print(f"{'case':24} {'status':8} {'bench mean us':>14} {'do_bench us':>12} {'ratio':>7}", flush=True)
    for case in cases:
        status, mean = ours.get(case, ("missing", None))
        theirs = do_bench_us(case) if status == "PASS" else None
        ratio = mean / theirs if mean and theirs else None
        rows.append({"case": case, "status": status, "bench_us": mean, "do_bench_us": theirs, "ratio": ratio})
        print(f"{case:24} {status:8} {mean or float('nan'):14.2f} {theirs or float('nan'):12.2f} "
              f"{'-' if ratio is None else format(ratio, '.3f'):>7}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=CASES)
    parser.add_argument("--record", type=Path, help="the report.json of a run that verified the cases with flush=1")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the interpreter's times are no performance figures, so nothing is measured")
        raise SystemExit(2)
    if args.record:
        rows = compare(recorded(args.record), args.cases)
    else:
        with tempfile.TemporaryDirectory(prefix="triton-vs-do-bench-") as where:
            ours = verified(Path(where), args.cases)
            sys.path.insert(0, where)  # its kernels package
            rows = compare(ours, args.cases)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
