"""FlashInfer-Trace datasets as case sources (planning.flashinfer_trace): FlashInfer-Bench's tree and
SOL-ExecBench's folders, through real doit; the Trace records a run writes, read back with flashinfer-bench's own
models; the [[tool.golden-tasks.datasets]] table's checks."""
import json
from pathlib import Path

import pytest
from dataset_files import DEFINITION, WORKLOADS, datasets_table, write_flashinfer_tree, write_sol_execbench
from project import Project

from golden_tasks.project.layout import DEFAULT_MEMORY, LayoutError, declared

FAST = ("warmup=1", "rounds=3")


def _layout(tmp_path: Path, text: str):
    (tmp_path / "pyproject.toml").write_text(text)
    declared.cache_clear()
    return declared(tmp_path)


def test_the_datasets_table_is_read_and_checked(tmp_path):
    found = _layout(tmp_path, datasets_table({"format": "flashinfer-trace", "path": "fib", "memory": "64MiB",
                                              "sizes": {"M": 8, "scale_add": {"N": 16}}}))
    (dataset,) = found.datasets
    assert dataset.path == (tmp_path / "fib").resolve() and dataset.memory == 64 << 20
    assert dataset.sizes == {"M": 8, "scale_add": {"N": 16}} and dataset.module == "flashinfer-trace:fib"
    assert [m.name for m in found.modules()] == ["flashinfer-trace:fib"]
    assert _layout(tmp_path, datasets_table({"format": "kernelbench", "path": "kb", "solutions": "sols"})
                   ).datasets[0].memory == DEFAULT_MEMORY
    for table, message in (
            ({"format": "onnx", "path": "x"}, r"datasets\[0\]: format must be one of flashinfer-trace, kernelbench"),
            ({"format": "flashinfer-trace"}, r"datasets\[0\]: path \(the dataset's folder\) is missing"),
            ({"format": "kernelbench", "path": "kb"}, "solutions .* is missing"),
            ({"format": "flashinfer-trace", "path": "x", "solutions": "y"}, "solutions .* is a KernelBench set's key"),
            ({"format": "flashinfer-trace", "path": "x", "memory": "lots"}, "memory must be a number of bytes"),
            ({"format": "flashinfer-trace", "path": "x", "sizes": {"M": 0}}, r"sizes\.M must be an integer >= 1"),
            ({"format": "flashinfer-trace", "path": "x", "folder": "y"}, "unknown key 'folder'")):
        with pytest.raises(LayoutError, match=message):
            _layout(tmp_path, datasets_table(table))


def _cases(tmp_path: Path, **table):
    from golden_tasks.planning.flashinfer_trace import cases

    return cases(_layout(tmp_path, datasets_table({"format": "flashinfer-trace", "path": "fib", **table})).datasets[0])


def test_every_solution_and_workload_pair_is_a_point_of_its_solutions_sweep(tmp_path):
    import torch

    from golden_tasks.model.compare import MatchedRatio

    write_flashinfer_tree(tmp_path / "fib", names=("scale_add_torch", "scale_add_dps"))
    made = _cases(tmp_path)
    assert [c.name for c in made] == ["scale_add_dps.M-4", "scale_add_dps.M-16", "scale_add_torch.M-4",
                                      "scale_add_torch.M-16"]
    case = made[3].resolved()
    assert case.sweep_of == "scale_add_torch" and case.point == {"M": 16} and case.kernel.untrusted
    assert [(s.name, tuple(s.shape), s.dtype) for s in case.specs] == [
        ("x", (16, 64), torch.float32), ("y", (16, 64), torch.float32), ("alpha", (), torch.float32),
        ("out", (16, 64), torch.float32)]
    assert case.specs[2].value == 2.0 and case.compare == {"out": MatchedRatio(atol=1e-2, rtol=1e-2)}
    assert case.dataset["workload"] == WORKLOADS[1] and case.dataset["declared"] == {}
    t = {"x": torch.ones(16, 64), "y": torch.ones(16, 64), "alpha": 2.0, "out": torch.zeros(16, 64)}
    case.golden(t)  # the reference's run, returned into the output
    assert torch.equal(t["out"], torch.full((16, 64), 3.0))


def test_sizes_and_the_memory_budget_decide_what_runs_and_the_record_keeps_both(tmp_path):
    write_flashinfer_tree(tmp_path / "fib", names=("scale_add_torch",))
    declared_sizes = _cases(tmp_path, sizes={"scale_add": {"N": 8}})[1].resolved()
    assert declared_sizes.specs[0].shape == (16, 8)
    assert declared_sizes.dataset["sizes"] == {"M": 16, "N": 8} and declared_sizes.dataset["declared"] == {"N": 64}
    # three 16 x 64 float32 tensors take 12 KiB: a 2 KiB budget halves M (var) first, then N
    shrunk = _cases(tmp_path, memory=2048)[1].resolved()
    assert shrunk.dataset["sizes"] == {"M": 2, "N": 64} and shrunk.name == "scale_add_torch.M-16"
    assert shrunk.point == {"M": 2}  # the figures draw what ran; the name is the workload's
    tiny = _cases(tmp_path, memory=512)[1].resolved()
    assert tiny.dataset["sizes"] == {"M": 1, "N": 32}
    unknown = _cases(tmp_path, sizes={"scale_add": {"K": 8}})[0]
    assert "sizes.scale_add.K: definition 'scale_add' has no such axis" in unknown.error
    assert unknown.name == "scale_add_torch.M-4" and unknown.sweep_of == "scale_add_torch"


def test_a_file_that_cannot_be_read_fails_its_cases_alone(tmp_path):
    from golden_tasks.planning.unplanned import Unplanned

    root = write_flashinfer_tree(tmp_path / "fib", names=("scale_add_torch",))
    (root / "solutions" / "elementwise" / "scale_add" / "torn.json").write_text("{not json")
    bad = dict(DEFINITION, name="bad_axes", axes={"M": {"type": "sometimes"}})
    (root / "definitions" / "elementwise" / "bad_axes.json").write_text(json.dumps(bad))
    (root / "solutions" / "elementwise" / "scale_add" / "for_bad.json").write_text(json.dumps(
        {"name": "for_bad", "definition": "bad_axes", "spec": {"language": "python", "entry_point": "main.py::run"},
         "sources": [{"path": "main.py", "content": "def run(): pass\n"}]}))
    made = _cases(tmp_path)
    failed = {c.name: c.error for c in made if isinstance(c, Unplanned)}
    assert "cannot be read as JSON" in failed["torn"] and "torn.json" in failed["torn"]
    assert "for_bad" not in failed  # its definition has no workloads: no case
    assert [c.name for c in made if not isinstance(c, Unplanned)] == ["scale_add_torch.M-4", "scale_add_torch.M-16"]


@pytest.mark.e2e
def test_a_flashinfer_bench_tree_through_doit(tmp_path):
    """Python (both styles) and Triton solutions PASS; a wrong one FAILs naming the workload; one that does not
    import FAILs alone; CUDA bound by tvm-ffi is SKIPPED naming the binding; the traces read back with
    flashinfer-bench's models; a solution is a sweep: verify:<solution>, and a point alone."""
    from flashinfer_bench.data import Trace, TraceSet

    proj = Project(tmp_path / "p", ())
    write_flashinfer_tree(proj.path / "fib")
    (proj.path / "pyproject.toml").write_text(datasets_table({"format": "flashinfer-trace", "path": "fib"}))
    code, results, _, err = proj.doit("-n", "2", "verify", *FAST)
    assert code != 0
    rows = {r["case"]: r for r in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]}
    status = {case: row["status"] for case, row in rows.items()}
    for name in ("scale_add_torch", "scale_add_dps", "scale_add_triton"):
        assert status[f"{name}.M-4"] == status[f"{name}.M-16"] == "PASS", (name, err)
    assert status["scale_add_wrong.M-16"] == "FAIL" and "validate" in rows["scale_add_wrong.M-16"]["errors"]
    assert status["scale_add_broken.M-4"] == "FAIL"
    assert "No module named 'not_a_module_anywhere'" in rows["scale_add_broken.M-4"]["errors"]["compile"]
    assert status["scale_add_cuda.M-4"] == "SKIPPED"
    assert "is cuda bound by tvm-ffi: golden-tasks builds" in rows["scale_add_cuda.M-4"]["skipped"]
    assert rows["scale_add_dps.M-4"]["golden_protected"] is True
    for name in ("scale_add_torch", "scale_add_dps", "scale_add_triton"):  # one build serves both workloads
        assert sorted(rows[f"{name}.M-{m}"]["stages"]["compile"] for m in (4, 16)) == ["cached", "ran"], name

    lines = (proj.path / "runs" / "traces" / "fib" / "elementwise" / "scale_add.jsonl").read_text().splitlines()
    traces = [Trace.model_validate_json(line) for line in lines]
    found = {(t.solution, t.workload.uuid): t.evaluation for t in traces}
    assert len(found) == 10  # the SKIPPED were not evaluated
    assert found["scale_add_torch", WORKLOADS[0]["uuid"]].status.value == "PASSED"
    assert found["scale_add_torch", WORKLOADS[0]["uuid"]].performance.latency_ms > 0
    assert found["scale_add_wrong", WORKLOADS[1]["uuid"]].status.value == "INCORRECT_NUMERICAL"
    assert found["scale_add_wrong", WORKLOADS[1]["uuid"]].correctness.max_absolute_error > 0.1
    assert found["scale_add_broken", WORKLOADS[0]["uuid"]].status.value == "COMPILE_ERROR"
    (proj.path / "fib" / "traces").mkdir()  # the dataset's own loader reads them where its traces go
    (proj.path / "fib" / "traces" / "scale_add.jsonl").write_text("\n".join(lines) + "\n")
    assert len(TraceSet.from_path(str(proj.path / "fib")).traces["scale_add"]) == 10

    printed = proj.console("verify:scale_add_wrong", *FAST).stdout  # the summary names the failing workload
    assert "scale_add_wrong.M-16: FAIL at validate" in printed and f"workload {WORKLOADS[1]['uuid']}]" in printed

    code, results, _, err = proj.doit("-n", "2", "verify:scale_add_dps", *FAST)
    assert code == 0, err
    assert results["verify:scale_add_dps.M-4"] == results["verify:scale_add_dps.M-16"] == "up-to-date"
    code, results, _, err = proj.doit("verify:scale_add_torch.M-16", *FAST)
    assert code == 0 and "verify:scale_add_torch.M-4" not in results, err

    # a workload added runs its cases alone; the others stay cached
    workloads = proj.path / "fib" / "workloads" / "elementwise" / "scale_add.jsonl"
    added = dict(WORKLOADS[0], uuid="c0ffee00-0000-4000-8000-000000000032", axes={"M": 32})
    workloads.write_text(workloads.read_text() + json.dumps({"definition": "scale_add", "workload": added}) + "\n")
    code, results, _, err = proj.doit("-n", "2", "verify:scale_add_torch", *FAST)
    assert code == 0, err
    ran = {task.partition(":")[2] for task, result in results.items() if result == "success"
           and not task.startswith(("plan:", "verify:"))}
    assert ran == {"scale_add_torch.M-32"}, ran


@pytest.mark.e2e
def test_sol_execbench_folders_through_doit(tmp_path):
    """SOL-ExecBench's folder per problem: its solutions' `languages`, its bare workloads and their tolerances."""
    proj = Project(tmp_path / "p", ())
    write_sol_execbench(proj.path / "sol")
    (proj.path / "pyproject.toml").write_text(datasets_table({"format": "flashinfer-trace", "path": "sol"}))
    code, results, _, err = proj.doit("-n", "2", "verify", *FAST)
    rows = {r["case"]: r for r in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]}
    assert {c: r["status"] for c, r in rows.items()} == {
        "scale_add_torch.M-4": "PASS", "scale_add_torch.M-16": "PASS", "scale_add_wrong.M-4": "FAIL",
        "scale_add_wrong.M-16": "FAIL"}, err
    assert "atol=0.001 rtol=0.001" in rows["scale_add_wrong.M-4"]["errors"]["validate"]  # the workload's own
    assert code != 0


@pytest.mark.e2e  # a C++ compile of torch's headers: half a minute
def test_a_cpp_solution_bound_by_torch_builds_as_a_torch_extension(tmp_path):
    """As FlashInfer-Bench's torch builder builds it (torch.utils.cpp_extension.load); its artifact loads the
    module again from the store's copy and calls it in destination-passing style."""
    import torch

    from golden_tasks.forms.solution import ExtensionArtifact
    from golden_tasks.model.specs import stamp_all

    write_flashinfer_tree(tmp_path / "fib", names=("scale_add_cpp",))
    case = _cases(tmp_path)[0].resolved()
    (tmp_path / "work").mkdir()
    artifact = case.kernel.compile(stamp_all(case.specs, case.kernel.params()), {}, tmp_path / "work")
    assert isinstance(artifact, ExtensionArtifact) and artifact.unavailable() is None
    x, y, out = torch.randn(4, 64), torch.randn(4, 64), torch.empty(4, 64)
    artifact.load()(x, y, 0.5, out)
    assert torch.equal(out, torch.add(y, x, alpha=0.5))


@pytest.mark.e2e
def test_pytest_collects_a_datasets_cases_under_the_table_that_names_it(tmp_path):
    from test_pytest_plugin import pytest_in

    root = tmp_path / "mine"
    write_flashinfer_tree(root / "fib", names=("scale_add_torch", "scale_add_wrong"))
    (root / "pyproject.toml").write_text(datasets_table({"format": "flashinfer-trace", "path": "fib"}))
    listed = pytest_in(root, "--collect-only", "-q")
    assert listed.stdout.splitlines()[:4] == [f"pyproject.toml::{c}" for c in (
        "scale_add_torch.M-4", "scale_add_torch.M-16", "scale_add_wrong.M-4", "scale_add_wrong.M-16")], listed.stdout
    run = pytest_in(root, "-v", "-k", "M-4")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "pyproject.toml::scale_add_torch.M-4 PASSED" in run.stdout
    assert "pyproject.toml::scale_add_wrong.M-4 FAILED" in run.stdout
