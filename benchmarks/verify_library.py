"""Wall times of verifying the kernel library, measured side by side in one run.

Each measurement runs real `doit` in a temporary copy of the project with its
own cache (and its own empty TorchInductor cache for the cold runs, so that
neither cold run reuses the other's compiled code). Prints the times and the
ratios: warm no-op / cold, golden-edit / cold, cold -n 2 / cold -n 1.

    python benchmarks/verify_library.py
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_LINE = 't["out"].copy_(x / rms * t["weight"].double())'
GOLDEN_EDIT = 't["out"].copy_(x / rms * t["weight"].double() * (1 + 2**-20))'


def project(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.mkdir()
    shutil.copy(ROOT / "dodo.py", path)
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return path


def doit(path: Path, *args, inductor_cache: Path = None) -> float:
    env = {**os.environ, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs"),
           "PYTHONWARNINGS": "ignore"}
    if inductor_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=path, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"doit {' '.join(args)} failed in {path}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main():
    with tempfile.TemporaryDirectory(prefix="golden-bench-") as tmp:
        tmp = Path(tmp)
        one, two = project(tmp, "n1"), project(tmp, "n2")
        cold_1 = doit(one, "-n", "1", "verify", inductor_cache=tmp / "inductor-n1")
        cold_2 = doit(two, "-n", "2", "verify", inductor_cache=tmp / "inductor-n2")
        warm = statistics.median(doit(one, "verify") for _ in range(5))
        module = one / "kernels" / "rms_norm.py"
        module.write_text(module.read_text().replace(GOLDEN_LINE, GOLDEN_EDIT))
        golden_edit = doit(one, "verify")
    rows = [
        ("cold verify, -n 1", cold_1, None),
        ("cold verify, -n 2", cold_2, f"{cold_2 / cold_1:.2f} of -n 1"),
        ("warm no-op verify (median of 5)", warm, f"{warm / cold_1:.4f} of cold"),
        ("golden-edit re-verify", golden_edit, f"{golden_edit / cold_1:.4f} of cold"),
    ]
    print(f"{'measurement':34} {'seconds':>9}  ratio")
    for name, seconds, ratio in rows:
        print(f"{name:34} {seconds:9.2f}  {ratio or ''}")


if __name__ == "__main__":
    main()
