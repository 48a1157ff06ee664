"""Multi-rank kernels: placement over ranks, the rank pool (real processes, real gloo), its faults,
and the library's multi-rank kernels at world sizes 2 and 4."""
import dataclasses
import json
import socket
import subprocess
import sys
import uuid

import pytest
import torch

import golden_tasks
from golden_tasks.forms import ranks
from golden_tasks.forms.isolate import Ended, Outcome
from golden_tasks.model.errors import StageFailed
from golden_tasks.model.outputs import InputsMeta, Outputs
from golden_tasks.model.rows import ParamRow
from golden_tasks.stages import imbalance, rank_stats
from kernels import collectives, decode_attention
from tests.project import Project
from tests.test_hostile import assert_nothing_left


def table(*rows):
    return [ParamRow(n, "tensor", d, "float32", s) for n, d, s in rows]


def test_each_rank_gets_its_view_and_outputs_come_back_whole():
    rows = table(("whole", "in", (3,)), ("sliced", "in", (3,)), ("on_one", "in", (3,)),
                 ("out_sliced", "out", (2,)), ("out_whole", "inout", (2,)), ("out_on_one", "out", (2,)))
    place = {"sliced": "stacked", "on_one": 1, "out_sliced": "stacked", "out_on_one": 1}
    inputs = Outputs(tensors={"whole": torch.arange(3.), "sliced": torch.arange(6.).reshape(2, 3),
                              "on_one": torch.full((3,), 7.), "out_whole": torch.ones(2)}, meta=InputsMeta())
    p = ranks.Placement(rows, place, inputs, 2)
    assert p.args[0][0].tolist() == p.args[1][0].tolist() == [0, 1, 2]
    assert p.args[0][1].tolist() == [0, 1, 2] and p.args[1][1].tolist() == [3, 4, 5]
    assert p.args[0][2].tolist() == [0, 0, 0] and p.args[1][2].tolist() == [7, 7, 7]  # rank 0: a buffer only
    assert all(a.is_shared() for args in p.args.values() for a in args)
    for r in range(2):  # what the kernel on each rank writes
        p.args[r][3].copy_(torch.tensor([r, r + 0.5]))
        p.args[r][4].add_(1)
        p.args[r][5].fill_(10 + r)
    got = p.outputs("k")
    assert got["out_sliced"].tolist() == [[0, 0.5], [1, 1.5]] and got["out_whole"].tolist() == [2, 2]
    assert got["out_on_one"].tolist() == [11, 11]
    p.args[0][2].fill_(3)  # a write to a rank's receive buffer is allowed; to the held input is not
    p.check_inputs_untouched(inputs, "k")
    p.args[1][1][0] = -1
    with pytest.raises(StageFailed, match=r"^k wrote its In parameter 'sliced' on rank 1: inputs are read-only"):
        p.check_inputs_untouched(inputs, "k")
    p.args[1][4].add_(1)
    with pytest.raises(StageFailed, match=r"output 'out_whole' is whole on every rank .* rank 1's copy differs"):
        p.outputs("k")
    p.guards[1][5].buffer[-1] = 0
    with pytest.raises(StageFailed, match=r"guard region out_on_one \(after\) on rank 1 lost its canary"):
        p.check_guards("k")


def failed(phase, communication, text="RuntimeError: boom"):
    return Outcome(Ended.RETURNED, ranks.RankFailure(phase, communication, text))


@pytest.mark.parametrize("outcomes,culprit,said", [
    ([failed(ranks.IN_KERNEL, True), Outcome(Ended.CRASHED, "killed by signal SIGSEGV")], 1, "crashed: killed by signal"),
    ([failed(ranks.IN_KERNEL, True), failed(ranks.IN_KERNEL, False, "ValueError: mine")], 1, "an error in its kernel"),
    ([failed(ranks.IN_KERNEL, True), Outcome(Ended.HUNG, 9)], 1, "hung: still running after the other ranks had failed"),
    ([failed(ranks.AFTER_KERNEL, True), failed(ranks.IN_KERNEL, True)], 1, "hung in a collective in its kernel"),
])
def test_the_verdict_names_the_rank_at_fault_not_its_victims(outcomes, culprit, said):
    verdict = ranks.verdict(outcomes, "the kernel of k")
    first, *rest = verdict.splitlines()
    assert first.startswith(f"the kernel of k failed on rank {culprit} (of 2): {said}")
    assert "what the other ranks saw:" in rest and f"  rank {1 - culprit}: a failed collective" in "\n".join(rest)


def test_rank_timings_take_the_slowest_rank_per_round_and_flag_a_persistent_one():
    def answer(times, warmup=0):  # what time_kernel returns on a rank
        return {"times": times, "stopped": "rounds", "warmup": warmup, "cpu": [],
                "where": {"device": "cpu", "threads": 1}}

    fast, slow = [10.0] * 10, [10.5, 13, 14, 13, 12, 13, 14, 13, 13, 13]
    timing = rank_stats([answer(fast, 1), answer(slow, 1)], placed=[2, 2])
    assert timing.median == 13 and timing.rounds == 10 and timing.warmup == 1 and timing.threads == 1
    assert [r.slowest_rounds for r in timing.ranks] == [0, 10] and timing.ranks[1].placed == 2
    assert timing.imbalance.startswith("rank 1 was the slowest in 100% of the rounds; its median is 1.30x")
    noisy = rank_stats([answer([10, 12, 10, 12]), answer([12, 10, 12, 10])], placed=[1, 1])
    assert noisy.imbalance is None and imbalance(noisy.ranks) is None
    assert rank_stats([answer(fast[:9]), answer(slow[:9])], placed=[1, 1]).imbalance is None  # too few rounds
    assert rank_stats([answer(fast)], placed=[1]).ranks is None  # one rank: the plain timing


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ranks-cache")


def verify(case, cache, **options):
    options = {"rtol": case.rtol, "atol": case.atol, "compare": case.compare, "ranks": case.ranks, "rounds": 3,
               "warmup": 1, **options}
    return golden_tasks.run(case.kernel, case.specs, case.golden, name=case.name, cache_dir=cache / "cache",
                            runs_dir=cache / "runs", **options)


@pytest.mark.e2e
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", [*collectives.SPECS, "decode_hca_tp"])
def test_library_kernels_pass_at_two_and_four_ranks(name, world, cache):
    case = collectives.case(name, world) if name in collectives.SPECS else \
        dataclasses.replace(decode_attention.case(name), name=f"{name}_{world}ranks", ranks=world)
    result = verify(case, cache)
    assert result.passed, result.error
    # each round takes its slowest rank's time, so the rounds' median is at least every rank's
    assert len(result.bench.ranks) == world
    assert result.bench.median >= max(r.median for r in result.bench.ranks)


def test_a_stacked_spec_with_the_wrong_leading_dim_fails_before_any_rank_starts(cache):
    case = collectives.case("allreduce", 4)
    result = verify(dataclasses.replace(case, specs=collectives.allreduce_specs(3)), cache)
    assert not result.passed and result.stages["abi"] == "FAILED"
    assert "spec 'x': resident='stacked' needs leading dim 4 (one slice per rank of world size 4), " \
           "spec has shape [3, 4096]" in result.error


COUNTED = '''
import os
import torch.distributed as dist
from golden_tasks import In, Out, jit


@jit(ranks=2)
def counted(x: In, weight: In, out: Out):
    with open(os.path.join(os.environ["GT_PLACEMENTS"], f"rank{dist.get_rank()}"), "a") as log:
        log.write(f"{x.data_ptr()} {weight.data_ptr()}\\n")
    out.copy_(x * weight)
    dist.all_reduce(out)
'''


@pytest.mark.e2e
def test_resident_tensors_are_placed_once_for_every_benchmark_round(tmp_path, monkeypatch):
    (tmp_path / "counted.py").write_text(COUNTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GT_PLACEMENTS", str(tmp_path))
    monkeypatch.setenv("GOLDEN_TASKS_SANDBOX", "off")  # a confined kernel could not write the test's log
    from counted import counted

    specs = [golden_tasks.TensorSpec("x", (2, 64), torch.float32, torch.randn, resident="stacked"),
             golden_tasks.TensorSpec("weight", (64,), torch.float32, torch.randn),
             golden_tasks.TensorSpec("out", (64,), torch.float32)]

    def golden(t):
        t["out"].copy_((t["x"] * t["weight"]).sum(0))

    result = golden_tasks.run(counted, specs, golden, cache_dir=tmp_path / "cache", runs_dir=tmp_path / "runs",
                              warmup=5, rounds=100, atol=1e-5, env_deps=("GT_PLACEMENTS",))
    assert result.passed, result.error
    # x, weight, out of each input set (the two checked ones the rounds alternate, and the three the kernel
    # meets once each): once, not per round
    assert [r.placed for r in result.bench.ranks] == [15, 15]
    for rank in (0, 1):
        calls = (tmp_path / f"rank{rank}").read_text().splitlines()
        # the validation call's pool, then the benchmark's warmup and rounds: five argument sets, placed once,
        # and no two consecutive calls on the same buffers
        assert len(calls) == 1 + 105
        assert len(set(calls[1:])) == 5 and all(a != b for a, b in zip(calls[1:], calls[2:]))


WRONG_SLICE = '''
import torch.distributed as dist
from golden_tasks import In, Out, jit


@jit(ranks=3)
def doubled(x: In, out: Out):
    out.copy_(x * (3 if dist.get_rank() == 1 else 2))  # rank 1 computes its slice wrong
'''


@pytest.mark.e2e
def test_a_wrong_slice_of_a_stacked_output_names_its_rank(tmp_path, monkeypatch):
    (tmp_path / "wrong_slice.py").write_text(WRONG_SLICE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from wrong_slice import doubled

    specs = [golden_tasks.TensorSpec("x", (3, 64), torch.float32, torch.randn, resident="stacked"),
             golden_tasks.TensorSpec("out", (3, 64), torch.float32, resident="stacked")]

    def golden(t):
        t["out"].copy_(t["x"] * 2)

    result = golden_tasks.run(doubled, specs, golden, cache_dir=tmp_path / "cache", runs_dir=tmp_path / "runs",
                              rounds=3, warmup=1)
    assert not result.passed and result.stages["validate"] == "FAILED", result.error
    assert "wrong on rank 1 (of 3: the leading dim is the rank)" in result.error, result.error


RANKED = '''
import ctypes
import os
import time

import torch
import torch.distributed as dist

from golden_tasks import Case, In, Out, TensorSpec, jit


def golden(t):
    t["out"].copy_(t["x"].double().sum(0))


def specs(ranks=2):
    return [TensorSpec("x", (ranks, 256), torch.float32, torch.randn, resident="stacked"),
            TensorSpec("out", (256,), torch.float32)]


@jit(ranks=2)
def good(x: In, out: Out):
    out.copy_(x)
    dist.all_reduce(out)


def faulty(name, rank, fault):
    """An all-reduce whose rank `rank` does `fault()` first."""
    def kernel(x: In, out: Out):
        if dist.get_rank() == rank:
            fault()
        out.copy_(x)
        dist.all_reduce(out)
    kernel.__name__ = name
    return jit(kernel, ranks=2)


def index_error():
    raise IndexError("row 7 is out of range on this rank")


raises = faulty("raises", 1, index_error)
exits = faulty("exits", 1, lambda: os._exit(3))
segfaults = faulty("segfaults", 0, lambda: ctypes.string_at(0))
sleeps = faulty("sleeps", 1, lambda: time.sleep(3600))


@jit(ranks=2)
def hangs_in_a_collective(x: In, out: Out):
    out.copy_(x)
    dist.all_reduce(out)
    if dist.get_rank() == 1:
        dist.recv(torch.empty(1), src=0)  # nobody sends


CASES = [Case(k.name, kernel=k, golden=golden, specs=specs, rounds=3, warmup=1, timeout=3, atol=1e-5)
         for k in (good, raises, exits, segfaults, hangs_in_a_collective, sleeps)] + [
    Case("good_too", kernel=good, golden=golden, specs=specs, rounds=3, warmup=1, atol=1e-5)]
'''
FAULTS = {
    "raises": "the kernel of raises failed on rank 1 (of 2): an error in its kernel:",
    "exits": "the kernel of exits failed on rank 1 (of 2): crashed: its process exited with code 3 without a result",
    "segfaults": "the kernel of segfaults failed on rank 0 (of 2): crashed: killed by signal SIGSEGV",
    "hangs_in_a_collective": "the kernel of hangs_in_a_collective failed on rank 1 (of 2): hung in a collective "
                             "in its kernel after the other ranks had finished theirs",
    "sleeps": "the kernel of sleeps failed on rank 1 (of 2): hung: still running after the other ranks had failed",
}


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("ranked") / "p", ())
    (proj.path / "kernels" / "ranked.py").write_text(RANKED)
    proj.mark = f"gt-run-{uuid.uuid4().hex}"
    proj.env["GT_RUN_MARK"] = proj.mark
    proj.run = proj.console("-n", "2", "--continue", "verify")
    yield proj
    assert_nothing_left(proj.mark)


@pytest.mark.e2e
def test_a_faulty_rank_fails_its_case_by_rank_and_leaves_no_process(ranked):
    rows = {r["case"]: r for r in json.loads((ranked.path / "runs" / "report.json").read_text())["cases"]}
    assert ranked.run.returncode != 0
    for case, said in FAULTS.items():
        errors = " ".join(rows[case]["errors"].values())
        assert rows[case]["status"] == "FAIL" and said in errors, (case, errors)
    assert "IndexError: row 7 is out of range on this rank" in rows["raises"]["errors"]["dispatch"]
    assert_nothing_left(ranked.mark)


@pytest.mark.e2e
def test_multi_rank_cases_verify_side_by_side_under_doit_n_2(ranked):
    rows = {r["case"]: r for r in json.loads((ranked.path / "runs" / "report.json").read_text())["cases"]}
    assert rows["good"]["status"] == rows["good_too"]["status"] == "PASS"
    assert len(rows["good"]["rank_us"]) == 2 and rows["good"]["kernel_us"] >= max(rows["good"]["rank_us"])
    # torch's store names its ranks' loopback address: in a confined pool, /etc/hosts does, not a DNS server
    # that is not there (it warned "[c10d] The hostname of the client socket cannot be retrieved" per rank)
    assert "hostname of the client socket" not in ranked.run.stdout + ranked.run.stderr


@pytest.mark.e2e
def test_a_multi_rank_runtime_dir_replays(ranked):
    proc = ranked.console("replay:good")
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.e2e
def test_ranks_variable_runs_every_multi_rank_case_at_that_world_size(ranked):
    proc = ranked.console("verify:good", "ranks=4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[W" not in proc.stdout + proc.stderr  # four confined ranks that meet and pass print nothing of torch's
    assert "dispatch:good" in proc.stdout  # another world size: another key, so it ran
    row = next(r for r in json.loads((ranked.path / "runs" / "report.json").read_text())["cases"]
               if r["case"] == "good")
    assert row["status"] == "PASS" and len(row["rank_us"]) == 4
    proc = ranked.console("verify:good", "ranks=x")
    assert proc.returncode != 0 and "golden-tasks: doit variable ranks='x' is not a world size" in proc.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(project, case: str) -> tuple[list, str]:
    """Two groups of processes (two torchrun agents, one rank each), as on two machines, meeting
    through MASTER_ADDR and MASTER_PORT: their exit codes, and what rank 0's group printed."""
    port = free_port()
    groups = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n),
                                "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                                "-m", "golden_tasks.cli", "rank", case], cwd=project.path, env=project.env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in range(2)]
    said = [g.communicate(timeout=600)[0] for g in groups]
    return [g.returncode for g in groups], said[0]


@pytest.mark.e2e
def test_a_case_runs_across_groups_of_processes_started_by_torchrun(ranked):
    codes, said = torchrun(ranked, "good")
    assert codes == [0, 0] and "good: PASS" in said, said
    codes, said = torchrun(ranked, "raises")
    assert codes[0] != 0 and codes[1] != 0
    assert "raises: FAIL\nthe kernel of raises failed on rank 1 (of 2): an error in its kernel" in said, said
    assert "IndexError: row 7 is out of range on this rank" in said
    # any launcher that sets the four variables: here two plain processes, rank 0 hosting the store
    port = free_port()
    plain = [subprocess.Popen([sys.executable, "-m", "golden_tasks.cli", "rank", "good"], cwd=ranked.path,
                              env={**ranked.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                   "WORLD_SIZE": "2", "RANK": str(r)}, stdout=subprocess.PIPE, text=True)
             for r in range(2)]
    said = [p.communicate(timeout=600)[0] for p in plain]
    assert [p.returncode for p in plain] == [0, 0] and said == ["good: PASS\n", ""], said
    proc = ranked.cli("rank", "good")  # not started by a launcher
    assert proc.returncode == 2
    assert "golden-tasks rank: not started by a launcher: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK not set" \
        in proc.stderr


@pytest.mark.e2e
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a CUDA device per rank; this machine has "
                    f"{torch.cuda.device_count()}")
def test_a_cuda_kernel_runs_its_ranks_in_an_nccl_group(tmp_path):
    from kernels import cpp_kernels
    case = next(c for c in cpp_kernels.CASES if c.name == "rms_norm_cuda_ranks")
    result = verify(case, tmp_path)
    assert result.passed, result.error
