"""Planning the library in a subprocess, and reusing plans while sources are unchanged."""
import textwrap

import pytest

from golden_tasks import discover
from golden_tasks.store import Store

HELPERS = "FACTOR = 2.0\n\ndef scale(x):\n    return x * FACTOR\n"
MODULE = '''
import torch
from golden_tasks import Case, In, Out, TensorSpec, jit
from kernels._helpers import scale

@jit
def k(x: In, out: Out):
    out.copy_(scale(x))

def golden_k(t):
    t["out"].copy_(t["x"] * 2)

CASES = [Case("k", specs=lambda: [TensorSpec("x", (4,), torch.float32, torch.randn),
                                  TensorSpec("out", (4,), torch.float32)])]
'''


@pytest.fixture
def root(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "kernels" / "_helpers.py").write_text(HELPERS)
    (tmp_path / "kernels" / "k.py").write_text(textwrap.dedent(MODULE))
    return tmp_path


def plans(root):
    return {p["case"]: p for p in discover.load_plans(root, Store(root / "cache"))}


def forbid_subprocess(monkeypatch):
    def fail(*a):
        raise AssertionError("planned again although nothing changed")
    monkeypatch.setattr(discover, "plan_in_subprocess", fail)


def test_plan_contents(root):
    (plan,) = plans(root).values()
    assert plan["case"] == "k" and plan["module"] == "kernels.k"
    assert [p["name"] for p in plan["params"]] == ["x", "out"]
    assert plan["signature"][0] == {"name": "x", "kind": "tensor", "shape": [4], "dtype": "float32"}
    assert plan["kernel"] and plan["golden"] and plan["policy"]


def test_plans_are_reused_until_a_dependency_changes(root, monkeypatch):
    first = plans(root)["k"]
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["k"] == first
    (root / "kernels" / "_helpers.py").write_text(HELPERS.replace("2.0", "3.0"))
    edited = plans(root)["k"]
    assert edited["kernel"] != first["kernel"] and edited["golden"] == first["golden"]


def test_private_modules_are_not_case_modules(root):
    assert [p.name for p in discover.kernel_modules(root)] == ["k.py"]


def test_import_failure_is_an_error_plan_for_that_module_only(root):
    (root / "kernels" / "bad.py").write_text("import torch\n\nraise ValueError('boom')\n")
    result = plans(root)
    assert "error" not in result["k"]
    assert result["bad"]["error"] == ("kernels/bad.py failed to import: ValueError: boom "
                                      f"(at {root / 'kernels' / 'bad.py'}:3)")


def test_a_failed_module_is_planned_again_every_time(root):
    (root / "kernels" / "bad.py").write_text("raise ValueError('boom')\n")
    assert "error" in plans(root)["bad"]
    (root / "kernels" / "bad.py").write_text(MODULE.replace('Case("k"', 'Case("bad"').replace(
        "def k(", "def bad(").replace("golden_k", "golden_bad"))
    assert "error" not in plans(root)["bad"]


def test_bad_case_errors_stay_per_case(root):
    (root / "kernels" / "two.py").write_text(textwrap.dedent('''
        import torch
        from golden_tasks import Case, In, Out, TensorSpec, jit

        @jit
        def two(x: In, out: Out):
            out.copy_(x)

        def golden_two(t):
            t["out"].copy_(t["x"])

        def dup():
            return [TensorSpec("x", (2,), torch.float32), TensorSpec("x", (2,), torch.float32)]

        CASES = [
            Case("two", specs=lambda: [TensorSpec("x", (2,), torch.float32), TensorSpec("out", (2,), torch.float32)]),
            Case("two_dup", specs=dup),
        ]
    '''))
    result = plans(root)
    assert "error" not in result["two"]
    assert result["two_dup"]["error"] == "SpecError: case 'two_dup': duplicate spec names x"
