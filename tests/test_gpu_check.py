"""benchmarks/gpu_check.py where there is no GPU: the wheels it carries to a GPU machine are prepared from the
package registries (what the machine lacks, for its Python 3.12, small enough to travel with the working tree),
and its run is a dry run that lists every GPU check with why it is skipped, and the GPU tests it would run."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from project import ROOT

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: the check runs for real, not dry")
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
# what golden-tasks needs (and pytest, for the GPU tests) that the GPU machines do not hold
NEEDED = {"doit", "cloudpickle", "xxhash", "filelock", "matplotlib", "rich", "watchfiles", "pytest"}
HELD = {"torch", "numpy", "triton"}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("wheels")
    done = subprocess.run([sys.executable, str(SCRIPT), "prepare", "--wheels", str(folder)], capture_output=True,
                          text=True, timeout=600)
    return folder, done


@pytest.mark.e2e
def test_the_wheels_are_what_a_gpu_machine_lacks_for_its_python_and_travel_with_the_tree(wheels):
    folder, done = wheels
    assert done.returncode == 0, done.stdout + done.stderr
    found = {w.name.split("-")[0].lower().replace("_", "-"): w.name for w in folder.glob("*.whl")}
    assert NEEDED <= set(found) and not HELD & set(found), sorted(found)
    for name in found.values():  # CPython 3.12 on x86_64 Linux: pure Python, or built for it
        python, abi, platform = name[:-len(".whl")].split("-")[-3:]
        assert python in ("py3", "py2.py3") or "cp312" in python or (abi == "abi3" and python <= "cp312"), name
        assert platform == "any" or ("manylinux" in platform and platform.endswith("x86_64")), name
    carried = re.search(r"= ([\d.]+) MiB of the 64 MiB carried: fits", done.stdout)
    assert carried and float(carried[1]) < 64, done.stdout


@pytest.mark.e2e
def test_without_a_gpu_the_check_is_a_dry_run_that_lists_what_it_would_check(wheels, tmp_path):
    folder, _ = wheels
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(SCRIPT), "run", str(out), "--wheels", str(folder)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    table = (out / "table.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith(("| check", "| ---"))}
    assert rows["environment"][0] == "PASS" and f"torch {torch.__version__}" in rows["environment"][2]
    assert rows["wheels"][0] == "PASS" and "installable for Python 3.12" in rows["wheels"][2]
    for check in ("library", "do_bench", "gpu tests"):
        assert rows[check][0] == "SKIPPED" and "no CUDA device here" in rows[check][2], rows[check]
    assert "would verify rms_norm_cuda, rms_norm_cuda_ranks, rms_norm_triton" in rows["library"][2]
    collected = int(re.search(r"(\d+) tests of GPU paths collected", rows["gpu tests"][2])[1])
    listed = re.findall(r"^- (tests/\S+)$", table, re.M)
    assert collected == len(listed) >= 10 and "tests/test_bench.py::test_a_cuda_kernel_is_timed_with_events_and_a_" \
        "cold_l2_on_its_gpu" in listed
    assert any(name.startswith("tests/exploits/test_gpu_exploits.py::") for name in listed)
    assert (out / "logs" / "environment.log").exists() and not (out / "site").exists()  # nothing installed


def test_the_floor_the_check_holds_the_machine_to_is_the_packages():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert gpu_check._torch_floor() == "2.11" and gpu_check._version("2.11.0+cu130") >= gpu_check._version("2.11")
    assert gpu_check._version("2.10.1") < gpu_check._version("2.11")
    assert Path(gpu_check.ROOT) == ROOT
