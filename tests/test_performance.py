"""Performance in the field's units: the work counted (bytes from the specs or declared, FLOPs counted by the
golden's run or declared), the machine's limits (calibrate), and a case's throughput and fraction of the speed
of light; the floor that FAILs a kernel faster than the machine can do its work (tests/exploits has the attacks)."""
import json
import math
import re
import textwrap

import pytest
from project import Project

from golden_tasks.model.errors import SpecError
from golden_tasks.model.machine import Bandwidth, Limits, below_floor, floor_us, speed
from golden_tasks.model.records import Timing
from golden_tasks.model.work import Work
from golden_tasks.reports.machine import format_limits

FAST = ("warmup=1", "rounds=3")


def limits(**declared):
    """A machine of 10 GB/s from 1 MiB up (20 below), 1 TFLOP/s in float32, measured within 10%."""
    return Limits(device="cpu", name="test", threads=2, measured=0.0, seconds=1.0, declared=declared or None,
                  bandwidth=[Bandwidth(size=1 << 16, gbps={"triad": 20.0, "write": 18.0}, spread=0.1),
                             Bandwidth(size=1 << 20, gbps={"triad": 10.0, "write": 12.0}, spread=0.1),
                             Bandwidth(size=1 << 26, gbps={"triad": 5.0, "write": 6.0}, spread=0.1)],
                  tflops={"float32": 1.0, "float64": 0.5}, tflops_spread={"float32": 0.1})


def test_the_bandwidth_at_a_working_set_is_the_best_at_the_largest_size_measured_below_it():
    machine = limits()
    assert machine.gbps(1 << 10) == 20.0  # below the smallest: the smallest's
    assert machine.gbps(1 << 20) == 12.0 and machine.gbps((1 << 26) - 1) == 12.0 and machine.gbps(1 << 30) == 6.0
    assert limits(gbps=3.0).gbps(1 << 20) == 3.0 and limits(tflops={"float32": 9.0}).flop_rate("float32") == 9.0
    # the floor's: the best of the two sizes at or below, raised by their uncertainty; none below the smallest
    assert machine.ceiling_gbps(1 << 10) is None
    assert math.isclose(machine.ceiling_gbps(1 << 27), 12.0 * 1.5)


def test_speed_is_throughput_and_the_fraction_of_the_speed_of_light():
    # 1 GB in 200 ms at a 64 MiB working set: 5 GB/s of 6 GB/s; 1e11 FLOPs at 1 TFLOP/s would take 100 ms
    found = speed(10**9, "specs", 1e11, "counted", 1 << 26, "float32", limits(), 200_000.0, 0.01)
    assert math.isclose(found.gbps, 5.0) and math.isclose(found.tflops, 0.5)
    assert found.peak_gbps == 6.0 and found.peak_tflops == 1.0 and found.bound == "memory"
    assert math.isclose(found.sol_us, 10**9 / 6.0 / 1e3) and math.isclose(found.sol, found.sol_us / 200_000.0)
    assert math.isclose(found.sol_err, found.sol * 0.01) and math.isclose(found.intensity, 100.0)
    compute = speed(1000, "declared", 1e12, "declared", 1000, "float32", limits(), 2e6, None)
    assert compute.bound == "compute" and math.isclose(compute.sol, 0.5) and compute.sol_err is None
    # no limits (a record from before calibration) or no timing: the work alone
    bare = speed(4096, "specs", None, None, 8192, "float32", None, None, None)
    assert (bare.gbps, bare.sol, bare.peak_gbps) == (None, None, None) and bare.bytes == 4096


def test_the_floor_is_the_work_a_kernel_cannot_avoid_at_the_fastest_this_machine_did_it():
    machine = limits()
    # writes 64 MiB at 18 GB/s at best: 12 GB/s at the next smaller size measured, raised by its uncertainty (at
    # least half: a process's bandwidth varies run to run more than one run's calls do)
    floor = floor_us(64 << 20, None, None, 128 << 20, machine)
    assert math.isclose(floor.us, (64 << 20) / 18.0 / 1e3) and floor.did == "wrote 64 MiB"
    declared = floor_us(1 << 20, 256 << 20, None, 128 << 20, machine)
    assert declared.did == "moved 256 MiB (its declared minimum)"
    flops = floor_us(0, None, 1e12, 1 << 10, machine)  # 1 TFLOP at 1.5 TFLOP/s, whatever the working set
    assert math.isclose(flops.us, 1e6 / 1.5) and flops.unit == "TFLOP/s"
    assert floor_us(1 << 10, None, None, 1 << 20, machine) is None  # 1 KiB: below what the calibration resolves
    timing = Timing(median=100.0, device="cpu", threads=2)
    work = Work(read=64 << 20, written=64 << 20)
    message = below_floor(work, machine, timing)
    assert message.startswith("wrote 64 MiB in 100 us: 671 GB/s, above this machine's fastest 18 GB/s at a "
                              "128 MiB working set"), message
    assert below_floor(work, machine, Timing(median=20_000.0, device="cpu", threads=2)) is None  # slower: honest
    assert below_floor(work, machine, Timing(median=100.0, device="cpu", threads=4)) is None  # more threads
    assert below_floor(work, machine, Timing(median=100.0, device="cuda")) is None  # not measured there
    assert below_floor(work, None, timing) is None


def test_golden_tasks_machine_prints_each_calibration():
    text = format_limits([({"host": "box"}, limits())])
    assert text.splitlines()[0].startswith("cpu: test, 2 threads on box, measured ")
    assert "64 KiB   20.0" in text and "matmul TFLOP/s: float32 1, float64 0.5" in text


def test_declared_work_is_a_number_or_a_function_of_the_specs(tmp_path):
    import torch

    from golden_tasks import Case, In, Out, TensorSpec, jit

    @jit
    def copy(x: In, out: Out):
        out.copy_(x)

    specs = [TensorSpec("x", (4, 8), torch.float32), TensorSpec("out", (4, 8), torch.bfloat16)]
    case = Case("c", specs, kernel=copy, golden=lambda t: None).resolved()
    assert case.work() == Work(read=128, written=64, dtype="float32")
    declared = Case("c", specs, kernel=copy, bytes=lambda s: s["x"].rank_bytes, flops=7).resolved().work()
    assert (declared.bytes, declared.flops(123), declared.declared_bytes) == (128, 7, 128)
    for bad, message in ((-1, "case 'c': bytes= must be a number >= 0"), ("big", "got 'big'"),
                         (lambda s: s["nope"], "case 'c': bytes= raised KeyError")):
        with pytest.raises(SpecError, match=message):
            Case("c", specs, kernel=copy, bytes=bad).resolved()


WORK_CASES = '''
import torch
import torch.nn.functional as F
from golden_tasks import Case, In, Out, TensorSpec, jit


@jit
def matmul(a: In, b: In, out: Out):
    torch.mm(a, b, out=out)


def golden_matmul(t):
    t["out"].copy_(t["a"] @ t["b"])


@jit
def conv(x: In, w: In, out: Out):
    out.copy_(F.conv2d(x, w))


def golden_conv(t):
    t["out"].copy_(F.conv2d(t["x"], t["w"]))


@jit
def attention(q: In, k: In, v: In, out: Out):
    out.copy_(F.scaled_dot_product_attention(q, k, v))


def golden_attention(t):
    t["out"].copy_(F.scaled_dot_product_attention(t["q"], t["k"], t["v"]))


@jit
def flip(x: In, out: Out):
    out.copy_(torch.flip(x, (0,)))


def golden_flip(t):
    t["out"].copy_(t["x"].flip(0))


def f32(name, *shape):
    return TensorSpec(name, shape, torch.float32, init_value=torch.randn)


QKV = [f32(n, 2, 4, 32, 16) for n in "qkv"]
CASES = [
    Case("matmul", [f32("a", 64, 48), f32("b", 48, 32), f32("out", 64, 32)], kernel=matmul, golden=golden_matmul,
         rtol=1e-4, atol=1e-4),
    Case("conv", [f32("x", 2, 3, 16, 16), f32("w", 8, 3, 3, 3), f32("out", 2, 8, 14, 14)], kernel=conv,
         golden=golden_conv, rtol=1e-4, atol=1e-4),
    Case("attention", [*QKV, f32("out", 2, 4, 32, 16)], kernel=attention, golden=golden_attention,
         rtol=1e-4, atol=1e-4),
    Case("flip", [f32("x", 64, 64), f32("out", 64, 64)], kernel=flip, golden=golden_flip),
    Case("declared", [f32("x", 64, 64), f32("out", 64, 64)], kernel=flip, golden=golden_flip,
         bytes=lambda specs: specs["out"].rank_bytes, flops=1000),
]
'''


@pytest.mark.e2e
def test_the_work_is_counted_and_reported_through_doit(tmp_path):
    """FLOPs of a matmul, a convolution and an attention counted by their goldens' runs equal the analytic
    counts; a permutation moves bytes and does no FLOPs; declared figures override; the table and
    report.json carry throughput and the fraction of the speed of light against the measured machine."""
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "work_cases.py").write_text(textwrap.dedent(WORK_CASES))
    proc = proj.console("-n", "2", "verify", "backend=eager", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["case"]: r for r in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]}
    speeds = {name: row["speed"] for name, row in rows.items()}
    assert speeds["matmul"]["flops"] == 2 * 64 * 48 * 32 and speeds["matmul"]["flops_from"] == "counted"
    assert speeds["matmul"]["bytes"] == 4 * (64 * 48 + 48 * 32 + 64 * 32) and speeds["matmul"]["bytes_from"] == "specs"
    assert speeds["conv"]["flops"] == 2 * (2 * 8 * 14 * 14) * (3 * 3 * 3)
    assert speeds["attention"]["flops"] == 2 * (2 * 2 * 4 * 32 * 32 * 16)  # QK^T and PV, each 2 FLOPs a MAC
    assert "flops" not in speeds["flip"] and speeds["flip"]["bytes"] == 2 * 4 * 64 * 64
    assert (speeds["declared"]["bytes"], speeds["declared"]["flops"]) == (4 * 64 * 64, 1000)
    assert speeds["declared"]["bytes_from"] == speeds["declared"]["flops_from"] == "declared"
    for name, found in speeds.items():
        median = rows[name]["kernel_us"]
        assert math.isclose(found["gbps"], found["bytes"] / median / 1e3), name
        assert found["peak_gbps"] > 0 and found["sol_us"] > 0 and math.isclose(found["sol"], found["sol_us"] / median)
        assert found["device"] == "cpu" and found["working_set"] >= found["bytes"] or name == "declared"
    assert math.isclose(speeds["matmul"]["tflops"], speeds["matmul"]["flops"] / rows["matmul"]["kernel_us"] / 1e6)
    assert re.search(r" GB/s +TFLOP/s +SOL ", proc.stdout), proc.stdout
    # one calibration, shared by every case: a second run measures nothing
    assert len(proj.entries("calibrate")) == 1
    machine = proj.cli("machine")
    assert machine.returncode == 0 and machine.stdout.startswith("cpu: ") and "matmul TFLOP/s" in machine.stdout
    again = proj.console("-n", "2", "verify", "backend=eager", *FAST)
    assert again.returncode == 0 and not any(line.startswith(".  ") for line in again.stdout.splitlines())


def test_declared_figures_replace_the_measured_in_the_reports_and_never_in_the_floor(tmp_path, monkeypatch):
    """A project's [tool.golden-tasks.machine] figures are the peaks its rows' speeds use and `golden-tasks machine`
    shows; the floor keeps to what was measured: a kernel faster than a declared figure is not failed for it."""
    import subprocess
    import sys

    import torch

    import golden_tasks
    from golden_tasks import In, Out, TensorSpec, jit

    (tmp_path / "pyproject.toml").write_text("[tool.golden-tasks.machine.cpu]\ngbps = 0.5\n"
                                             "tflops = {float32 = 0.25}\n")
    monkeypatch.chdir(tmp_path)

    @jit(backend="eager")
    def copy(x: In, out: Out):
        out.copy_(x)

    specs = [TensorSpec("x", (64, 64), torch.float32, torch.randn), TensorSpec("out", (64, 64), torch.float32)]
    result = golden_tasks.run(copy, specs, lambda t: t["out"].copy_(t["x"]), warmup=1, rounds=5, flops=1e6)
    assert result.passed, result.error
    found = result.report.speed
    assert (found.peak_gbps, found.peak_tflops) == (0.5, 0.25)
    assert math.isclose(found.sol_us, 32 * 2**10 / 0.5 / 1e3) and found.sol > 1  # faster than the declared limit
    # the floor of 64 MiB written in 20 ms: measured, 18 GB/s at best (honest); at the declared 0.5 GB/s it would
    # take 134 ms, and the kernel is not failed for it
    assert below_floor(Work(read=64 << 20, written=64 << 20), limits(gbps=0.5),
                       Timing(median=20_000.0, device="cpu", threads=2)) is None
    shown = subprocess.run([sys.executable, "-m", "golden_tasks.cli", "machine"], capture_output=True, text=True,
                           timeout=120)
    assert "declared in pyproject.toml [tool.golden-tasks.machine.cpu], which the reports use instead: 0.5 GB/s, " \
           "TFLOP/s float32 0.25" in shown.stdout, shown.stdout + shown.stderr
