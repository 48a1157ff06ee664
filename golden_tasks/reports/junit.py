"""A run record (runs/report.json) as JUnit XML (runs/report.xml), for CI systems.

One <testsuite name="golden-tasks"> holds one <testcase> per case (classname "golden-tasks", time the
row's "seconds": this run's stage time of the case, 0 where absent). A FAIL carries a <failure> whose
message is the row's reason and whose text is the full report, stage by stage (validation: the mismatch
report); SKIPPED a <skipped> with the reason; INCOMPLETE (or any other status) an <error>. The timings
and the work's figures go to the suite's <properties> ("CASE.kernel_us", "CASE.kernel_rse", "CASE.gbps",
"CASE.sol", "CASE.speedup", ...) and to its <system-out>, one line per case; the cases' warnings to its
<system-err>.

The file validates against the strict Ant JUnit schema (windyroad/JUnit-Schema), which allows nothing but
the verdict inside a <testcase> and requires a timestamp without a time zone (written in UTC) and a
hostname, and against the Jenkins xUnit junit-10 schema (tests/data/junit). Characters XML 1.0 cannot
carry (control characters such as an ANSI escape) are written as \\xNN.
"""
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from ..model.records import CaseRow, RunRecord
from ..model.verdicts import StageState, Verdict
from ..storage.store import atomic_write

SUITE = "golden-tasks"
# The characters XML 1.0 forbids (tab, newline and carriage return are allowed).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _seconds(value) -> str:
    return f"{value or 0.0:.3f}"


def full_report(row: CaseRow) -> str:
    """The row's error messages, stage by stage, then how each stage fared."""
    parts = [f"{stage}:\n{message}" for stage, message in row.errors.items()]
    parts.append("stages: " + ", ".join(f"{stage} {state}" for stage, state in row.stages.items()))
    return "\n\n".join(parts)


def _verdict(row: CaseRow) -> ET.Element | None:
    """The <failure>, <skipped> or <error> of a row; None for a PASS."""
    status, errors = row.status, row.errors
    if status == Verdict.PASS:
        return None
    if status == Verdict.SKIPPED:
        return ET.Element("skipped", message=_text(row.skipped or ""))
    if status == Verdict.FAIL:
        element = ET.Element("failure", message=_text(row.reason or "FAIL"), type=next(iter(errors), "FAIL"))
    else:
        not_run = [stage for stage, state in row.stages.items() if state == StageState.NOT_RUN]
        element = ET.Element("error", type=status,
                             message=_text(f"{status}: the case did not run to its end; not run: "
                                           + (", ".join(not_run) or "none")))
    element.text = _text(full_report(row))
    return element


def _figures(row: CaseRow) -> dict:
    """The row's numbers worth a property, by name, where present."""
    kernel = row.kernel_timing
    figures = {"kernel_us": row.kernel_us, "kernel_mean_us": kernel and kernel.mean,
               "kernel_rse": kernel and kernel.rse, "kernel_rounds": kernel and kernel.rounds,
               "golden_us": row.golden_us, "baseline": row.baseline, "speedup": row.speedup,
               "speedup_err": row.speedup_err,
               "max_abs": row.max_abs, "unwritten": row.unwritten, "nan": row.nan, "inf": row.inf}
    if speed := row.speed:
        figures |= {"bytes": speed.bytes, "flops": speed.flops, "gbps": speed.gbps, "tflops": speed.tflops,
                    "sol_us": speed.sol_us, "sol": speed.sol, "sol_err": speed.sol_err}
    return {name: value for name, value in figures.items() if value is not None}


def _summary_line(row: CaseRow) -> str:
    figures = _figures(row)
    why = row.reason or row.skipped
    words = [f"{row.case}: {row.status}" + (f": {why}" if why else "")]
    if "kernel_us" in figures:
        noise = f", mean ±{figures['kernel_rse']:.1%}" if "kernel_rse" in figures else ""
        rounds = f" over {figures['kernel_rounds']} rounds" if "kernel_rounds" in figures else ""
        words.append(f"kernel {figures['kernel_us']:.2f} us (median{noise}{rounds})")
    if "gbps" in figures:
        flops = f", {figures['tflops']:.3g} TFLOP/s" if "tflops" in figures else ""
        words.append(f"{figures['gbps']:.3g} GB/s{flops}")
    if "sol" in figures:
        err = f" ±{figures['sol_err']:.2f}" if "sol_err" in figures else ""
        words.append(f"{figures['sol']:.2f}{err} of the speed of light ({figures['sol_us']:.3g} us)")
    if "golden_us" in figures:
        words.append(f"golden {figures['golden_us']:.2f} us")
    if "speedup" in figures:
        err = f" ±{figures['speedup_err']:.2f}" if "speedup_err" in figures else ""
        words.append(f"speedup {figures['speedup']:.2f}x{err} over {row.speedup_over}")
    if {"max_abs", "unwritten", "nan", "inf"} & set(figures):
        words.append(f"max err {row.max_error()}")
    return ", ".join(words)


def to_xml(record: RunRecord) -> str:
    """The JUnit XML document of a run record."""
    rows, started = record.cases, record.started or 0.0
    statuses = [row.status for row in rows]
    suite = ET.Element("testsuite", {
        "name": SUITE, "tests": str(len(rows)), "failures": str(statuses.count(Verdict.FAIL)),
        "errors": str(statuses.count(Verdict.INCOMPLETE)),
        "skipped": str(statuses.count(Verdict.SKIPPED)),
        "time": _seconds((record.finished or started) - started),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started)),
        "hostname": _text(record.machine.get("host") or "localhost")})
    properties = ET.SubElement(suite, "properties")
    environment = {f"machine.{k}": v for k, v in record.machine.items()}
    environment |= {f"toolchain.{k}": v for k, v in record.toolchain.items()}
    for name, value in environment.items():
        text = ", ".join(map(str, value)) if isinstance(value, list) else value
        ET.SubElement(properties, "property", name=_text(name), value=_text(text))
    for row in rows:
        for name, value in _figures(row).items():
            shown = _text(value) if isinstance(value, str) else repr(value)  # a name (the baseline's), or a number
            ET.SubElement(properties, "property", name=_text(f"{row.case}.{name}"), value=shown)
    for row in rows:
        case = ET.SubElement(suite, "testcase", name=_text(row.case), classname=SUITE, time=_seconds(row.seconds))
        verdict = _verdict(row)
        if verdict is not None:
            case.append(verdict)
    ET.SubElement(suite, "system-out").text = _text("\n".join(_summary_line(row) for row in rows))
    ET.SubElement(suite, "system-err").text = _text(
        "\n".join(f"{row.case}: warning: {w}" for row in rows for w in row.warnings))
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write(path: Path, record: RunRecord) -> None:
    """Write the JUnit XML of `record` to `path`, atomically."""
    data = to_xml(record).encode()
    atomic_write(Path(path), lambda f: f.write(data))
