"""Replay time against cold verify time for the same case, measured side by side.

A temporary copy of the project verifies one case cold (its own cache and
TorchInductor cache, AOTInductor backend), then replays its runtime dir with
`golden-tasks replay`: no compile, no input generation, no golden.

    python benchmarks/replay_vs_verify.py [CASE]      (default: rms_norm)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd, cwd, env) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - start


def main(case="rms_norm"):
    module = case.removesuffix("_bf16")
    with tempfile.TemporaryDirectory(prefix="golden-replay-") as tmp:
        path = Path(tmp) / "project"
        (path / "kernels").mkdir(parents=True)
        shutil.copy(ROOT / "dodo.py", path)
        for name in ("__init__.py", f"{module}.py"):
            shutil.copy(ROOT / "kernels" / name, path / "kernels" / name)
        env = {**os.environ, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs"),
               "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), "PYTHONWARNINGS": "ignore"}
        verify = timed([sys.executable, "-m", "doit", f"verify:{case}"], path, env)
        replay = timed([sys.executable, "-m", "golden_tasks.cli", "replay", str(path / "runs" / case)], path, env)
    print(f"{'measurement':28} {'seconds':>8}")
    print(f"{'cold verify:' + case:28} {verify:8.2f}")
    print(f"{'replay runs/' + case:28} {replay:8.2f}")
    print(f"replay / cold verify = {replay / verify:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
