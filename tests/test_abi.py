import torch

from golden_tasks import TensorSpec
from golden_tasks.model.rows import ParamRow, SignatureRow
from golden_tasks.stages.abi import problems


def params(*rows):
    return [ParamRow(*r) for r in rows]


def sig(*rows):
    return [SignatureRow(name, kind, tuple(shape), dtype) for name, kind, shape, dtype in rows]


KERNEL = params(("x", "tensor", "in"), ("out", "tensor", "out"), ("eps", "scalar", "in"))
GOOD = sig(("x", "tensor", [4], "float32"), ("out", "tensor", [4], "float32"), ("eps", "scalar", [], "float32"))


def test_matching_specs_have_no_problems():
    assert problems(KERNEL, GOOD) == []


def test_order_is_compared_not_repaired():
    found = problems(KERNEL, [GOOD[1], GOOD[0], GOOD[2]])
    assert found == ["order differs: kernel (x, out, eps) vs specs (out, x, eps)"]


def test_missing_and_extra_are_reported_both_ways_in_one_line():
    """The summary shows a failure's first line: both halves are in it, which together say what to rename."""
    extra = sig(("y", "tensor", [4], "float32"))
    found = problems(KERNEL, [GOOD[0], GOOD[2], *extra])
    assert found[0] == ("kernel parameters with no spec: out; specs that are not kernel parameters: y (a spec is "
                        "named as its kernel parameter)")


def test_kind_and_scalar_direction():
    kernel = params(("x", "tensor", "in"), ("out", "scalar", "out"), ("eps", "scalar", "in"))
    found = problems(kernel, GOOD)
    assert "parameter 'out': kernel declares a scalar, spec is a tensor" in found
    assert "parameter 'out': a scalar must be In, kernel declares out" in found


def test_declared_dtype_and_shape_are_checked_with_dynamic_dims():
    kernel = [ParamRow("x", "tensor", "in", "bfloat16", (None, 8))]
    found = problems(kernel, sig(("x", "tensor", [3, 4], "float32")))
    assert found == ["parameter 'x': kernel expects dtype bfloat16, spec has float32",
                     "parameter 'x': kernel expects shape [None, 8], spec has [3, 4]"]
    assert problems(kernel, sig(("x", "tensor", [5, 8], "bfloat16"))) == []
    assert problems(kernel, sig(("x", "tensor", [8], "bfloat16"))) == [
        "parameter 'x': kernel expects rank 2, spec has shape [8]"]


def test_resident_specs_must_fit_the_world_size():
    params = [ParamRow("x", "tensor", "in"), ParamRow("w", "tensor", "in"), ParamRow("out", "tensor", "out")]
    specs = [TensorSpec("x", (3, 4), torch.float32, resident="stacked"),
             TensorSpec("w", (4,), torch.float32, resident=2), TensorSpec("out", (4,), torch.float32)]
    assert problems(params, [s.signature for s in specs], ranks=2) == [
        "spec 'x': resident='stacked' needs leading dim 2 (one slice per rank of world size 2), spec has shape [3, 4]",
        "spec 'w': resident=2 names a rank outside world size 2"]
    assert problems(params, [s.signature for s in specs], ranks=3) == []
