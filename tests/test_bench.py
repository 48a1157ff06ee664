"""The benchmark: adaptive rounds with real timing, the recheck that catches kernels right only on their
first call or returning a cached result, vacuous comparisons, and where a timing was measured."""
import os
import time

import pytest
import torch

import golden_tasks
from golden_tasks import In, InOut, Out, TensorSpec, jit

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine

SPECS = [TensorSpec("x", (64,), torch.float32, torch.randn), TensorSpec("out", (64,), torch.float32)]


def golden_double(t):
    t["out"].copy_(t["x"] * 2)


@jit(backend="eager")
def double(x: In, out: Out):
    out.copy_(x * 2)


# Per process (the kernel travels by value, with what its compile-time calls left here)
CALLED = set()


@jit(backend="eager")
def right_once(x: In, out: Out):
    """Correct on its first call in a process; afterwards it leaves `out` alone."""
    if os.getpid() not in CALLED:
        CALLED.add(os.getpid())
        out.copy_(x * 2)


CACHED = {}


@jit(backend="eager")
def cached_result(x: In, out: Out):
    """Computes once per process, then copies the result it kept, whatever the inputs."""
    if os.getpid() not in CACHED:
        CACHED[os.getpid()] = (x * 2).tolist()  # plain values: the kernel is pickled after its compile-time call
    out.copy_(torch.tensor(CACHED[os.getpid()]))


@jit(backend="eager")
def sleepy(x: In, out: Out):
    time.sleep(0.002)
    out.copy_(x * 2)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(tmp_path / "runs"))


def verify(kernel, golden=golden_double, **options):
    return golden_tasks.run(fn=kernel, specs=SPECS, golden=golden, rtol=1e-6, atol=1e-6, **options)


@pytest.mark.e2e
def test_a_kernel_right_only_on_its_first_call_fails_its_benchmark():
    result = verify(right_once, rounds=3, warmup=1)
    assert result.stages["validate"] == "ran" and result.stages["bench"] == "FAILED"
    assert "right_once passed validation, but its benchmark's recheck FAILED" in result.error
    assert "the outputs of its last timed round on the inputs:" in result.error and "mismatched" in result.error
    assert "elements not written" in result.error  # it left the canary its output starts each round with


@pytest.mark.e2e
def test_a_kernel_returning_a_cached_result_fails_on_the_second_input_set():
    result = verify(cached_result, rounds=3, warmup=1)
    assert result.stages["validate"] == "ran" and result.stages["bench"] == "FAILED"
    assert "the outputs of its last timed round on the inputs:" not in result.error  # right on its own inputs
    assert "the outputs of its last timed round on the second input set (seed + 1):" in result.error


@pytest.mark.e2e
def test_an_honest_kernel_passes_the_recheck_and_says_so():
    result = verify(double, rounds=3)
    assert result.passed and result.report.warnings == []
    assert result.bench.rounds == 3 and result.bench.stopped == "rounds" and result.bench.threads >= 1


@jit(backend="eager")
def increment(acc: InOut, x: In):
    acc.add_(x)


def golden_increment(t):
    t["acc"].add_(t["x"])


@pytest.mark.e2e
def test_an_inout_kernel_timed_again_by_a_new_pool_starts_from_its_inputs(monkeypatch):
    """A pool whose timing is in doubt is replaced by a new one (a busy machine): the new pool's buffers
    are placed from the inputs again, not left as the last pool's calls made them (an honest kernel that
    updates a buffer in place was failed as "right only on its first call")."""
    from golden_tasks.stages import bench

    pools = []

    def doubted_once(per_rank, witness):
        figures, why = real(per_rank, witness)
        pools.append(why)
        return figures, why or (None if len(pools) > 1 else "a doubt, as a busy machine raises")

    real = bench.clock_check
    monkeypatch.setattr(bench, "clock_check", doubted_once)
    specs = [TensorSpec("acc", (64,), torch.float32, torch.randn), TensorSpec("x", (64,), torch.float32, torch.randn)]
    result = golden_tasks.run(fn=increment, specs=specs, golden=golden_increment, rtol=1e-6, atol=1e-6, rounds=3,
                              warmup=1)
    assert len(pools) == 2 and result.passed, result.error


@pytest.mark.e2e
def test_adaptive_rounds_stop_on_each_criterion_with_real_timing():
    """A 2 ms kernel: its noise is far below 50% after 10 rounds, never reaches 1e-9, and 0.3 s of
    budget holds about 150 rounds."""
    noise = verify(sleepy, rse=0.5, min_rounds=10, warmup=1).bench
    assert noise.stopped == "noise" and noise.rounds == 10 and noise.rse <= 0.5
    budget = verify(sleepy, rse=1e-9, budget=0.3, warmup=1).bench
    assert budget.stopped == "budget" and 10 <= budget.rounds < 150
    # the budget is wall time, the refresh of the buffers between rounds included: most of it is the kernel's
    assert 0.2 <= sum(budget.times) / 1e6 <= 0.3 + 0.01
    capped = verify(sleepy, rse=1e-9, budget=60.0, max_rounds=12, warmup=1).bench
    assert capped.stopped == "rounds" and capped.rounds == 12


@pytest.mark.e2e
def test_speedup_over_the_baseline_comes_with_its_uncertainty():
    def double_torch(x, out):
        torch.mul(x, 2, out=out)

    result = verify(double, rse=0.2, warmup=1, baselines={"torch": double_torch})
    row, (base,) = result.report, result.baselines
    assert base.case == "double@torch" and base.status == "PASS" and row.baseline == "torch"
    assert row.speedup == pytest.approx(base.kernel_us / row.kernel_us)
    k, b = row.kernel_timing.median_rse, base.kernel_timing.median_rse  # the medians' noise
    assert row.speedup_err == pytest.approx(row.speedup * (k * k + b * b) ** 0.5)
    assert row.golden_us > 0 and verify(double, rse=0.2, warmup=1).report.speedup is None  # no baseline: none


def golden_zeros(t):
    t["out"].copy_(t["x"] * 0)


@jit(backend="eager")
def zeros(x: In, out: Out):
    out.zero_()


@pytest.mark.e2e
def test_a_vacuous_comparison_is_flagged_not_failed():
    result = verify(zeros, golden=golden_zeros, rounds=2)
    assert result.passed
    assert result.report.warnings == ["output 'out': a kernel writing zeros would pass its comparison "
                                         "(vacuous: the golden is (almost) all within tolerance of it)"]


def counting():
    return torch.arange(64)


@pytest.mark.e2e
def test_cases_whose_inputs_ignore_the_seed_are_warned_about():
    fixed = [TensorSpec("x", (64,), torch.float32, counting), TensorSpec("out", (64,), torch.float32)]
    result = golden_tasks.run(fn=cached_result, specs=fixed, golden=golden_double, rounds=2, name="fixed")
    assert result.passed  # the second set equals the first: a cached result is right there
    assert any("equals the first" in w for w in result.report.warnings)


def test_timings_are_not_reused_across_machines_and_fresh_measures_again(monkeypatch):
    from golden_tasks.model.plan import Plan
    from golden_tasks.pipeline import graph
    from golden_tasks.pipeline.stage_table import BY_NAME, STAGES
    from golden_tasks.project import toolchain

    plan = Plan(case="c", kernel="k", golden="g", policy="p")
    keyed = {s.name: graph.recipe(s, plan, {}) for s in STAGES}
    assert all(("machine" in r) == (name in ("calibrate", "bench", "golden_bench")) for name, r in keyed.items())
    monkeypatch.setattr(toolchain, "machine", lambda: {"host": "elsewhere"})
    monkeypatch.setattr(graph, "machine", toolchain.machine)
    assert graph.recipe(BY_NAME["bench"], plan, {}) != keyed["bench"]
    assert graph.recipe(BY_NAME["golden"], plan, {}) == keyed["golden"]
    fresh = plan.overridden({"fresh": "1"})  # measures again under the same keys: what reads a timing stays cached
    assert all(graph.keyed(s, fresh) == graph.keyed(s, plan) for s in STAGES)
    assert {s.name for s in STAGES if graph.remeasured(s, fresh)} == {"bench", "golden_bench"}
    assert not any(graph.remeasured(s, plan) for s in STAGES)


@pytest.mark.e2e
@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="GPU timing needs a CUDA device; this machine has none")
def test_a_cuda_kernel_is_timed_with_events_and_a_cold_l2_on_its_gpu(tmp_path):
    from kernels import cpp_kernels

    case = next(c for c in cpp_kernels.CASES if c.name == "rms_norm_cuda")
    options = {"rtol": case.rtol, "atol": case.atol, "flush": True, "rounds": 20, "warmup": 2}
    result = golden_tasks.run(fn=case.kernel, specs=case.specs, golden=case.golden, name="rms_norm_cuda", **options)
    assert result.passed, result.error
    timing = result.bench
    assert timing.device == "cuda" and timing.name == torch.cuda.get_device_name()
    assert (timing.sm_clock_mhz is None or timing.sm_clock_mhz > 0) and timing.rounds == 20 and timing.min > 0
