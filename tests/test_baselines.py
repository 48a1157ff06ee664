"""Named baselines (Case.baselines): each verified and timed as a case of its own, `<case>@<name>`, sharing every
stage that does not run it, and the table's speedup over the first that passed."""
import json
import textwrap

import pytest
from project import Project

from golden_tasks import Case, In, InOut, Out, TensorSpec, jit
from golden_tasks.model.errors import SpecError
from golden_tasks.model.records import RunRecord

FAST = ("warmup=1", "rounds=5")


@jit
def add(x: In, y: In, out: Out):
    out.copy_(x + y)


def test_a_baseline_is_a_function_with_the_kernels_parameters_or_a_form():
    import torch

    specs = [TensorSpec(n, (4,), torch.float32) for n in ("x", "y", "out")]

    def plain(x, y, out):
        torch.add(x, y, out=out)

    def annotated(x: In, y: In, out: Out):
        torch.add(x, y, out=out)

    def inout(x: In, y: In, out: InOut):
        out.add_(x)

    case = Case("add", specs, kernel=add, baselines={"torch": plain, "inductor": jit(annotated)}).resolved()
    kernel, *baselines = case.with_baselines()
    assert [c.name for c in baselines] == ["add@torch", "add@inductor"]
    assert all(c.baseline_of == "add" and c.kernel.params() == add.params() for c in baselines)
    assert baselines[0].kernel.backend == "eager" and baselines[1].kernel.backend is None  # as declared: AOTInductor
    for given, message in (
            ({"torch": lambda a, b: None}, "case 'add': baseline 'torch': it takes 2 parameters, the kernel 3"),
            ({"torch": lambda x, y, result: None}, r"baseline 'torch': its parameters \(x: in, y: in, result: "
                                                   r"out\) are not the kernel's \(x: in, y: in, out: out\)"),
            ({"torch": jit(inout)}, r"its parameters \(x: in, y: in, out: inout\) are not the kernel's"),
            ({"torch": 3}, "expected a function"),
            ({"to rch": plain}, "baseline name 'to rch' is not a name"),
            ([plain], "baselines must map names to functions")):
        with pytest.raises(SpecError, match=message):
            Case("add", specs, kernel=add, baselines=given).resolved()


BASELINES = '''
import torch
from golden_tasks import Case, In, Out, TensorSpec, jit


@jit(backend="eager")
def addk(x: In, y: In, out: Out):
    out.copy_(torch.sub(x, y, alpha=-1))


def golden_addk(t):
    t["out"].copy_(t["x"] + t["y"])


def add_torch(x, y, out):
    torch.add(x, y, out=out)


def add_wrong(x, y, out):
    torch.sub(x, y, out=out)


SPECS = [TensorSpec(name, (256, 256), torch.float32, init_value=torch.randn) for name in ("x", "y")] + [
    TensorSpec("out", (256, 256), torch.float32)]
CASES = [Case("addk", specs=SPECS, rtol=0, atol=0, baselines={"wrong": add_wrong, "torch": add_torch})]
'''


@pytest.mark.e2e
def test_baselines_through_doit(tmp_path):
    """A wrong baseline is reported (FAIL, never timed) and the speedup is over the next, which says so; editing
    the kernel re-times only the kernel, editing a baseline only that baseline; a baseline is addressable alone;
    the rows round-trip through report.json."""
    proj = Project(tmp_path / "p", (), baselines=True)
    (proj.path / "kernels" / "addk.py").write_text(textwrap.dedent(BASELINES))
    code, results, _, err = proj.doit("-n", "2", "verify", *FAST)
    assert code != 0, err  # the wrong baseline fails the run
    assert results["validate:addk@wrong"] == "fail" and results["bench:addk@wrong"] == "unmet"
    assert results["bench:addk"] == results["bench:addk@torch"] == "success"
    assert "golden:addk@torch" not in results and "runtime:addk@torch" not in results  # shared, or a kernel's own
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    rows = {r["case"]: r for r in record["cases"]}
    assert list(rows) == ["addk", "addk@wrong", "addk@torch"]
    kernel, torch_row = rows["addk"], rows["addk@torch"]
    assert (kernel["status"], rows["addk@wrong"]["status"], torch_row["status"]) == ("PASS", "FAIL", "PASS")
    assert kernel["baseline"] == "torch" and torch_row["baseline_of"] == "addk" and kernel["golden_us"] > 0
    assert kernel["speedup"] == pytest.approx(torch_row["kernel_us"] / kernel["kernel_us"])
    assert kernel["speedup_err"] > 0 and torch_row["speedup"] is None
    assert any("its baseline wrong is FAIL" in w for w in kernel["warnings"])
    assert [r.baseline for r in RunRecord.from_json(record).cases] == ["torch", None, None]

    proj.edit("addk", "out.copy_(torch.sub(x, y, alpha=-1))", "out.copy_(torch.add(y, x))")
    _, results, _, _ = proj.doit("-n", "2", "verify:addk@torch", "verify:addk", *FAST)
    assert results["bench:addk"] == "success" and results["bench:addk@torch"] == "up-to-date"
    assert results["golden:addk"] == results["compile:addk@torch"] == "up-to-date"

    proj.edit("addk", "torch.add(x, y, out=out)", "out.copy_(x + y)")
    code, results, _, err = proj.doit("-n", "2", "verify:addk@torch", *FAST)
    assert code == 0, err
    assert results["compile:addk@torch"] == results["bench:addk@torch"] == "success"
    assert "bench:addk" not in results  # addressed alone: its case is not run
    _, results, _, _ = proj.doit("-n", "2", "verify:addk", *FAST)
    assert results["bench:addk"] == results["bench:addk@torch"] == "up-to-date"
