"""What this machine can do, measured (stages.calibrate), and what a case's timing means against it.

`Limits` is one device's: its memory bandwidth at working-set sizes from
cache-resident to far beyond the last-level cache, by the way the bytes move
(a STREAM triad, a copy, a read, a write), and the FLOP rate of torch's matmul
at each floating dtype; a GPU's beside its datasheet where it is known. From
them and a case's work (model.work):

- `sol_us`: the speed-of-light time, max(bytes / bandwidth, flops / flop rate)
  at the case's working-set size and dtype; the case's fraction of it is
  sol_us / its median (1.0: at the machine's limit).
- `floor_us`: the least time the work it cannot avoid takes here (writing every
  Out and InOut, and what the case declares as its minimum), at the fastest
  this machine moved bytes near that size, less the calibration's uncertainty:
  a median below it did not do that work (stages.bench fails it).
"""
import dataclasses
from typing import Any

from .records import JsonRecord, Speed, Timing
from .work import Work

KINDS = ("triad", "copy", "read", "write")  # how the bytes move, each measured at every size
# the floating dtypes a FLOP rate may be declared at (a project's [tool.golden-tasks.machine])
FLOATING = ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
# Below this the floor holds nothing to account: a call's own overhead exceeds what the calibration resolves
FLOOR_LEAST_US = 20.0
# The least uncertainty of a calibrated figure, relative: one process's bandwidth and FLOP rate vary from run to
# run by tens of percent (page placement, clocks, a neighbour's traffic), whatever the spread of one run's calls
LEAST_UNCERTAINTY = 0.5

# Datasheet figures of GPUs, dense (no sparsity): GB/s of their memory, TFLOP/s per dtype (float32 without
# tensor cores). Matched by a substring of torch.cuda.get_device_name().
DATASHEETS: dict[str, dict[str, Any]] = {
    "H200": {"gbps": 4800.0, "tflops": {"float64": 67.0, "float32": 67.0, "bfloat16": 989.0, "float16": 989.0}},
    "H100": {"gbps": 3350.0, "tflops": {"float64": 67.0, "float32": 67.0, "bfloat16": 989.0, "float16": 989.0}},
    "A100": {"gbps": 2039.0, "tflops": {"float64": 19.5, "float32": 19.5, "bfloat16": 312.0, "float16": 312.0}},
}


def datasheet(name: str) -> dict[str, Any] | None:
    """The datasheet figures of the GPU named `name`, or None where they are not known here."""
    return next((sheet for model, sheet in DATASHEETS.items() if model in name), None)


@dataclasses.dataclass(kw_only=True)
class Bandwidth(JsonRecord):
    """The bandwidth at one working-set size: the best GB/s of each kind, and how far the median fell short of
    the best (relative, the largest over the kinds): the measure's own uncertainty."""
    size: int  # bytes of the working set: every buffer the kind touches
    gbps: dict[str, float]
    spread: float

    @property
    def best(self) -> float:
        return max(self.gbps.values())


@dataclasses.dataclass(kw_only=True)
class Limits(JsonRecord):
    """One device's limits, measured with `threads` (a CPU's: the threads the benchmark gives a kernel);
    `declared`: the figures a project set (`[tool.golden-tasks.machine]`), which replace the measured ones."""
    _OMIT_NONE = True
    device: str  # "cpu" or "cuda"
    name: str
    threads: int | None = None
    bandwidth: list[Bandwidth]  # by size, ascending
    tflops: dict[str, float]  # dtype name -> the best TFLOP/s of torch's matmul
    tflops_spread: dict[str, float] = dataclasses.field(default_factory=dict)
    matmul_n: dict[str, int] = dataclasses.field(default_factory=dict)  # dtype -> the side of the matmul measured
    datasheet: dict[str, Any] | None = None
    declared: dict[str, Any] | None = None
    measured: float  # Unix time
    seconds: float  # how long the measure took

    def with_declared(self, declared: dict[str, Any]) -> "Limits":
        """These limits holding the figures `declared` (device -> figures: project.layout.Layout.machine) gives
        their device, where it gives any."""
        given = declared.get(self.device)
        return dataclasses.replace(self, declared=given) if given else self

    def gbps(self, size: int) -> float:
        """The bandwidth at a working set of `size` bytes: the best of the kinds at the largest size measured
        that is not larger (the smallest size's below it); a declared figure replaces it."""
        if self.declared and "gbps" in self.declared:
            return float(self.declared["gbps"])
        return self._near(size)[-1].best

    def flop_rate(self, dtype: str) -> float | None:
        """TFLOP/s at `dtype` (a declared figure, else measured), or None where none was measured."""
        declared: dict[str, float] = (self.declared or {}).get("tflops", {})
        return declared.get(dtype, self.tflops.get(dtype))

    def ceiling_gbps(self, size: int) -> float | None:
        """The fastest this machine moved bytes near `size`: the best of every kind at the two sizes measured at
        or below it, raised by their uncertainty; None below the smallest size measured."""
        if size < self.bandwidth[0].size:
            return None
        near = self._near(size)[-2:]
        return max(b.best * (1 + max(b.spread, LEAST_UNCERTAINTY)) for b in near)

    def _near(self, size: int) -> list[Bandwidth]:
        below = [b for b in self.bandwidth if b.size <= size]
        return below or self.bandwidth[:1]


def speed(work_bytes: int, bytes_from: str, flops: float | None, flops_from: str | None, working_set: int,
          dtype: str | None, limits: Limits | None, median_us: float | None, rse: float | None) -> Speed:
    """A case's Speed: its throughput from the median, and (with `limits`) its speed-of-light time and fraction."""
    found = Speed(bytes=work_bytes, bytes_from=bytes_from, flops=flops, flops_from=flops_from,
                  working_set=working_set, dtype=dtype, intensity=flops / work_bytes if flops and work_bytes else None)
    if median_us:
        found.gbps = work_bytes / median_us / 1e3
        found.tflops = flops / median_us / 1e6 if flops else None
    if limits is None:
        return found
    found.device = limits.device
    found.peak_gbps = limits.gbps(working_set)
    found.peak_tflops = limits.flop_rate(dtype) if dtype and flops else None
    memory_us = work_bytes / found.peak_gbps / 1e3 if found.peak_gbps else 0.0
    compute_us = flops / found.peak_tflops / 1e6 if flops and found.peak_tflops else 0.0
    found.sol_us = max(memory_us, compute_us)
    found.bound = "compute" if compute_us > memory_us else "memory"
    if median_us and found.sol_us:
        found.sol = found.sol_us / median_us
        found.sol_err = found.sol * rse if rse is not None else None
    return found


@dataclasses.dataclass(frozen=True)
class Floor:
    """The least time the work a kernel cannot avoid takes here: `amount` of it (bytes or FLOPs, as `did` says)
    at `limit` (bytes or FLOPs per microsecond... as `unit` says), the fastest this machine did it."""
    us: float
    did: str  # "wrote 64 MiB"
    amount: float  # in the unit's numerator: GB or TFLOP
    unit: str  # "GB/s" or "TFLOP/s"
    limit: float  # in `unit`
    where: str  # "at a 96 MiB working set"

    def message(self, median_us: float) -> str:
        """Why a median below the floor cannot be the work's: "wrote 64 MiB in 0.9 ms: 71 GB/s, above ..."."""
        rate = self.amount / (median_us * 1e-6)
        return (f"{self.did} in {_duration(median_us)}: {rate:.3g} {self.unit}, above this machine's fastest "
                f"{self.limit:.3g} {self.unit} {self.where} (its floor for this work is {_duration(self.us)})")


def floor_us(written: int, declared_bytes: int | None, declared_flops: float | None, working_set: int,
             limits: Limits) -> Floor | None:
    """The floor of a kernel's median here, or None where the calibration resolves no such time
    (FLOOR_LEAST_US). The work it cannot avoid: writing `written` bytes (every Out and InOut), and the bytes and
    FLOPs the case declares as its minimum, each at the fastest this machine did it, raised by its uncertainty."""
    floors = []
    ceiling = limits.ceiling_gbps(working_set)
    moved = max(written, declared_bytes or 0)
    if ceiling and moved:
        did = f"wrote {size_text(moved)}" if moved == written else f"moved {size_text(moved)} (its declared minimum)"
        floors.append(Floor(moved / ceiling / 1e3, did, moved / 1e9, "GB/s", ceiling,
                            f"at a {size_text(working_set)} working set"))
    rates = [r * (1 + max(limits.tflops_spread.get(d, 0.0), LEAST_UNCERTAINTY)) for d, r in limits.tflops.items()]
    if declared_flops and rates:
        floors.append(Floor(declared_flops / max(rates) / 1e6, f"did {declared_flops:.3g} FLOPs (its declared "
                            "minimum)", declared_flops / 1e12, "TFLOP/s", max(rates), "at any dtype"))
    found = max(floors, key=lambda f: f.us, default=None)
    return found if found and found.us >= FLOOR_LEAST_US else None


def below_floor(work: Work, limits: Limits | None, timing: Timing) -> str | None:
    """Why the timing's median is below the least time this machine takes for the work the kernel cannot avoid
    (floor_us), or None. Only against limits measured on its device with at least its threads (more threads
    move bytes faster)."""
    if limits is None or limits.device != timing.device:
        return None
    if (timing.threads or 0) > (limits.threads or timing.threads or 0):
        return None
    floor = floor_us(work.written, work.declared_bytes, work.declared_flops, work.working_set, limits)
    return floor.message(timing.median) if floor and timing.median < floor.us else None


def _duration(us: float) -> str:
    return f"{us / 1e3:.3g} ms" if us >= 1e3 else f"{us:.3g} us"


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"
