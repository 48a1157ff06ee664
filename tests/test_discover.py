"""Planning the library in a subprocess, and reusing plans while sources are unchanged."""
import os
import textwrap
import time

import pytest

from golden_tasks.model.rows import SignatureRow
from golden_tasks.planning import discover
from golden_tasks.project import observe
from golden_tasks.project.layout import layout
from golden_tasks.storage.store import Store

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
    return {p.case: p for p in discover.load_plans(root, Store(root / "cache"))}


def forbid_subprocess(monkeypatch):
    def fail(*a):
        raise AssertionError("planned again although nothing changed")
    monkeypatch.setattr(discover, "plan_in_subprocess", fail)


def test_plan_contents(root):
    (plan,) = plans(root).values()
    assert plan.case == "k" and plan.module == "kernels.k"
    assert [p.name for p in plan.params] == ["x", "out"]
    assert plan.signature[0] == SignatureRow("x", "tensor", (4,), "float32")
    assert plan.kernel and plan.golden and plan.policy


def test_plans_are_reused_until_a_dependency_changes(root, monkeypatch):
    first = plans(root)["k"]
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["k"] == first
    (root / "kernels" / "_helpers.py").write_text(HELPERS.replace("2.0", "3.0"))
    edited = plans(root)["k"]
    assert edited.kernel != first.kernel and edited.golden == first.golden


@pytest.mark.parametrize("ending,how", [
    ("import ctypes\nctypes.string_at(0)\n", "killed by signal SIGSEGV"),  # a crash: a broken extension, say
    ("import os\nos._exit(3)\n", "exit status 3"),
])
def test_a_module_whose_import_ends_the_planning_process_fails_alone_and_is_not_planned_again(root, monkeypatch,
                                                                                            ending, how):
    """The planning process dies with the module: the module's cases fail, saying how (and what it printed),
    the other modules are planned, and the failure is reused under what the import had read (its source,
    the data file it opened) until one of those changes, as a plan is: it costs no later run a planning
    process."""
    (root / "table.txt").write_text("1")
    (root / "kernels" / "crash.py").write_text(
        f"import sys\nopen({str(root / 'table.txt')!r}).read()\nprint('about to end', file=sys.stderr)\n{ending}")
    first = plans(root)
    assert first["k"].error is None
    assert first["crash"].error == f"kernels/crash.py ended the planning process as it was imported ({how}):\nabout to end"
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root) == first
    (root / "table.txt").write_text("2")  # what its import read changed: planned again
    with pytest.raises(AssertionError, match="planned again"), monkeypatch.context() as m:
        forbid_subprocess(m)
        plans(root)
    (root / "kernels" / "crash.py").write_text("import sys\nsys.exit('not this time')\n")  # an exit is an error
    assert plans(root)["crash"].error.startswith("kernels/crash.py failed to import: SystemExit: not this time")


def test_private_modules_are_not_case_modules(root):
    assert [m.path.name for m in layout(root).modules()] == ["k.py"]


def test_import_failure_is_an_error_plan_for_that_module_only(root):
    (root / "kernels" / "bad.py").write_text("import torch\n\nraise ValueError('boom')\n")
    result = plans(root)
    assert result["k"].error is None
    first, *traceback = result["bad"].error.splitlines()  # the reason line, then the traceback for the log
    assert first == "kernels/bad.py failed to import: ValueError: boom (at kernels/bad.py:3)"
    assert traceback[0] == "Traceback (most recent call last):" and traceback[-1] == "ValueError: boom"


def test_a_failed_module_is_planned_again_once_edited_and_not_before(root, monkeypatch):
    (root / "kernels" / "bad.py").write_text("raise ValueError('boom')\n")
    assert plans(root)["bad"].error
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["bad"].error
    (root / "kernels" / "bad.py").write_text(MODULE.replace('Case("k"', 'Case("bad"').replace(
        "def k(", "def bad(").replace("golden_k", "golden_bad"))
    assert plans(root)["bad"].error is None


def test_a_module_missing_an_import_is_planned_again_when_it_appears(root, monkeypatch):
    (root / "kernels" / "late.py").write_text("from kernels._later import VALUE\n" + textwrap.dedent(MODULE).replace(
        'Case("k"', 'Case("late"').replace("def k(", "def late(").replace("golden_k", "golden_late"))
    assert "No module named 'kernels._later'" in plans(root)["late"].error
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["late"].error
    (root / "kernels" / "_later.py").write_text("VALUE = 1\n")
    assert plans(root)["late"].error is None


IMPORT_TIME = {  # name -> (module prelude, kernel expression using the value, edit of the outside world)
    "data_file": ("SCALE = float((Path(__file__).parent / 'scale.txt').read_text())\n", "x * SCALE"),
    "env_var": ("SCALE = float(os.environ.get('GT_TEST_SCALE', '2'))\n", "x * SCALE"),
    "listing": ("SCALE = float(len(list((Path(__file__).parent / 'tables').glob('*.bin'))))\n", "x * SCALE"),
    "outside": ("sys.path.insert(0, os.environ['GT_OUTSIDE']); from outside_helpers import SCALE\n", "x * SCALE"),
}


@pytest.mark.parametrize("route", sorted(IMPORT_TIME))
def test_values_computed_at_import_are_followed(root, tmp_path_factory, monkeypatch, route):
    """A module's import-time reads (a data file, an environment variable, a directory listing,
    a module outside the project) make its plan stale when they change."""
    outside = tmp_path_factory.mktemp("outside")
    (outside / "outside_helpers.py").write_text("SCALE = 2.0\n")
    (root / "kernels" / "scale.txt").write_text("2.0")
    (root / "kernels" / "tables").mkdir()
    (root / "kernels" / "tables" / "a.bin").write_text("")
    monkeypatch.setenv("GT_OUTSIDE", str(outside))
    monkeypatch.setenv("GT_TEST_SCALE", "2")
    prelude, expression = IMPORT_TIME[route]
    source = ("import os, sys\nfrom pathlib import Path\n" + prelude
              + textwrap.dedent(MODULE).replace("scale(x)", expression))
    (root / "kernels" / "k.py").write_text(source)
    first = plans(root)["k"]
    assert first.error is None, first.error
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["k"] == first
    {"data_file": lambda: (root / "kernels" / "scale.txt").write_text("3.0"),
     "env_var": lambda: monkeypatch.setenv("GT_TEST_SCALE", "3"),
     "listing": lambda: (root / "kernels" / "tables" / "b.bin").write_text(""),
     "outside": lambda: (outside / "outside_helpers.py").write_text("SCALE = 3.0\n")}[route]()
    assert plans(root)["k"].kernel != first.kernel


def test_declared_file_and_env_deps_enter_the_plan_and_its_freshness(root, monkeypatch):
    (root / "kernels" / "data").mkdir()
    (root / "kernels" / "data" / "a.npy").write_bytes(b"1")
    (root / "kernels" / "table.txt").write_text("t")
    monkeypatch.setenv("GT_DECLARED", "one")
    source = textwrap.dedent(MODULE).replace(
        'Case("k", ', 'Case("k", file_deps=("table.txt", "data/*.npy"), env_deps=("GT_DECLARED",), ')
    (root / "kernels" / "k.py").write_text(source)
    first = plans(root)["k"].external
    assert set(first["files"]) == {"table.txt", "data/*.npy"}
    assert list(first["files"]["data/*.npy"]) == ["data/a.npy"] and first["env"] == {"GT_DECLARED": "one"}
    (root / "kernels" / "data" / "b.npy").write_bytes(b"2")
    assert list(plans(root)["k"].external["files"]["data/*.npy"]) == ["data/a.npy", "data/b.npy"]
    (root / "kernels" / "table.txt").write_text("u")
    assert plans(root)["k"].external["files"]["table.txt"] != first["files"]["table.txt"]
    monkeypatch.setenv("GT_DECLARED", "two")
    assert plans(root)["k"].external["env"] == {"GT_DECLARED": "two"}
    (root / "kernels" / "table.txt").unlink()
    assert "file_deps names 'table.txt', which is not a file" in plans(root)["k"].error
    (root / "kernels" / "table.txt").write_text("t")  # a missing file that appears re-plans
    assert plans(root)["k"].external["files"]["table.txt"] == first["files"]["table.txt"]


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
    assert result["two"].error is None
    assert result["two_dup"].error == "SpecError: case 'two_dup': duplicate spec names x"


def test_freshness_reads_a_file_only_when_its_stat_changed_or_is_racy(root, monkeypatch):
    """Like git's index: an observed file is stat'ed, and read only when its stat differs from the one
    recorded, or when it was modified within RACY_NS of the record (a change then may not show in it)."""
    table = root / "kernels" / "scale.txt"
    table.write_text("2.0")
    (root / "kernels" / "k.py").write_text("from pathlib import Path\nSCALE = float((Path(__file__).parent / "
                                           "'scale.txt').read_text())\n" + textwrap.dedent(MODULE).replace(
                                               "scale(x)", "x * SCALE"))
    long_ago = time.time_ns() - 10 * observe.RACY_NS
    for path in root.rglob("*"):
        os.utime(path, ns=(long_ago, long_ago))
    first = plans(root)["k"]
    read = []
    monkeypatch.setitem(observe._CONTENT, "files", lambda path: read.append(path) or observe._file_state(path))
    with monkeypatch.context() as m:
        forbid_subprocess(m)
        assert plans(root)["k"] == first and read == []  # every stat as recorded: nothing read
        os.utime(table)  # touched, the same content
        assert plans(root)["k"] == first and read == [str(table)]

    soon = time.time_ns() + 30 * observe.RACY_NS  # a clock ahead, or a coarse one: the record is taken before it
    os.utime(table, ns=(soon, soon))
    with open(root / "kernels" / "k.py", "a") as f:
        f.write("# the module is planned again, recording the table's stat now\n")
    racy = plans(root)["k"]
    table.write_text("3.0")  # the same size and inode; its mtime put back: only the content tells
    os.utime(table, ns=(soon, soon))
    assert plans(root)["k"].kernel != racy.kernel
