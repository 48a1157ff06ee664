"""Run records (runs/report.json, in the shape golden_tasks.reports.report writes) built by hand, for the readers
of run records: the JUnit writer and `golden-tasks compare`."""
import math

from golden_tasks.pipeline.stage_table import STAGES


def timing(median: float, rse: float | None, rounds: int = 20) -> dict:
    """A timing summary with this median and relative standard error of the median (outputs.median_rse; None:
    one round), its round times in the store under the digest "samples"."""
    if rse is None:
        rounds, rse = 1, 0.0
    iqr = rse * median * rounds ** 0.5 * 1.349 / (math.pi / 2) ** 0.5
    return {"min": max(median - iqr, 0.0), "median": median, "mean": median, "max": median + iqr, "std": iqr / 1.349,
            "iqr": iqr, "rse": rse, "outliers": 0, "rounds": rounds, "warmup": 3, "stopped": "noise",
            "samples": "5" * 32}


DEFAULT = object()


def row(case: str, status: str = "PASS", kernel=DEFAULT, **fields) -> dict:
    """One case's row; by default a PASS has a kernel timing (20 us, 1%) and other statuses none."""
    if kernel is DEFAULT:
        kernel = timing(20.0, 0.01) if status == "PASS" else None
    golden = timing(40.0, 0.01)
    out = {"case": case, "status": status, "stages": {s.name: "ran" for s in STAGES}, "errors": {}, "reason": None,
           "skipped": None, "max_abs": None, "outputs": [], "warnings": [],
           "kernel_us": kernel and kernel["median"], "golden_us": kernel and golden["median"],
           "baseline": kernel and "torch", "speedup": kernel and golden["median"] / kernel["median"],
           "speedup_err": None,
           "kernel_timing": kernel, "golden_timing": kernel and golden, "rank_us": None, "imbalance": None,
           "keys": {s.name: None for s in STAGES}, "seconds": 1.5}
    out.update(fields)
    return out


def record(*rows: dict, started: float = 1_790_000_000.0) -> dict:
    """A run record of these rows."""
    return {"passed": all(r["status"] == "PASS" for r in rows), "started": started, "finished": started + 12.25,
            "machine": {"host": "ci-runner-7", "cpu": "Test CPU", "cores": 2, "threads": 4, "gpus": []},
            "toolchain": {"python": "cpython-3.12.0", "torch": "2.13.0", "gpus": []}, "cases": list(rows)}
