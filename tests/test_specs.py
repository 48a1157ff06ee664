import pytest
import torch

from golden_tasks import ScalarSpec, SpecError, TensorSpec
from golden_tasks.model.rows import ParamRow, SignatureRow
from golden_tasks.model.specs import canary, stamp_all, table_of, unwritten


def test_init_value_rules():
    assert torch.equal(TensorSpec("a", (2, 3), torch.float32).make(), torch.zeros(2, 3))
    assert torch.equal(TensorSpec("a", (2,), torch.int32, 7).make(), torch.tensor([7, 7], dtype=torch.int32))
    src = torch.tensor([1.5, 2.5], dtype=torch.float64)
    made = TensorSpec("a", (2,), torch.bfloat16, src).make()
    assert made.dtype == torch.bfloat16 and made.tolist() == [1.5, 2.5]
    torch.manual_seed(0)
    r = TensorSpec("a", (4, 4), torch.float32, torch.randn).make()
    torch.manual_seed(0)
    assert torch.equal(r, torch.randn(4, 4))
    assert torch.equal(TensorSpec("a", (3,), torch.float32, torch.ones).make(), torch.ones(3))
    assert TensorSpec("a", (2,), torch.float16, lambda: [1, 2]).make().dtype == torch.float16


def test_bad_tensor_specs_name_the_spec():
    with pytest.raises(SpecError, match="'y'.*unknown init_value"):
        TensorSpec("y", (2,), torch.float32, "randn")
    with pytest.raises(SpecError, match="'y'.*init_value tensor has shape"):
        TensorSpec("y", (2,), torch.float32, torch.zeros(3))
    with pytest.raises(SpecError, match="'y'.*init_value callable returned shape"):
        TensorSpec("y", (2,), torch.float32, lambda: torch.zeros(3)).make()
    with pytest.raises(SpecError, match="'y'.*negative"):
        TensorSpec("y", (2, -1), torch.float32)
    with pytest.raises(SpecError, match="'y'.*not a torch.dtype"):
        TensorSpec("y", (2,), "float32")


@pytest.mark.parametrize("dtype,value", [
    (torch.int8, -128), (torch.int32, 2**31 - 1), (torch.int64, -(2**63)), (torch.uint8, 255),
    (torch.bool, True), (torch.float32, 1e-6), (torch.float16, -2.5), (torch.bfloat16, 3),
])
def test_scalar_dtypes_accept_their_values(dtype, value):
    spec = ScalarSpec("s", dtype, value)
    assert spec.tensor.dtype == dtype and spec.tensor.dim() == 0


@pytest.mark.parametrize("dtype,value,match", [
    (torch.int8, 128, "out of range"), (torch.uint8, -1, "out of range"), (torch.int32, 1.0, "not a int"),
    (torch.bool, 1, "not a bool"), (torch.float16, 1e6, "out of range"), (torch.float32, "1", "not a float"),
    (torch.complex64, 1.0, "is not one of"),
])
def test_scalar_checks(dtype, value, match):
    with pytest.raises(SpecError, match=f"scalar 's'.*{match}"):
        ScalarSpec("s", dtype, value)


def test_direction_is_stamped_never_guessed():
    spec = TensorSpec("x", (2,), torch.float32)
    with pytest.raises(SpecError, match="before the ABI stage stamped"):
        _ = spec.is_output
    with pytest.raises(SpecError):
        _ = spec.is_input
    out = spec.stamped("out")
    assert out.is_output and not out.is_input and spec._direction is None
    inout = spec.stamped("inout")
    assert inout.is_input and inout.is_output


def test_stamp_all_and_signature():
    specs = [TensorSpec("x", (2,), torch.float32), ScalarSpec("k", torch.int32, 3)]
    table = [ParamRow("k", "scalar", "in"), ParamRow("x", "tensor", "inout")]
    x, k = stamp_all(specs, table)
    assert x.direction == "inout" and k.direction == "in"
    assert specs[1].signature == SignatureRow("k", "scalar", (), "int32", value=3)
    assert specs[1].signature.to_json() == {"name": "k", "kind": "scalar", "shape": [], "dtype": "int32", "value": 3}


def test_each_spec_answers_for_itself_what_a_call_a_table_and_an_input_set_make_of_it():
    x = TensorSpec("x", (4, 2), torch.float32, 1.0, resident="stacked").stamped("in")
    k = ScalarSpec("k", torch.int32, 3).stamped("in")
    assert [s.argument(lambda t: t.name.upper()) for s in (x, k)] == ["X", 3]
    assert not x.by_value and k.by_value
    assert table_of([x, k]) == [ParamRow("x", "tensor", "in", "float32", (4, 2)), ParamRow("k", "scalar", "in", "int32", (), 3)]
    assert table_of([x, k], [((2,), "bfloat16")])[0] == ParamRow("x", "tensor", "in", "bfloat16", (2,))
    assert x.input_recipe(lambda value: f"fp {value}").init == "fp 1.0" and k.input_recipe(str) == k.signature
    assert x.rank_view().shape == (2,) and x.rank_view().direction == "in" and k.rank_view() is k
    assert x.mismatch(torch.zeros(4, 2)) is None and "shape (4,) float32" in x.mismatch(torch.zeros(4))
    assert k.mismatch(torch.tensor(3)) is None and "holds 4, but scalar 'k' is 3" in k.mismatch(torch.tensor(4))


@pytest.mark.parametrize("resident, match", [(True, "resident=True is ambiguous or unknown"),
                                             (-1, "resident=-1 is ambiguous"), ("all", "resident='all'"),
                                             (1.0, "resident=1.0")])
def test_resident_is_a_rank_or_stacked_and_true_is_refused(resident, match):
    with pytest.raises(SpecError, match=f"^spec 'x': {match}"):
        TensorSpec("x", (2, 3), torch.float32, resident=resident)


def test_resident_places_a_tensor_and_enters_its_signature():
    assert TensorSpec("x", (2, 3), torch.float32, resident=False).resident is None
    assert "resident" not in TensorSpec("x", (2, 3), torch.float32).signature.to_json()
    assert TensorSpec("x", (2, 3), torch.float32, resident="stacked").signature.resident == "stacked"
    assert TensorSpec("x", (2, 3), torch.float32, resident=1).signature.resident == 1
    with pytest.raises(SpecError, match="needs a leading dim"):
        TensorSpec("x", (), torch.float32, resident="stacked")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool])
def test_a_canary_buffer_is_unwritten_until_each_element_is_written(dtype):
    buffer = canary((2, 3), dtype)
    assert buffer.dtype == dtype and buffer.shape == (2, 3)
    if dtype == torch.bool:  # no spare value: zeros, never reported
        assert not buffer.any() and not unwritten(buffer).any()
        return
    assert unwritten(buffer).all()
    buffer[0, 1] = 1
    assert unwritten(buffer).tolist() == [[True, False, True], [True, True, True]]
    if dtype.is_floating_point:  # a NaN, but not the NaN arithmetic makes
        assert buffer[1].isnan().all()
        assert not unwritten(torch.full((4,), float("nan"), dtype=dtype)).any()
        assert not unwritten(torch.zeros(4, dtype=dtype) / 0 * 0).any()
