"""End to end: real `doit` in a temporary copy of the project with its own cache.

One cold run of the library (with -n 2, compiled eagerly; the DeepSeek-V4 family has its own
in tests/test_dsv4.py), then edits to a copy of kernels/rms_norm.py, asserting from `doit --reporter=json` exactly which
stages ran and which were reused ("up-to-date").
"""
import json
import os
import re
import subprocess
import sys

import pytest
from project import Project, ran, stage_results

pytestmark = pytest.mark.e2e
LIBRARY = ("hello_world", "rms_norm", "layer_norm", "softmax", "rope", "gemm")
TIMED = {"bench", "golden_bench"}
HEAVY = {"compile", "inputs", "golden", "dispatch", "validate", "inputs2", "golden2", "bench", "golden_bench"}

KERNEL_LINE = 'out.copy_((x.float() * inv_rms * weight.float()).to(out.dtype))'
GOLDEN_LINE = 't["out"].copy_(x / rms * t["weight"].double())'
# 2**-20 is far inside rtol=1e-5 yet changes float32 bits: the outputs' digests change.
NUDGE = " * (1 + 2**-20)"


def heavy_ran(results):
    return {n for n in ran(results) if n.split(":")[0] in HEAVY}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("project"), LIBRARY)
    # every case compiled eagerly, as the project's own setting: these tests are about which stages run and what
    # they reuse; AOTInductor's builds of the library are the README's cold run's and tests/test_dsv4.py's
    (proj.path / "pyproject.toml").write_text('[tool.golden-tasks]\nbackend = "eager"\n')
    proj.cold = proj.doit("-n", "2", "verify")
    return proj


@pytest.fixture
def fresh(project):
    """Restore the kernel module after each test."""
    yield project
    project.restore("rms_norm")
    for leftover in (project.path / "kernels").glob("broken_*.py"):
        leftover.unlink()


SWEEPS = ("gemm_shapes", "decode_hca_shapes")  # verify:<sweep>: its points' verify tasks
SHARED_POINTS = {"gemm_shapes.m-64": "gemm", "decode_hca_shapes.batch-2.context-300": "decode_hca"}


def test_cold_run_passes_every_case(project):
    code, results, _, _ = project.cold
    assert code == 0, results
    assert results and set(results.values()) <= {"success", "up-to-date"}
    cases = {n.split(":", 1)[1] for n in results if n.startswith("verify:")}
    assert {"hello_world", "rms_norm", "rms_norm_bf16", "layer_norm", "softmax", "rope", "gemm"} <= cases
    for case in cases - set(SWEEPS):
        # a sweep's point at its flagship's shape has the flagship's keys: whichever of the two runs first computes
        # the stage, and the other finds its entry (up to date, or found by its task once the first's lock is free)
        twins = {case, *(p for p, flagship in SHARED_POINTS.items() if flagship == case), SHARED_POINTS.get(case)}
        for stage in ("compile", "bench"):
            states = [results[f"{stage}:{c}"] for c in twins if c]
            assert "success" in states and set(states) <= {"success", "up-to-date"}, (case, stage, states)


def test_second_run_is_all_up_to_date(fresh):
    """Every task, each verify:CASE included (it does nothing itself: doit would hand it to a worker and back),
    is up to date; only the `verify` group, which doit always runs, is not."""
    code, results, _, _ = fresh.doit("-n", "2", "verify")
    assert code == 0
    assert {name for name, result in results.items() if result != "up-to-date"} == {"verify"}
    assert sum(name.startswith("verify:") for name in results) >= 7


def test_fresh_measures_again_and_reuses_every_verdict(fresh):
    def timings():
        stats = [e["stats"] for e in fresh.entries() if e["case"] == "hello_world" and e["stage"] in TIMED]
        return sorted(json.dumps(s, sort_keys=True) for s in stats)

    before = timings()
    code, results, _, _ = fresh.doit("verify:hello_world", "fresh=1")
    assert code == 0 and heavy_ran(results) == {"bench:hello_world", "golden_bench:hello_world"}
    assert results["runtime:hello_world"] == "success"  # its report.json gets the new timings
    assert results["verify:hello_world"] == "success"  # not up to date: stages of its ran
    info = fresh.console("info", "verify:hello_world", "fresh=1").stdout
    assert "verify:hello_world: bench:hello_world is not up to date" in info, info
    remeasured = timings()
    assert len(remeasured) == len(before) == 2 and remeasured != before  # replaced under the same keys
    code, results, _, _ = fresh.doit("verify:hello_world")  # the next run keeps the new measurement
    assert code == 0 and set(stage_results(results).values()) == {"up-to-date"} and timings() == remeasured


def test_summary_table_and_json_report(fresh):
    proc = fresh.console("verify:rms_norm")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rms_norm  PASS    cached  cached" in proc.stdout
    data = json.loads((fresh.path / "runs" / "report.json").read_text())
    (row,) = data["cases"]
    assert data["passed"] and row["case"] == "rms_norm" and row["status"] == "PASS"
    assert row["kernel_us"] > 0 and row["golden_us"] > 0 and row["max_abs"] < 1e-4


def test_golden_only_edit_reruns_golden_and_validate(fresh):
    fresh.edit("rms_norm", GOLDEN_LINE, GOLDEN_LINE[:-1] + NUDGE + ")")
    code, results, _, _ = fresh.doit("verify:rms_norm")
    assert code == 0
    # the golden's runs, its timing, and what judges against its outputs (validate, the benchmark's recheck)
    assert heavy_ran(results) == {"golden:rms_norm", "golden2:rms_norm", "golden_bench:rms_norm", "validate:rms_norm",
                                  "bench:rms_norm"}


def test_kernel_only_edit_reruns_compile_dispatch_validate_bench(fresh):
    fresh.edit("rms_norm", KERNEL_LINE, KERNEL_LINE.replace(".to(", NUDGE + ").to(", 1).replace(
        "(x.float()", "((x.float()", 1))
    code, results, _, _ = fresh.doit("verify:rms_norm")
    assert code == 0, results
    assert heavy_ran(results) == {"compile:rms_norm", "dispatch:rms_norm", "validate:rms_norm", "bench:rms_norm"}
    # reverting the edit finds the earlier entries again
    fresh.restore("rms_norm")
    code, results, _, _ = fresh.doit("verify:rms_norm")
    assert code == 0 and heavy_ran(results) == set()


def test_comment_docstring_and_blank_line_edit_reruns_nothing_heavy(fresh):
    fresh.edit("rms_norm", "    inv_rms = torch.rsqrt", "    # a new comment\n\n    inv_rms = torch.rsqrt")
    fresh.edit("rms_norm", '"""Row RMS norm;', '"""Row-wise RMS norm;')
    code, results, _, _ = fresh.doit("verify:rms_norm", "verify:rms_norm_bf16")
    assert code == 0 and heavy_ran(results) == set()
    assert results["validate:rms_norm"] == "up-to-date"


def test_broken_kernel_fails_although_a_correct_one_is_cached(fresh):
    fresh.edit("rms_norm", "sum_sq / cols + eps)", "sum_sq / cols + eps * 1e6)")
    code, results, report, _ = fresh.doit("--continue", "verify:rms_norm", "verify:softmax")
    assert code != 0
    assert results["validate:rms_norm"] == "fail" and results["compile:rms_norm"] == "success"
    (failure,) = [t for t in report["tasks"] if t["name"] == "validate:rms_norm"]
    assert "validation FAILED for rms_norm" in failure["error"] and "mismatched" in failure["error"]
    assert results["validate:softmax"] == "up-to-date"  # the other case is still verified


def test_a_module_that_fails_to_import_fails_only_its_case(fresh):
    (fresh.path / "kernels" / "broken_import.py").write_text("import torch\nraise RuntimeError('no luck')\n")
    code, results, report, _ = fresh.doit("--continue", "verify")
    assert code != 0
    assert results["plan:broken_import"] == "fail"
    (failure,) = [t for t in report["tasks"] if t["name"] == "plan:broken_import"]
    assert "kernels/broken_import.py failed to import: RuntimeError: no luck" in failure["error"]
    others = {n: r for n, r in results.items() if "broken_import" not in n and not n.startswith("verify")}
    assert set(others.values()) == {"up-to-date"}
    # nothing it read changed: the next run reuses its failed plan instead of importing it again
    (manifest,) = fresh.cache.glob("plans/*/*/kernels.broken_import.json")
    planned = manifest.stat().st_mtime_ns
    code, results, _, _ = fresh.doit("--continue", "verify")
    assert code != 0 and results["plan:broken_import"] == "fail" and manifest.stat().st_mtime_ns == planned


def test_abi_mismatch_fails_before_compile(fresh):
    fresh.edit("rms_norm", '        ScalarSpec("eps", torch.float32, 1e-6),\n', "")
    code, results, report, _ = fresh.doit("verify:rms_norm")
    assert code != 0 and results["abi:rms_norm"] == "fail"
    assert "compile:rms_norm" not in ran(results)
    (failure,) = [t for t in report["tasks"] if t["name"] == "abi:rms_norm"]
    assert "kernel parameters with no spec: eps" in failure["error"]


def test_doit_list_and_info_tell_the_truth(fresh):
    listing = fresh.console("list", "--all", "-s").stdout
    assert "U verify:rms_norm" in listing or "U   compile:rms_norm" in listing or "U compile:rms_norm" in listing
    info = fresh.console("info", "validate:rms_norm").stdout
    assert "up-to-date" in info


PARENT_CHECK = """
import runpy, sys
namespace = runpy.run_path("dodo.py")
checked = 0
# as doit does: every task loaded, then checked (verify:CASE's check reads its stages')
tasks = [task for name, creator in namespace.items() if name.startswith("task_") for task in creator()]
for task in tasks:
    for check in task.get("uptodate", []):
        if callable(check):
            assert check() is True, task["name"]
            checked += 1
heavy = sorted(m for m in sys.modules if m in ("torch", "ray", "triton")
               or m.startswith(("torch.", "ray.", "triton.", "kernels")))
print(checked, heavy)
"""


def test_doit_parent_never_imports_torch_ray_triton_or_kernels(fresh):
    proc = subprocess.run([sys.executable, "-c", PARENT_CHECK], cwd=fresh.path, env=fresh.env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    checked, heavy = proc.stdout.split(" ", 1)
    assert int(checked) >= 7 * 11 and heavy.strip() == "[]"


def _files(root):
    """path -> (size, mtime) of every file under root."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _verdicts(path):
    """The rows of a run record, without what changes from run to run (the stages' states)."""
    return [{k: v for k, v in row.items() if k != "stages"} for row in json.loads(path.read_text())["cases"]]


def test_a_no_op_run_writes_nothing_to_the_cache_and_opens_no_samples(fresh):
    """A no-op run still writes its reports, from the entries' summaries and the figures drawn before: it
    opens no object of round times (each replaced here by bytes of its size and mtime, which a reader would
    find corrupt) and draws nothing, and the cache is as it was, but for the record of its use (log/)."""
    html = {"GOLDEN_TASKS_HTML": "1"}
    for _ in range(2):  # the figures, drawn once; then a no-op run's files
        assert fresh.console("verify", env=html).returncode == 0
    runs = fresh.path / "runs"
    before_page, before_rows = (runs / "report.html").read_text(), _verdicts(runs / "report.json")
    samples = {}
    for entry in fresh.entries():
        if record := entry["objects"].get("samples.json"):
            path = fresh.cache / "objects" / record["digest"][:2] / record["digest"]
            samples[path] = (path.read_bytes(), path.stat().st_mtime_ns)
    assert len(samples) >= 2 * 7  # bench and golden_bench of every case
    try:
        for path, (data, mtime) in samples.items():
            path.write_bytes(b"x" * len(data))
            os.utime(path, ns=(mtime, mtime))
        cache = {p: s for p, s in _files(fresh.cache).items() if "log" not in p.relative_to(fresh.cache).parts}
        done = fresh.console("verify", env=html)
        assert done.returncode == 0, done.stdout + done.stderr
        assert {p: s for p, s in _files(fresh.cache).items() if "log" not in p.relative_to(fresh.cache).parts} == cache
        assert _verdicts(runs / "report.json") == before_rows
        page = (runs / "report.html").read_text()
        assert "cannot draw" not in page and re.sub(r'<p class="when">[^<]*</p>', "", page) == re.sub(
            r'<p class="when">[^<]*</p>', "", before_page)
    finally:
        for path, (data, mtime) in samples.items():
            path.write_bytes(data)
            os.utime(path, ns=(mtime, mtime))


def test_inputs_are_bitwise_identical_in_another_process_and_cache(fresh, tmp_path):
    other = Project(tmp_path)
    code, results, _, _ = other.doit("inputs:rms_norm_bf16", "inputs:gemm")
    assert code == 0 and results["inputs:gemm"] == "success"

    def digests(project):
        entries = (project.path / "cache" / "entries" / "inputs").rglob("*.json")
        return {(e["case"], e["key"]): e["digest"] for e in map(json.loads, (p.read_text() for p in entries))}
    mine, theirs = digests(fresh), digests(other)
    assert len(theirs) == 2 and all(mine[k] == d for k, d in theirs.items())
