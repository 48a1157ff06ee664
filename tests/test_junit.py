"""The JUnit XML of a run record validates against real JUnit schemas and carries each case's verdict."""
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema
from records import record, row, timing

from golden_tasks.model.records import RunRecord
from golden_tasks.reports import junit

SCHEMAS = Path(__file__).parent / "data" / "junit"
MISMATCH = ("output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)\n"
            "  worst at (3, 4): actual 2, expected 0, abs err 2, rel err inf\n"
            "  first mismatches:\n"
            '    (1, 2): actual 0.5 < 1 & "quoted", expected 0 — non-ASCII μs\n'
            "    (3, 4): actual 2, expected 0")


@pytest.fixture(scope="module")
def schemas():
    return [xmlschema.XMLSchema10(SCHEMAS / name) for name in ("ant-junit.xsd", "jenkins-junit-10.xsd")]


def run_record(*rows: dict) -> RunRecord:
    """The record of these rows, read as report.json's would be."""
    return RunRecord.from_json(record(*rows))


def mixed_record() -> RunRecord:
    return run_record(
        row("rms_norm", kernel=timing(12.5, 0.004, rounds=40), speedup_err=0.02, max_abs=3e-7,
            warnings=["output 'o': its golden is constant (0.0)"]),
        row("softmax", "FAIL", stages={"abi": "cached", "compile": "cached", "inputs": "cached", "golden": "ran",
                                       "dispatch": "ran", "validate": "FAILED", "bench": "-"},
            errors={"validate": MISMATCH, "bench": "not run: \x1b[31mvalidate failed\x1b[0m"},
            reason="output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)"),
        row("fp8_gemm", "SKIPPED", skipped="needs a GPU with fp8 (sm_89+) & <cuda>"),
        row("attention", "INCOMPLETE", stages={"abi": "ran", "compile": "ran", "inputs": "-", "golden": "-",
                                               "dispatch": "-", "validate": "-", "bench": "-"}, seconds=None),
    )


def test_a_mixed_run_validates_and_has_the_right_counts_and_verdicts(tmp_path, schemas):
    path = tmp_path / "runs" / "report.xml"
    junit.write(path, mixed_record())
    for schema in schemas:
        schema.validate(str(path))  # raises with the offending element on any violation
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and suite.get("name") == "golden-tasks"
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "4", "failures": "1", "errors": "1", "skipped": "1"}
    assert suite.get("time") == "12.250" and suite.get("hostname") == "ci-runner-7"
    assert suite.get("timestamp") == "2026-09-21T14:13:20"  # started, UTC
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["rms_norm", "softmax", "fp8_gemm", "attention"]
    assert [c.get("time") for c in cases.values()] == ["1.500", "1.500", "1.500", "0.000"]
    assert [[v.tag for v in c] for c in cases.values()] == [[], ["failure"], ["skipped"], ["error"]]
    failure = cases["softmax"].find("failure")
    assert failure.get("message") == "output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)"
    assert failure.get("type") == "validate"
    assert failure.text.startswith("validate:\n" + MISMATCH + "\n\nbench:\nnot run: \\x1b[31mvalidate failed")
    assert failure.text.endswith("validate FAILED, bench -")
    assert cases["fp8_gemm"].find("skipped").get("message") == "needs a GPU with fp8 (sm_89+) & <cuda>"
    error = cases["attention"].find("error")
    assert error.get("type") == "INCOMPLETE"
    assert error.get("message").endswith("not run: inputs, golden, dispatch, validate, bench")
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["rms_norm.kernel_us"] == "12.5" and properties["rms_norm.kernel_rse"] == "0.004"
    assert properties["rms_norm.speedup"] == "3.2" and properties["rms_norm.speedup_err"] == "0.02"
    assert properties["machine.cpu"] == "Test CPU" and properties["toolchain.torch"] == "2.13.0"
    assert "softmax.kernel_us" not in properties
    out = suite.find("system-out").text.splitlines()
    assert out[0] == ("rms_norm: PASS, kernel 12.50 us (median, mean ±0.4% over 40 rounds), golden 40.00 us, "
                      "speedup 3.20x ±0.02 over torch, max err 3.00e-07")
    assert out[1:] == ["softmax: FAIL: output 'out': 2/20 elements mismatched (rtol=0.001, atol=1e-05)",
                       "fp8_gemm: SKIPPED: needs a GPU with fp8 (sm_89+) & <cuda>", "attention: INCOMPLETE"]
    assert suite.find("system-err").text == "rms_norm: warning: output 'o': its golden is constant (0.0)"


def test_an_all_pass_run_validates_with_no_failures(tmp_path, schemas):
    path = tmp_path / "report.xml"
    junit.write(path, run_record(row("a"), row("b")))
    for schema in schemas:
        schema.validate(str(path))
    suite = ET.parse(path).getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("2", "0", "0", "0")
    assert not [v for case in suite.iter("testcase") for v in case]


def test_the_schemas_reject_what_they_should(schemas):
    """The validation above can fail: a testcase with two verdicts or a suite without counts is refused."""
    good = junit.to_xml(mixed_record())
    two_verdicts = good.replace('<skipped message=', '<failure type="x" /><skipped message=', 1)
    no_counts = good.replace(' tests="4"', "", 1)
    assert schemas[0].is_valid(good) and schemas[1].is_valid(good)
    assert not schemas[0].is_valid(two_verdicts)
    assert not schemas[0].is_valid(no_counts) and not schemas[1].is_valid(no_counts)


def test_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "report.xml"
    path.write_text("old")
    junit.write(path, run_record(row("a")))
    assert path.read_text(encoding="utf-8") == junit.to_xml(run_record(row("a")))
    assert [p.name for p in tmp_path.iterdir()] == ["report.xml"]  # no temporary file left


def test_the_work_and_the_fraction_of_the_speed_of_light_are_properties_and_said_per_case(tmp_path, schemas):
    speed = {"bytes": 1 << 20, "bytes_from": "specs", "flops": 2e6, "flops_from": "counted", "working_set": 1 << 21,
             "gbps": 52.4, "tflops": 0.1, "sol_us": 8.0, "sol": 0.4, "sol_err": 0.01, "device": "cpu"}
    path = tmp_path / "report.xml"
    junit.write(path, run_record(row("copy", kernel=timing(20.0, 0.01), speed=speed)))
    for schema in schemas:
        schema.validate(str(path))
    suite = ET.parse(path).getroot()
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert {name: properties[f"copy.{name}"] for name in ("bytes", "flops", "gbps", "tflops", "sol_us", "sol")} == {
        "bytes": "1048576", "flops": "2000000.0", "gbps": "52.4", "tflops": "0.1", "sol_us": "8.0", "sol": "0.4"}
    assert ("52.4 GB/s, 0.1 TFLOP/s, 0.40 ±0.01 of the speed of light (8 us)"
            in suite.find("system-out").text), suite.find("system-out").text
