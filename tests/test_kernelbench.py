"""KernelBench problem sets (planning.kernelbench): a problem and its solution of the same file name are a case,
Model its golden and ModelNew its kernel built from the same seeded init, at sizes that fit the dataset's memory
(the dataset's own, then the largest halved), the report saying which ran; a solution that does not import fails
its case at compile, the others unaffected."""
import json
import os
import sys

import pytest
import torch
from dataset_files import KERNELBENCH, LINEAR, datasets_table, write_kernelbench
from project import Project

from golden_tasks.forms.solution import ModelKernel
from golden_tasks.model import origin
from golden_tasks.model.errors import CompileError
from golden_tasks.model.specs import ScalarSpec
from golden_tasks.planning import kernelbench
from golden_tasks.planning.unplanned import Unplanned
from golden_tasks.project.layout import Dataset

FAST = ("warmup=1", "rounds=3")


def _dataset(tmp_path, names=tuple(KERNELBENCH), sizes=None, memory=256 << 20) -> Dataset:
    problems, solutions = write_kernelbench(tmp_path / "kb", tmp_path / "kb-solutions", names)
    return Dataset("kernelbench", problems, solutions, sizes or {}, memory)


def _by_name(dataset) -> dict:
    return {c.name: c for c in kernelbench.cases(dataset)}


def _shapes(case) -> dict:
    return {s.name: tuple(s.shape) for s in case.specs}


def test_the_dataset_sizes_replace_the_problem_constants_and_the_record_says_which_ran(tmp_path):
    found = _by_name(_dataset(tmp_path, ("1_Linear_scale", "4_Scale_add"),
                              sizes={"batch_size": 8, "4_Scale_add": {"N": 64}}))
    linear, scale_add = found["1_Linear_scale"], found["4_Scale_add"]
    assert _shapes(linear) == {"x": (8, 64), "out": (8, 32)}
    assert linear.dataset == {"format": "kernelbench", "dataset": "kb", "problem": "1_Linear_scale",
                              "solution": "1_Linear_scale.py",
                              "sizes": {"batch_size": 8, "in_features": 64, "out_features": 32},
                              "declared": {"batch_size": 4096}}
    assert (linear.rtol, linear.atol) == (1e-4, 1e-4)  # KernelBench's for float32
    # M = N // 4 in the file follows the N given; alpha, a number get_inputs returns, is a scalar
    assert _shapes(scale_add) == {"x": (16, 64), "y": (16, 64), "alpha": (), "out": (16, 64)}
    assert scale_add.specs[2].value == 0.5
    assert scale_add.dataset["sizes"] == {"N": 64, "M": 16}


def test_a_problem_too_large_for_the_memory_is_shrunk_by_halving_its_largest_constant(tmp_path):
    found = _by_name(_dataset(tmp_path, ("1_Linear_scale", "4_Scale_add"), memory=64 << 10))
    # x, y and out of M x N float32 in 64 KiB: N halved from 2048 to 128, M following it
    assert found["4_Scale_add"].dataset["sizes"] == {"N": 128, "M": 32}
    assert found["4_Scale_add"].dataset["declared"] == {"N": 2048, "M": 512}
    # batch_size is the largest that shrinks the tensors; in_features is not halved while it need not be
    linear = found["1_Linear_scale"]
    assert _shapes(linear) == {"x": (128, 64), "out": (128, 32)}
    assert linear.dataset["declared"] == {"batch_size": 4096}


def test_sizes_naming_what_a_problem_has_not_and_a_solution_without_a_problem_are_unplanned(tmp_path):
    dataset = _dataset(tmp_path, ("1_Linear_scale", "4_Scale_add"), sizes={"4_Scale_add": {"K": 8}, "K": 4})
    (dataset.solutions / "9_Orphan.py").write_text("class ModelNew:\n    pass\n")
    (dataset.path / "8_Unsolved.py").write_text(LINEAR)  # no solution: no case
    found = _by_name(dataset)
    assert set(found) == {"1_Linear_scale", "4_Scale_add", "9_Orphan"}
    assert not isinstance(found["1_Linear_scale"], Unplanned)  # a top-level size it has not: not its concern
    assert isinstance(found["4_Scale_add"], Unplanned)
    assert "sizes.4_Scale_add.K: the problem has no module-level integer 'K'" in found["4_Scale_add"].error
    assert isinstance(found["9_Orphan"], Unplanned) and "9_Orphan.py is of no problem" in found["9_Orphan"].error


def test_a_problem_that_cannot_run_is_unplanned_naming_why(tmp_path):
    dataset = _dataset(tmp_path, ("1_Linear_scale",))
    for name, source in (("5_Raises", LINEAR.replace("batch_size = 4096", "batch_size = 1 // 0")),
                         ("6_No_model", "def get_inputs():\n    return []\n")):
        (dataset.path / f"{name}.py").write_text(source)
        (dataset.solutions / f"{name}.py").write_text("")
    found = _by_name(dataset)
    assert "running it raised ZeroDivisionError" in found["5_Raises"].error
    assert "it defines no Model" in found["6_No_model"].error


def _call(artifact, case) -> tuple:
    """The kernel's and the golden's outputs on the same inputs, drawn as the pipeline draws them."""
    torch.manual_seed(0)
    inputs = {s.name: s.value if isinstance(s, ScalarSpec) else s.make() for s in case.specs[:-1]}
    kernel_out, golden_out = torch.zeros(case.specs[-1].shape), torch.zeros(case.specs[-1].shape)
    artifact.load()(*inputs.values(), kernel_out)
    case.golden({**inputs, "out": golden_out})
    return kernel_out, golden_out


def test_modelnew_is_built_with_the_parameters_model_has_and_a_solution_without_it_does_not_compile(
        tmp_path, monkeypatch):
    # the build imports the solutions here, as the confined compile does: what it adds to sys.path and to the
    # user's folders stays in this test
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(origin, "_project", origin._project)
    monkeypatch.setenv(origin.PROJECT_ENV, os.environ.get(origin.PROJECT_ENV, ""))
    found = _by_name(_dataset(tmp_path, ("1_Linear_scale", "4_Scale_add"), sizes={"batch_size": 8, "N": 64}))
    for name in ("1_Linear_scale", "4_Scale_add"):
        case = found[name]
        assert isinstance(case.kernel, ModelKernel)
        work = tmp_path / f"work-{name}"
        work.mkdir()
        stamped = [s.stamped(p.direction) for s, p in zip(case.specs, case.kernel.params())]
        kernel_out, golden_out = _call(case.kernel.build(stamped, work), case)
        # the weights of nn.Linear come from the seeded init: the same in both
        torch.testing.assert_close(kernel_out, golden_out, rtol=1e-4, atol=1e-4)
        assert golden_out.abs().sum() > 0
    case = found["1_Linear_scale"]
    case.kernel.path.write_text("import torch\n\n\nclass Model(torch.nn.Module):\n    pass\n")
    (tmp_path / "work-none").mkdir()
    with pytest.raises(CompileError, match="1_Linear_scale.py defines no class ModelNew"):
        case.kernel.build(case.specs, tmp_path / "work-none")


@pytest.mark.e2e
def test_kernelbench_problems_verify_through_doit_each_solution_its_own_verdict(tmp_path):
    proj = Project(tmp_path / "proj", ())
    write_kernelbench(proj.path / "kb", proj.path / "kb-solutions")
    (proj.path / "pyproject.toml").write_text(datasets_table(
        {"format": "kernelbench", "path": "kb", "solutions": "kb-solutions", "sizes": {"batch_size": 64},
         "memory": "64KiB"}))
    code, _, _, err = proj.doit("-n", "2", "verify", *FAST)
    assert code != 0, err
    rows = {r["case"]: r for r in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]}
    verdicts = {name: (row["status"], *row["errors"]) for name, row in rows.items()}
    assert verdicts == {"1_Linear_scale": ("PASS",), "4_Scale_add": ("PASS",), "2_Linear_wrong": ("FAIL", "validate"),
                        "3_Linear_broken": ("FAIL", "compile")}, err
    assert "No module named 'not_a_module_anywhere'" in rows["3_Linear_broken"]["errors"]["compile"]
    assert rows["1_Linear_scale"]["dataset"]["sizes"]["batch_size"] == 64
    assert rows["4_Scale_add"]["dataset"]["sizes"] == {"N": 128, "M": 32}
    assert rows["4_Scale_add"]["dataset"]["declared"] == {"N": 2048, "M": 512}
