"""A run's results on FlashInfer-Trace cases as Trace records in the format's own schema (flashinfer-bench's
`Trace`: definition, workload, solution, evaluation), so that its tools read them: runs/traces/<dataset>/
<op_type>/<definition>.jsonl, the layout of a dataset's traces/ folder (docs/datasets.md).

One record per case that was verified in the run (PASS or FAIL; a SKIPPED case was not evaluated and has none),
its workload as the dataset declares it. The evaluation's status follows the stage that failed: compile
COMPILE_ERROR; a call that hung TIMEOUT; a result of the wrong shape or dtype INCORRECT_SHAPE or
INCORRECT_DTYPE; a wrong value INCORRECT_NUMERICAL (with its correctness); any other failure RUNTIME_ERROR.
Performance is the kernel's median and the reference's (the golden's: the definition's reference), in ms. A case
run at other sizes than its workload's says so in its log and in correctness.extra.
"""
import datetime
import json
import math
import shutil
from pathlib import Path

from ..model.records import CaseRow, RunRecord
from ..model.verdicts import StageState, Verdict
from ..pipeline.stage_table import StageName
from ..project.layout import FLASHINFER_TRACE
from ..storage.store import atomic_write

FOLDER = "traces"  # under the runs folder


def status(row: CaseRow) -> str:
    """The format's EvaluationStatus of a row that was verified."""
    if row.status == Verdict.PASS:
        return "PASSED"
    stage = next((s for s, state in row.stages.items() if state == StageState.FAILED), None)
    message = row.errors.get(stage, "") if stage else ""
    if stage == StageName.COMPILE:
        return "COMPILE_ERROR"
    if "hung" in message or "timed out" in message:
        return "TIMEOUT"
    if "shape" in message and stage in (StageName.DISPATCH, StageName.VALIDATE):
        return "INCORRECT_SHAPE"
    if "dtype" in message and stage in (StageName.DISPATCH, StageName.VALIDATE):
        return "INCORRECT_DTYPE"
    return "INCORRECT_NUMERICAL" if stage == StageName.VALIDATE else "RUNTIME_ERROR"


def _number(value) -> float | str:
    """A float as the format's JSON writes it (NaN and infinity as strings)."""
    if value is None or math.isnan(value):
        return "NaN"
    return "Infinity" if math.isinf(value) else float(value)


def _correctness(row: CaseRow, extra: dict) -> dict:
    found = [o.get("stats", {}) for o in row.outputs]
    largest_abs = max((s["max_abs"] for s in found if s.get("max_abs") is not None), default=row.max_abs)
    largest_rel = max((s["max_rel"] for s in found if s.get("max_rel") is not None), default=None)
    return {"max_absolute_error": _number(largest_abs), "max_relative_error": _number(largest_rel),
            "extra": extra or None}


def trace(row: CaseRow, record: RunRecord) -> dict:
    """The Trace record of a verified row of a FlashInfer-Trace case."""
    source = row.dataset
    verdict = status(row)
    sizes = {"sizes": source["sizes"], "declared": source["declared"]} if source.get("declared") else {}
    log = row.reason or ""
    if sizes:
        ran = ", ".join(f"{a}={v}" for a, v in source["sizes"].items() if a in source["declared"])
        log = f"{log}\n" * bool(log) + f"golden-tasks ran it at {ran} (the workload's: " + ", ".join(
            f"{a}={v}" for a, v in source["declared"].items()) + ")"
    evaluation = {"status": verdict, "log": log,
                  "timestamp": datetime.datetime.fromtimestamp(record.finished or 0).isoformat(),
                  "environment": {"hardware": record.machine.get("cpu") or "cpu",
                                  "libs": {k: str(v) for k, v in record.toolchain.items() if k in ("torch", "python")}},
                  "correctness": None, "performance": None}
    if verdict in ("PASSED", "INCORRECT_NUMERICAL"):
        evaluation["correctness"] = _correctness(row, {"case": row.case, **sizes})
    if verdict == "PASSED":
        kernel, reference = row.kernel_us or 0.0, row.golden_us or 0.0
        evaluation["performance"] = {"latency_ms": kernel / 1e3, "reference_latency_ms": reference / 1e3,
                                     "speedup_factor": reference / kernel if kernel else 0.0}
    return {"definition": source["definition"], "workload": source["workload"], "solution": source["solution"],
            "evaluation": evaluation}


def write(runs_root: Path, record: RunRecord) -> None:
    """Replace runs/traces/ with the run's Trace records, one .jsonl per definition (see the module)."""
    folder = Path(runs_root) / FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    files: dict[Path, list] = {}
    for row in record.cases:
        verified = row.status in (Verdict.PASS, Verdict.FAIL) and not row.baseline_of
        if verified and row.dataset.get("format") == FLASHINFER_TRACE:
            where = folder / row.dataset["dataset"] / (row.dataset.get("op_type") or row.dataset["definition"])
            files.setdefault(where / f"{row.dataset['definition']}.jsonl", []).append(trace(row, record))
    for path, traces in files.items():
        data = "".join(json.dumps(t) + "\n" for t in traces).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda f, data=data: f.write(data))
