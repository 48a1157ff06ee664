import importlib
import re
import sys
import tempfile

import pytest
import torch

from golden_tasks import CompileError, In, InOut, Out, Scalar, ScalarSpec, TensorSpec, jit
from golden_tasks.forms.base import Artifact
from golden_tasks.model.plan import BACKENDS
from golden_tasks.model.rows import ParamRow


@jit
def axpy(x: In, y: InOut, alpha: Scalar):
    y.add_(x * alpha)


SPECS = [TensorSpec("x", (4, 8), torch.float32), TensorSpec("y", (4, 8), torch.float32),
         ScalarSpec("alpha", torch.float32, 0.5)]


def stamped(kernel, specs):
    return [s.stamped(p.direction) for s, p in zip(specs, kernel.params())]


def test_param_table_comes_from_the_signature():
    assert axpy.params() == [ParamRow("x", "tensor", "in"), ParamRow("y", "tensor", "inout"),
                             ParamRow("alpha", "scalar", "in")]


def test_unannotated_parameter_is_rejected():
    with pytest.raises(TypeError, match="parameter 'b' needs an In, Out, InOut or Scalar annotation"):
        @jit
        def k(a: In, b):
            pass


def test_writing_an_in_parameter_is_a_compile_error(tmp_path):
    @jit
    def k(x: In, y: InOut, alpha: Scalar):
        x.mul_(alpha)
        y.add_(x)
    with pytest.raises(CompileError, match="writes its In parameter 'x'"):
        k.compile(stamped(k, SPECS), {"backend": "eager"}, tmp_path)


def test_never_writing_an_out_parameter_is_a_compile_error(tmp_path):
    @jit
    def k(x: In, out: Out):
        x + 1
    specs = [TensorSpec("x", (3,), torch.float32), TensorSpec("out", (3,), torch.float32)]
    with pytest.raises(CompileError, match="never writes its Out parameter 'out'"):
        k.compile(stamped(k, specs), {"backend": "eager"}, tmp_path)


def test_unknown_backend(tmp_path):
    with pytest.raises(CompileError, match=re.escape("unknown backend 'tvm' (known: aoti, eager)")):
        jit(axpy.fn, backend="tvm").compile(stamped(axpy, SPECS), {}, tmp_path)


def test_the_backends_a_run_may_name_are_the_artifacts_jit_builds():
    """plan.BACKENDS lets the doit parent check backend= without torch; it must name what jit builds."""
    importlib.import_module("golden_tasks.forms.cpp")  # its artifact registers too, and is not a jit backend
    assert {name for name, cls in Artifact.registry.items() if hasattr(cls, "build")} == set(BACKENDS)


@pytest.mark.parametrize("backend", ["eager", pytest.param("aoti", marks=pytest.mark.e2e)])
def test_backends_compile_embed_the_table_and_run(tmp_path, backend):
    artifact = axpy.compile(stamped(axpy, SPECS), {"backend": backend}, tmp_path)
    assert artifact.backend == backend
    assert [r.name for r in artifact.table] == ["x", "y", "alpha"]
    assert artifact.table[0] == ParamRow("x", "tensor", "in", "float32", (4, 8))
    # reload from the stored files alone, as a worker does
    restored = Artifact.restore(backend, artifact.table, artifact.files, "golden_tasks.forms.jit")
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    expected = y + 0.5 * x
    restored.load()(x, y, 0.5)
    torch.testing.assert_close(y, expected)


def test_eager_artifact_carries_the_code_it_was_built_from(tmp_path, monkeypatch):
    """By reference, an edited helper would pickle to the same bytes (a stale cache hit) and run new code."""
    monkeypatch.syspath_prepend(str(tmp_path))
    source = ("from golden_tasks import In, Out, jit\n\ndef helper(x):\n    return x * {factor}\n\n"
              "@jit(backend='eager')\ndef k(x: In, out: Out):\n    out.copy_(helper(x))\n")
    specs = [TensorSpec("x", (3,), torch.float32), TensorSpec("out", (3,), torch.float32)]
    (tmp_path / "eagermod").mkdir()
    built = []
    for factor in (2, 3):  # the same module, edited and reloaded
        (tmp_path / "eagermod" / "__init__.py").write_text(source.format(factor=factor))
        importlib.invalidate_caches()
        module = importlib.reload(sys.modules["eagermod"]) if "eagermod" in sys.modules else importlib.import_module("eagermod")
        (tmp_path / f"build{factor}").mkdir()
        built.append(module.k.compile(stamped(module.k, specs), {}, tmp_path / f"build{factor}"))
    monkeypatch.delitem(sys.modules, "eagermod")
    assert built[0].files["kernel.pkl"].read_bytes() != built[1].files["kernel.pkl"].read_bytes()
    module.helper = lambda x: x * 100  # what the module holds now does not matter
    out = torch.zeros(3)
    built[0].load()(torch.ones(3), out)
    assert out.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.e2e
def test_a_package_stored_by_digest_loads_and_leaves_no_link_behind(tmp_path, monkeypatch):
    """Store objects have no `.pt2` suffix; the loader needs one. The link exists only while loading."""
    artifact = axpy.compile(stamped(axpy, SPECS), {"backend": "aoti"}, tmp_path)
    stored = tmp_path / "objects" / "ab" / "abcdef"
    stored.parent.mkdir(parents=True)
    artifact.files["kernel.pt2"].rename(stored)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    call = Artifact.restore("aoti", artifact.table, {"kernel.pt2": stored}, "golden_tasks.forms.jit").load()
    assert list(scratch.iterdir()) == []
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    expected = y + 0.5 * x
    call(x, y, 0.5)
    torch.testing.assert_close(y, expected)


MEMO = '''import torch
from golden_tasks import In, Out, jit

_TABLE = {}


@jit
def k(x: In, out: Out):
    if x.shape not in _TABLE:  # a constant built on the first call: an honest memo
        _TABLE[x.shape] = torch.arange(x.numel(), dtype=x.dtype).reshape(x.shape)
    out.copy_(x + _TABLE[x.shape])
'''


@pytest.mark.parametrize("backend", ["eager", pytest.param("aoti", marks=pytest.mark.e2e)])
def test_a_kernel_that_memoises_on_its_first_call_compiles_and_runs(tmp_path, monkeypatch, backend):
    """The write check runs the body on fake tensors: on a copy of the kernel, so no fake tensor stays in
    the memo the artifact carries (eager pickled it and failed: "cannot pickle 'weakref.ReferenceType'")."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "memomod.py").write_text(MEMO)
    monkeypatch.delitem(sys.modules, "memomod", raising=False)
    module = importlib.import_module("memomod")
    specs = [TensorSpec("x", (3,), torch.float32), TensorSpec("out", (3,), torch.float32)]
    call = module.k.compile(stamped(module.k, specs), {"backend": backend}, tmp_path).load()
    for x in (torch.ones(3), torch.full((3,), 2.0)):  # the first call builds the table, the second reuses it
        out = torch.zeros(3)
        call(x, out)
        assert out.tolist() == (x + torch.arange(3.0)).tolist()
    monkeypatch.delitem(sys.modules, "memomod")


def test_the_write_check_still_sees_a_memoising_kernel_write_its_in(tmp_path, monkeypatch):
    """Checking a copy checks the same body: the control for the test above."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "memobad.py").write_text(MEMO.replace("out.copy_(x + _TABLE[x.shape])",
                                                      "x.add_(_TABLE[x.shape])\n    out.copy_(x)"))
    monkeypatch.delitem(sys.modules, "memobad", raising=False)
    module = importlib.import_module("memobad")
    specs = [TensorSpec("x", (3,), torch.float32), TensorSpec("out", (3,), torch.float32)]
    with pytest.raises(CompileError, match="writes its In parameter 'x'"):
        module.k.compile(stamped(module.k, specs), {"backend": "eager"}, tmp_path)
    monkeypatch.delitem(sys.modules, "memobad")
