"""`golden-tasks compare A.json B.json`: the verdict rule on constructed timings, and the command as a user
runs it (its lines and exit status, bad input included)."""
import json
import subprocess
import sys

import pytest
from records import record, row, timing

from golden_tasks.model.records import Timing
from golden_tasks.reports.runs_compare import judge


def noisy(median: float, rse: float | None) -> Timing:
    """A timing with this median and relative standard error of it (None: one round)."""
    return Timing.from_json(timing(median, rse))


@pytest.mark.parametrize(("a", "b", "verdict"), [
    (noisy(20.0, 0.01), noisy(15.0, 0.01), "FASTER"),       # 25% faster, 1% noise
    (noisy(20.0, 0.01), noisy(25.0, 0.01), "SLOWER"),
    (noisy(20.0, 0.002), noisy(20.1, 0.002), "SAME"),       # 0.5% apart, the interval within +-2%
    (noisy(20.0, 0.001), noisy(20.2, 0.001), "SAME"),       # 1% slower beyond the noise, yet under 2%
    (noisy(20.0, 0.30), noisy(10.0, 0.30), "UNCERTAIN"),    # half the time, but 30% noise
    (noisy(20.0, 0.01), noisy(20.0, 0.01), "UNCERTAIN"),    # equal means, but +-3 errors reach past 2%
    (noisy(20.0, 0.03), noisy(21.0, 0.03), "UNCERTAIN"),    # 5% slower within the noise
    (noisy(20.0, None), noisy(40.0, 0.01), "UNCERTAIN"),    # one round: no noise estimate
    (noisy(20.0, 0.0), noisy(20.3, 0.0), "SAME"),           # no noise at all (a coarse clock)
])
def test_verdict_rule_on_the_noise_inside_the_runs(a, b, verdict):
    assert judge(a, b, drift=0).verdict == verdict


def test_ratio_and_its_standard_error():
    change = judge(noisy(20.0, 0.03), noisy(25.0, 0.04), drift=0)
    assert change.ratio == 1.25 and change.err == pytest.approx(1.25 * 0.05)
    # the drift between runs enters once for each run
    assert judge(noisy(20.0, 0.03), noisy(25.0, 0.04), drift=0.02).err == pytest.approx(1.25 * 0.0033 ** 0.5)
    assert judge(noisy(20.0, None), noisy(25.0, 0.04)).err is None


def test_threshold_and_sigmas_move_the_verdict():
    a, b = noisy(20.0, 0.002), noisy(20.6, 0.002)  # 3% slower, 0.3% noise
    assert judge(a, b, drift=0).verdict == "SLOWER"
    assert judge(a, b, threshold=0.05, drift=0).verdict == "SAME"
    assert judge(a, b, sigmas=20, drift=0).verdict == "UNCERTAIN"


@pytest.mark.parametrize("change", [0.9, 0.94, 0.97, 1.0, 1.04, 1.07, 1.1])
def test_the_drift_between_runs_of_unchanged_code_is_no_verdict(change):
    """Runs of the same code move by more than their rounds' noise: within the default drift, a precise
    timing is not called FASTER or SLOWER."""
    assert judge(noisy(20.0, 0.002), noisy(20.0 * change, 0.002)).verdict == "UNCERTAIN"


@pytest.mark.parametrize(("change", "verdict"), [(1.3, "SLOWER"), (1 / 1.3, "FASTER")])
def test_a_change_of_a_third_is_reported_through_the_drift(change, verdict):
    assert judge(noisy(20.0, 0.01), noisy(20.0 * change, 0.01)).verdict == verdict


def run(tmp_path, a, b, *options):
    """Write the records (dicts, or raw text) and run the command on them."""
    for name, content in (("A.json", a), ("B.json", b)):
        if content is not None:
            (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
    return subprocess.run([sys.executable, "-m", "golden_tasks.cli", "compare", "A.json", "B.json", *options],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


BASELINE = record(row("rms_norm"), row("softmax"), row("gelu"), row("old_case"),
                  row("fp8_gemm", "SKIPPED", skipped="needs a GPU"))


@pytest.mark.e2e
def test_same_runs_exit_0(tmp_path):
    proc = run(tmp_path, BASELINE, BASELINE)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "status changes: none" in lines
    assert "rms_norm  20.00 ±1.0%  20.00 ±1.0%  1.000 ±0.045  UNCERTAIN" in lines
    assert "fp8_gemm  -            -            -             no kernel time: A SKIPPED, B SKIPPED" in lines
    assert lines[-1] == "no regression (--fail-on any)"


@pytest.mark.e2e
def test_a_timing_reused_from_the_cache_is_the_same_measurement(tmp_path):
    """B's bench entry has A's key: nothing was re-timed, so the case is SAME whatever the noise."""
    cached = row("rms_norm", kernel=timing(20.0, 0.05), keys={"bench": "9f1c"})
    old_format = {"cases": [cached], "passed": True}  # no start time, machine or toolchain
    proc = run(tmp_path, old_format, old_format)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["A: A.json", "B: B.json"]
    assert "rms_norm  20.00 ±5.0%  20.00 ±5.0%  1.000 ±0.000  SAME (one measurement: the same bench entry)" in lines
    retimed = dict(cached, kernel_timing=dict(cached["kernel_timing"], samples="6" * 32))  # the same key, re-timed
    proc = run(tmp_path, old_format, {"cases": [retimed]})
    assert "rms_norm  20.00 ±5.0%  20.00 ±5.0%  1.000 ±0.082  UNCERTAIN" in proc.stdout.splitlines()


@pytest.mark.e2e
def test_regressions_are_listed_and_exit_1(tmp_path):
    candidate = record(row("rms_norm", kernel=timing(25.0, 0.01)), row("gelu", kernel=timing(15.0, 0.01)),
                       row("softmax", "FAIL", reason="output 'out': 2/20 elements mismatched"),
                       row("fp8_gemm"), row("new_case"))
    candidate["toolchain"]["torch"] = "2.14.0"
    proc = run(tmp_path, BASELINE, candidate)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:7] == ["A: A.json (2026-09-21 14:13:20 UTC, ci-runner-7)",
                         "B: B.json (2026-09-21 14:13:20 UTC, ci-runner-7)",
                         "note: the runs differ in their machine or toolchain, and the timings with them:",
                         '  toolchain.torch: "2.13.0" -> "2.14.0"',
                         "",
                         "status changes: 4",
                         "  softmax: PASS -> FAIL: output 'out': 2/20 elements mismatched"]
    assert lines[7:10] == ["  old_case: only in A (was PASS)", "  fp8_gemm: SKIPPED -> PASS",
                           "  new_case: new in B (PASS)"]
    assert "rms_norm  20.00 ±1.0%  25.00 ±1.0%  1.250 ±0.056  SLOWER" in lines
    assert "gelu      20.00 ±1.0%  15.00 ±1.0%  0.750 ±0.034  FASTER" in lines
    assert "softmax   20.00 ±1.0%  -            -             no kernel time: B FAIL" in lines
    assert not any(line.startswith(("old_case ", "new_case ")) for line in lines)  # not in both runs
    assert lines[-2].startswith("cases in both runs: 4, timed in both: 2: 1 faster, 1 slower, 0 same, 0 uncertain")
    assert lines[-1] == "REGRESSED: softmax (PASS -> FAIL), rms_norm (SLOWER)"
    only_status = run(tmp_path, None, None, "--fail-on", "status")
    assert only_status.returncode == 1 and only_status.stdout.splitlines()[-1] == "REGRESSED: softmax (PASS -> FAIL)"
    assert run(tmp_path, None, None, "--fail-on", "slower").stdout.splitlines()[-1] == "REGRESSED: rms_norm (SLOWER)"
    assert run(tmp_path, None, None, "--fail-on", "none").returncode == 0
    wide = run(tmp_path, None, None, "--fail-on", "slower", "--threshold", "40", "--drift", "0")
    assert wide.returncode == 0 and "1.250 ±0.018  SAME" in wide.stdout
    drifting = run(tmp_path, None, None, "--fail-on", "slower", "--drift", "10")  # a noisy machine's runs
    assert drifting.returncode == 0 and "1.250 ±0.178  UNCERTAIN" in drifting.stdout


@pytest.mark.e2e
@pytest.mark.parametrize(("a", "b", "message"), [
    (BASELINE, None, "B.json: cannot read it: No such file or directory"),
    (BASELINE, "{not json", "B.json: not JSON: Expecting property name enclosed in double quotes"),
    ("[1, 2]", BASELINE, "A.json: not a golden-tasks run record (runs/report.json): it has no list of cases"),
    (BASELINE, {"cases": [{"case": "x", "status": "GREEN"}]},
     'B.json: cases[0].status: expected one of FAIL, INCOMPLETE, SKIPPED, PASS, got "GREEN"'),
    (BASELINE, {"cases": [row("x"), row("x")]}, "B.json: cases[1]: case 'x' appears twice"),
    (BASELINE, {"cases": [row("x", kernel_timing={"median": "fast", "iqr": 0.01})]},
     'B.json: cases[0].kernel_timing.median: expected a finite number >= 0, got "fast"'),
    (BASELINE, {"cases": [row("x", kernel_timing={"median": 3.0, "iqr": -1})]},
     "B.json: cases[0].kernel_timing.iqr: expected a finite number >= 0, got -1"),
])
def test_bad_input_exits_2_naming_the_file_and_field(tmp_path, a, b, message):
    proc = run(tmp_path, a, b)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"golden-tasks compare: {message}")
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_the_fraction_of_the_speed_of_light_is_compared_where_the_runs_measured_it(tmp_path):
    def measured(sol):
        return row("rms_norm", speed={"bytes": 4096, "bytes_from": "specs", "working_set": 8192, "sol": sol})

    proc = run(tmp_path, record(measured(0.41)), record(measured(0.52)))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and "case      A median us  B median us  B/A           A SOL  B SOL  verdict" in lines
    assert "rms_norm  20.00 ±1.0%  20.00 ±1.0%  1.000 ±0.045  0.41   0.52   UNCERTAIN" in lines, proc.stdout
