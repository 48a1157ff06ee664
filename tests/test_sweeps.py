"""Sweeps (Case.sweep): a case verified across its axes, one case per point, `<case>.<axis>-<value>...`, each
with its own graph and keys; `verify:<sweep>` verifies every point; the rows say which sweep and point."""
import json
import textwrap

import pytest
from project import Project

from golden_tasks import Case, In, Out, TensorSpec, jit, pow2
from golden_tasks.model.errors import SpecError

FAST = ("warmup=1", "rounds=3")


@jit(backend="eager")
def scale(x: In, out: Out):
    out.copy_(x * 2)


def _specs(n, dtype=None):
    import torch

    dtype = dtype or torch.float32
    return [TensorSpec("x", (n,), dtype, init_value=torch.randn), TensorSpec("out", (n,), dtype)]


def test_pow2_lists_the_powers_of_two_between_its_ends():
    assert pow2(16, 256) == [16, 32, 64, 128, 256] and pow2(1, 1) == [1]
    for bad, message in (((3, 16), "3 is not a power of two"), ((16, 8), "the first is larger"),
                         ((0, 4), "0 is not a power of two")):
        with pytest.raises(SpecError, match=message):
            pow2(*bad)


def test_a_sweep_expands_into_named_points_in_declaration_order():
    import torch

    case = Case("scale", _specs, kernel=scale, sweep={"n": [8, 64], "dtype": [torch.float32, torch.bfloat16]})
    points = case.points()
    assert [p.name for p in points] == ["scale.n-8.dtype-f32", "scale.n-8.dtype-bf16", "scale.n-64.dtype-f32",
                                        "scale.n-64.dtype-bf16"]
    assert all(p.sweep_of == "scale" and not p.sweep for p in points)
    assert points[3].point == {"n": 64, "dtype": "bf16"}
    resolved = points[3].resolved()
    assert [(s.name, tuple(s.shape), s.dtype) for s in resolved.specs] == [
        ("x", (64,), torch.bfloat16), ("out", (64,), torch.bfloat16)]
    assert Case("one", _specs(4), kernel=scale).points()[0].name == "one"


def test_a_bad_sweep_is_a_spec_error_naming_the_case_and_the_axis():
    for sweep, specs, message in (
            ({"n": []}, _specs, "case 'scale': sweep axis 'n': has no values"),
            ({"n": 8}, _specs, "sweep axis 'n': expected a list of values"),
            ({"n": [8, 8]}, _specs, "sweep axis 'n': the value 8 is given more than once"),
            ({"n": ["a.b"]}, _specs, r"sweep axis 'n': value 'a.b' is not a name"),
            ({"n": [object()]}, _specs, "sweep axis 'n': .* is not a number, a text or a torch dtype"),
            ({"1n": [8]}, _specs, "sweep axis name '1n' is not a name"),
            ({"m": [8]}, _specs, r"specs takes no parameter for each sweep axis \(m\)"),
            ({"n": [8]}, _specs(8), "a sweep's specs must be a function of its axes")):
        with pytest.raises(SpecError, match=message):
            Case("scale", specs, kernel=scale, sweep=sweep).points()


SWEEP = '''
import torch
from golden_tasks import Case, In, Out, TensorSpec, jit


@jit(backend="eager")
def twice(x: In, out: Out):
    out.copy_(x * 2)


def golden_twice(t):
    t["out"].copy_(t["x"] + t["x"])


def specs(n):
    return [TensorSpec("x", (n, 64), torch.float32, init_value=torch.randn), TensorSpec("out", (n, 64), torch.float32)]


CASES = [Case("twice", specs=specs, sweep={"n": [4, 16]}, rtol=0, atol=0)]
'''


@pytest.mark.e2e
def test_a_sweep_through_doit(tmp_path):
    """verify:<sweep> verifies every point; a point is addressable alone; adding a value runs only the new point;
    editing the kernel re-runs every point's kernel stages and no golden; the rows name the sweep and the point."""
    proj = Project(tmp_path / "p", (), html=True)
    (proj.path / "kernels" / "twice.py").write_text(textwrap.dedent(SWEEP))
    code, results, _, err = proj.doit("-n", "2", "verify:twice", *FAST)
    assert code == 0, err
    assert results["bench:twice.n-4"] == results["bench:twice.n-16"] == "success"
    assert results["calibrate:machine"] == "up-to-date"  # one task, whose entry every point reads
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    rows = {r["case"]: r for r in record["cases"]}
    assert list(rows) == ["twice.n-4", "twice.n-16"]
    assert rows["twice.n-16"]["sweep_of"] == "twice" and rows["twice.n-16"]["point"] == {"n": 16}
    page = (proj.path / "runs" / "report.html").read_text()
    assert '<h2 class="sweep" id="sweep-twice">sweep twice: 2 points (2 PASS)</h2>' in page
    assert page.count('data-kind="sweep"') == 1 and "twice: the kernel&#x27;s median and GB/s at each n" in page
    section = page[page.index('id="case-twice.n-4"'):page.index('id="case-twice.n-16"')]
    assert "a point of the sweep" in section and "<figure" not in section  # its sweep's figure shows it

    proj.edit("twice", '"n": [4, 16]', '"n": [4, 16, 64]')
    code, results, _, err = proj.doit("-n", "2", "verify", *FAST)
    assert code == 0, err
    ran = {task for task, result in results.items() if result == "success" and ":" in task
           and not task.startswith(("plan:", "verify:"))}
    assert {task.partition(":")[2] for task in ran} == {"twice.n-64"}, ran

    proj.edit("twice", "out.copy_(x * 2)", "out.copy_(x + x)")
    code, results, _, err = proj.doit("-n", "2", "verify:twice", *FAST)
    assert code == 0, err
    for point in ("twice.n-4", "twice.n-16", "twice.n-64"):
        assert results[f"compile:{point}"] == results[f"bench:{point}"] == "success"
        assert results[f"golden:{point}"] == results[f"golden_bench:{point}"] == "up-to-date"

    code, results, _, err = proj.doit("verify:twice.n-16", *FAST)
    assert code == 0, err
    assert results["verify:twice.n-16"] == "up-to-date" and "verify:twice.n-4" not in results
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    assert [r["case"] for r in record["cases"]] == ["twice.n-16"]

    # a case may not take a sweep's name: verify:<sweep> would name both
    other = textwrap.dedent(SWEEP).replace('sweep={"n": [4, 16]}, ', "")
    (proj.path / "kernels" / "other.py").write_text(other.replace("specs=specs", "specs=specs(4), kernel=twice, "
                                                                  "golden=golden_twice"))
    code, _, report, err = proj.doit("verify:twice.n-4", *FAST)
    assert code != 0 and "its sweep's name 'twice' is also a case's, in kernels.other" in json.dumps(report) + err


def test_the_table_sums_up_each_sweep_in_a_line():
    from golden_tasks.model.records import CaseRow
    from golden_tasks.model.verdicts import Verdict
    from golden_tasks.reports.report import format_table

    rows = [CaseRow(case=f"s.n-{n}", status=status, sweep_of="s", point={"n": n}, kernel_us=us)
            for n, status, us in ((1, Verdict.PASS, 2.0), (2, Verdict.PASS, 5.5), (4, Verdict.FAIL, None))]
    rows.append(CaseRow(case="s.n-1@torch", status=Verdict.PASS, sweep_of="s", point={"n": 1}, baseline_of="s.n-1",
                        kernel_us=1.0))
    assert "s: a sweep of 3 points: 1 FAIL, 2 PASS; kernel median 2.0 to 5.5 us" in format_table(rows).splitlines()
