"""The rank pool's cost per benchmark round against a bare torch.distributed loop, side by side.

Both run the same trivial collective (an all-reduce of N float32 values) on the
same world size with gloo:

- bare: W processes meeting through torchrun-style variables, each timing a
  plain loop of `dist.all_reduce` (no barriers, no per-round clock reads);
- pool: the bench stage's machinery (golden_tasks.forms.ranks.run with
  stages.bench.time_kernel): isolated rank processes, placement, a barrier
  before and after every round, each rank timing its own call. Its cost per
  round is the slope of the pool's wall time between two round counts (the
  fastest of three pools each), so its one-off start (forks, joining the group,
  placing) is apart: a pool of one round shows it.

    python benchmarks/rank_pool.py [--world 2] [--values 1024] [--rounds 400]
"""
import argparse
import functools
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BARE = """
import os, sys, time, datetime, torch, torch.distributed as dist
world, values, rounds = int(os.environ["WORLD_SIZE"]), int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(max(1, torch.get_num_threads() // world))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
x = torch.ones(values)
for _ in range(20):
    dist.all_reduce(x)
dist.barrier()
start = time.perf_counter()
for _ in range(rounds):
    dist.all_reduce(x)
elapsed = time.perf_counter() - start
dist.destroy_process_group()
print(elapsed / rounds * 1e6)
"""


def bare(world: int, values: int, rounds: int) -> float:
    """Microseconds per all-reduce in a plain loop, the slowest rank's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free a moment ago; rank 0 binds it
    procs = [subprocess.Popen([sys.executable, "-c", BARE, str(values), str(rounds)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                              "WORLD_SIZE": str(world), "RANK": str(r)})
             for r in range(world)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"the bare loop failed: {outs}")
    return max(float(o) for o in outs)


def pool(world: int, values: int, rounds: int) -> tuple:
    """(microseconds per round, seconds for a pool of one round: its start) of the bench stage's rank pool."""
    import torch

    from golden_tasks.forms import ranks
    from golden_tasks.model.outputs import InputsMeta, Outputs
    from golden_tasks.model.plan import BenchSettings
    from golden_tasks.stages import bench
    from kernels.collectives import allreduce, allreduce_specs

    directions = {p.name: p.direction for p in allreduce.params()}
    specs = [s.stamped(directions[s.name]) for s in allreduce_specs(world, values)]
    with tempfile.TemporaryDirectory(prefix="golden-rank-pool-") as tmp:
        artifact = allreduce.compile([s.rank_view() for s in specs], {"backend": None, "ranks": world}, Path(tmp))
        inputs = Outputs(tensors={"x": torch.ones(world, values)}, meta=InputsMeta())

        def wall(n: int) -> float:
            # as stages.bench.run sets a pool up: two argument sets (here two copies of the inputs) the rounds
            # alternate between, the buffers the ranks' sampled outputs go to, the witness of their CPU time
            sets = [ranks.Placement(artifact.table, {"x": "stacked"}, inputs, world) for _ in range(2)]
            witness = bench._Witness(world)
            program = functools.partial(bench.time_kernel, rule=BenchSettings(warmup=0, rounds=n),
                                        table=artifact.table, device=artifact.device, sets=len(sets),
                                        draw=secrets.randbits(32), slots=bench._slots(sets[0]),
                                        marks=witness.writer, read=witness.read)
            try:
                start = time.perf_counter()
                ranks.run(program, artifact, sets[0], 60.0, n + 1, "the benchmark", also=sets[1:])
                return time.perf_counter() - start
            finally:
                witness.close()

        wall(1)  # the forkserver starts once
        one, short, long = (min(wall(n) for _ in range(3)) for n in (1, rounds // 4, rounds))
    return (long - short) / (rounds - rounds // 4) * 1e6, one


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--values", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    bare_us = bare(args.world, args.values, args.rounds)
    pool_us, start_s = pool(args.world, args.values, args.rounds)
    print(f"all-reduce of {args.values} float32 on {args.world} ranks (gloo), {os.cpu_count()} cores")
    print(f"{'measurement':36} {'us/round':>10}")
    print(f"{'bare torch.distributed loop':36} {bare_us:10.1f}")
    print(f"{'rank pool (barriers, per-rank clock)':36} {pool_us:10.1f}")
    print(f"ratio pool / bare: {pool_us / bare_us:.2f}x")
    print(f"a pool of one round (start, meet, place, one round, leave): {start_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
