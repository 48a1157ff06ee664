"""The typed rows of a parameter table and of a signature (golden_tasks.model.rows): their JSON, and the
refusal of a malformed row, naming its field, where one comes from an untrusted probe."""
import json
import re
from types import SimpleNamespace

import pytest

from golden_tasks.forms.untrusted import KernelFacts
from golden_tasks.model.errors import SpecError
from golden_tasks.model.outputs import AbiMeta
from golden_tasks.model.rows import ParamRow, SignatureRow, compiled_for


def test_rows_round_trip_through_json_with_their_unset_fields_left_out():
    rows = [ParamRow("x", "tensor", "in", "bfloat16", (None, 8)), ParamRow("n", "scalar", "in"),
            SignatureRow("x", "tensor", (2, 8), "bfloat16", resident="stacked"),
            SignatureRow("n", "scalar", (), "int64", value=-3), SignatureRow("o", "tensor", (4,), "float32", init="d")]
    for row in rows:
        assert type(row).from_json(json.loads(json.dumps(row.to_json())), "row") == row
    assert rows[1].to_json() == {"name": "n", "kind": "scalar", "direction": "in"}
    meta = AbiMeta(table=rows[:2], placement={"x": "stacked"})  # as a stored entry holds it, and read back
    assert AbiMeta.of(SimpleNamespace(meta=json.loads(json.dumps(meta.to_json())))) == meta


@pytest.mark.parametrize(("row", "message"), [
    ({"name": "x", "kind": "tensor"}, "params[0]: missing direction"),
    ({"name": "x", "kind": "vector", "direction": "in"}, "params[0].kind: expected 'tensor' or 'scalar', got 'vector'"),
    ({"name": "x", "kind": "tensor", "direction": "up"}, "params[0].direction: expected 'in' or 'out' or 'inout'"),
    ({"name": "../x", "kind": "tensor", "direction": "in"}, "params[0].name: expected an identifier, got '../x'"),
    ({"name": "x", "kind": "tensor", "direction": "in", "shape": [2, -1]}, "params[0].shape: expected a list of dims"),
    ({"name": "x", "kind": "tensor", "direction": "in", "dtype": 3}, "params[0].dtype: expected text, got 3"),
    ({"name": "x", "kind": "tensor", "direction": "in", "size": 3}, "params[0].size: not a field of a ParamRow"),
    (["x", "tensor", "in"], "params[0]: expected an object"),
])
def test_a_probe_answering_a_malformed_row_is_refused_naming_the_field(row, message):
    answer = json.dumps({"ranks": 1, "params": [row], "digest": "d"})
    expected = f"kernel='pkg.mod:k': its probe answered a malformed parameter table: {message}"
    with pytest.raises(SpecError, match="^" + re.escape(expected)):
        KernelFacts.from_json(answer, "pkg.mod:k")


def test_a_probe_answer_round_trips_and_one_without_a_table_is_refused():
    facts = KernelFacts(1, [ParamRow("x", "tensor", "in"), ParamRow("out", "tensor", "out")], "d")
    assert KernelFacts.from_json(facts.to_json(), "pkg.mod:k") == facts
    with pytest.raises(SpecError, match="its probe did not answer with its facts"):
        KernelFacts.from_json(json.dumps({"ranks": 1, "digest": "d"}), "pkg.mod:k")


def test_a_build_that_serves_every_call_serves_each_checked_row_and_no_other():
    checked = [ParamRow("x", "tensor", "in", "float32", (4, 8)), ParamRow("k", "scalar", "in", "int32", (), 3)]
    opened = [r.open() for r in checked]
    assert opened == [ParamRow("x", "tensor", "in", "float32"), ParamRow("k", "scalar", "in", "int32", ())]
    assert all(map(ParamRow.serves, opened, checked)) and all(map(ParamRow.serves, checked, checked))
    assert not ParamRow("x", "tensor", "in", "float32", (4, 16)).serves(checked[0])
    assert not ParamRow("x", "tensor", "in", "bfloat16").serves(checked[0])
    assert not ParamRow("k", "scalar", "in", "int32", (), 4).serves(checked[1])
    assert compiled_for([ParamRow("x", "tensor", "inout"), ParamRow("k", "scalar", "in")],
                        [SignatureRow("x", "tensor", (4, 8), "float32"), SignatureRow("k", "scalar", (), "int32", 3)],
                        builds_once=True) == [ParamRow("x", "tensor", "inout", "float32"), opened[1]]
