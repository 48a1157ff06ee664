"""A cached case under the pytest plugin, against the same case cold, measured side by side in one run.

A temporary project configured only by its pyproject.toml ([tool.golden-tasks] kernels = ["src/mykernels"])
holds a copy of the library's rms_norm module. `pytest` runs its cases cold (own cache, own TorchInductor
cache, the default AOTInductor backend), then RUNS more times with everything cached. The figures are
pytest's own call durations of the rms_norm item (--durations), and the wall time of the whole process.

    python benchmarks/pytest_plugin.py
"""
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = 5
ITEM = "src/mykernels/rms_norm.py::rms_norm"


def pytest_run(project: Path, env: dict) -> tuple[float, float]:
    """(call seconds of ITEM as pytest reports it, wall seconds of the whole pytest process)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=0", "-vv",
                           ITEM], cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    calls = re.findall(rf"^([\d.]+)s call +{re.escape(ITEM)}$", proc.stdout, re.M)
    if proc.returncode != 0 or len(calls) != 1:
        sys.exit(f"pytest {ITEM} failed in {project}:\n{proc.stdout}\n{proc.stderr}")
    return float(calls[0]), wall


def main():
    with tempfile.TemporaryDirectory(prefix="golden-pytest-plugin-") as tmp:
        project = Path(tmp) / "mine"
        (project / "src/mykernels").mkdir(parents=True)
        (project / "pyproject.toml").write_text('[project]\nname = "mine"\n\n[tool.golden-tasks]\n'
                                                'kernels = ["src/mykernels"]\n')
        shutil.copy(ROOT / "kernels" / "rms_norm.py", project / "src/mykernels")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")},
               "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "inductor"), "PYTHONWARNINGS": "ignore"}
        cold_call, cold_wall = pytest_run(project, env)
        cached = [pytest_run(project, env) for _ in range(RUNS)]
    cached_call = statistics.median(call for call, _ in cached)
    cached_wall = statistics.median(wall for _, wall in cached)
    print(f"{'measurement':44} {'call s':>8} {'wall s':>8}")
    print(f"{'cold: pytest ' + ITEM:44} {cold_call:8.3f} {cold_wall:8.3f}")
    print(f"{f'cached: the same, median of {RUNS}':44} {cached_call:8.3f} {cached_wall:8.3f}")
    print(f"cached call / cold call = {cached_call / cold_call:.4f}; cached call {cached_call:.3f} s (target < 1 s)")


if __name__ == "__main__":
    main()
