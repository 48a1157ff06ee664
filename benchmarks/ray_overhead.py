"""What running the stages on a Ray cluster costs and buys, side by side in one run.

A temporary copy of the kernel library (`--modules`, default a few small modules; `--all`: every module),
verified cold with `backend=eager` (so the figures are about scheduling, not AOTInductor) in a fresh cache
each time:

- locally: `doit -n N verify`, N the CPUs of one node;
- on a local Ray cluster (ray.cluster_utils.Cluster: a head with no CPUs) of one node of N CPUs;
- on the same cluster with a second node of N CPUs added.

It prints the per-stage overhead of Ray submission against the local run (the extra wall time divided by
the stages that ran, and the wall-time ratio), and the cold-library wall time with one node against two.
Every node of a cluster started here shares this machine's cores: two nodes can only show what a second
machine would add where the cores allow it (say so when reading the figure).

    python benchmarks/ray_overhead.py [--modules hello_world rms_norm softmax] [--all] [--cpus 2]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from golden_tasks.project.toolchain import node_class  # noqa: E402


def project(where: Path, modules) -> Path:
    shutil.copy(ROOT / "dodo.py", where)
    (where / "kernels").mkdir()
    for source in sorted((ROOT / "kernels").glob("*.py")):
        if modules is None or source.stem in modules or source.stem.startswith("_"):
            shutil.copy(source, where / "kernels" / source.name)
    if modules is None:
        shutil.copytree(ROOT / "kernels" / "cpp", where / "kernels" / "cpp")
    return where


def verify(where: Path, name: str, workers: int, address: str = None) -> tuple:
    """(wall seconds, stages that ran) of a cold `doit verify` in its own cache."""
    env = {**os.environ, "GOLDEN_TASKS_CACHE": str(where / f"cache-{name}"), "GOLDEN_TASKS_RUNS": str(where / name),
           "GOLDEN_TASKS_HTML": "0", "PYTHONWARNINGS": "ignore"}
    args = [sys.executable, "-m", "doit", "-n", str(workers), "verify", "backend=eager"]
    if address:
        args.append("executor=ray")
        env["RAY_ADDRESS"] = address
    start = time.perf_counter()
    run = subprocess.run(args, cwd=where, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if run.returncode:
        sys.exit(f"{name}: doit verify failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    record = json.loads((where / name / "report.json").read_text())
    return wall, sum(state == "ran" for case in record["cases"] for state in case["stages"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", nargs="+", default=["hello_world", "rms_norm", "softmax"])
    parser.add_argument("--all", action="store_true", help="every module of the library")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of each node (default: this machine's)")
    args = parser.parse_args()
    from ray.cluster_utils import Cluster  # the ray extra: only when run

    with tempfile.TemporaryDirectory(prefix="gt-ray-bench-") as tmp:
        where = project(Path(tmp), None if args.all else set(args.modules))
        node = {"num_cpus": args.cpus, "resources": {node_class(): 1000}}
        local, stages = verify(where, "local", args.cpus)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            one, _ = verify(where, "one-node", args.cpus, cluster.address)
            cluster.add_node(**node)
            cluster.wait_for_nodes()
            two, _ = verify(where, "two-nodes", 2 * args.cpus, cluster.address)
        finally:
            cluster.shutdown()
    print(f"library: {'every module' if args.all else ', '.join(args.modules)}; {stages} stages ran cold; "
          f"{os.cpu_count()} cores here, {args.cpus} CPUs per node")
    print(f"local   -n {args.cpus}: {local:7.1f} s")
    print(f"ray, one node : {one:7.1f} s  ({one / local:.2f}x local; "
          f"{(one - local) / stages * 1000:+.0f} ms per stage of Ray submission)")
    print(f"ray, two nodes: {two:7.1f} s  ({two / one:.2f}x one node)")


if __name__ == "__main__":
    main()
