"""The typed plan (golden_tasks.model.plan), the run's variables (golden_tasks.planning.library) and the stage
outputs' schema (golden_tasks.model.outputs): what derives from each field's declaration."""
import dataclasses
import json
import re

import pytest
import torch

from golden_tasks.model import plan
from golden_tasks.model.outputs import Meta, Stats, ValidateMeta
from golden_tasks.model.plan import FailedPlan, Plan
from golden_tasks.model.records import Timing
from golden_tasks.model.rows import ParamRow, SignatureRow
from golden_tasks.pipeline import graph
from golden_tasks.pipeline.stage_table import BY_NAME, STAGES
from golden_tasks.planning.library import run_variables

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine


def test_every_field_list_derives_from_the_declarations():
    assert plan.SOURCE_FIELDS == ("params", "signature", "specs", "seed", "kernel", "compiled_for", "ranks", "resources",
                                  "golden", "policy", "work", "data_in", "data_out", "external")
    assert plan.EVERY_STAGE == ("case", "module", "profile", "timeout")
    assert set(plan.REPLAY_MEANING) == set(plan.SOURCE_FIELDS)
    assert plan.VARIABLES == ("timeout", "backend", "options", "warmup", "rounds", "rse", "budget", "flush", "fresh")
    assert BY_NAME["abi"].plan_fields == ("params", "signature", "ranks", "nonce")
    assert BY_NAME["dispatch"].plan_fields == ("ranks", "resources", "external", "nonce")
    for stage in STAGES:
        assert ("nonce" in stage.plan_fields) == stage.per_case
        assert ("external" in stage.plan_fields) == (stage.name not in ("abi", "calibrate"))
    assert BY_NAME["calibrate"].plan_fields == ()  # one entry per machine class, whatever the case


def test_a_stage_reads_only_its_key_and_the_context():
    view = graph.view(BY_NAME["inputs"], Plan(case="c", seed=7, timeout=3.0))
    assert (view.seed, view.case, view.timeout) == (7, "c", 3.0)
    with pytest.raises(AttributeError, match="^the inputs stage read plan field 'kernel', which is not in its key$"):
        _ = view.kernel
    with pytest.raises(AttributeError, match="read-only"):
        view.seed = 1


def test_variables_override_their_fields_and_bad_values_name_the_variable(tmp_path):
    base = Plan(case="c", options={"a": 1}, bench={"warmup": 5, "rounds": None})
    new = base.overridden({"backend": "eager", "options": '{"b": 2}', "rounds": "3", "timeout": "2.5", "rse": "0.005",
                           "budget": "2", "flush": "1"})
    assert (new.backend, new.options, new.bench, new.timeout) == (
        "eager", {"a": 1, "b": 2}, {"warmup": 5, "rounds": 3, "rse": 0.005, "budget": 2.0, "flush": True}, 2.5)
    assert base.overridden({}) == base and base.overridden({"backend": ""}).backend is None
    assert base.overridden({"fresh": "1"}).fresh is True and base.overridden({"fresh": "0"}).fresh is False
    for name, value, message in (("rounds", "0", "is not an integer >= 1"), ("warmup", "-1", ">= 0"),
                                 ("timeout", "soon", "seconds > 0"), ("options", "[1]", "not a JSON object"),
                                 ("rse", "abc", "not a number > 0"), ("budget", "0", "not a number of seconds > 0"),
                                 ("flush", "yes", "not 0 or 1"), ("fresh", "2", "not 0 or 1"),
                                 ("backend", "eagr", "is not a backend")):
        with pytest.raises(ValueError, match="^" + re.escape(f"doit variable {name}={value!r}")):
            base.overridden({name: value})
        with pytest.raises(ValueError, match=message):  # checked even when no case exists
            run_variables(tmp_path, {name: value}.get)


def test_plans_round_trip_through_json_and_a_failure_is_its_own_state():
    made = Plan(case="c", module="kernels.k", params=[ParamRow("x", "tensor", "in")],
                signature=[SignatureRow("eps", "scalar", (), "float32", value=0.5)], volatile=["a lock"])
    assert plan.from_json(made.to_json()) == made and made.error is None
    # typed rows, written as JSON without their unset fields; read back, they key every stage alike
    assert made.to_json()["params"] == [{"name": "x", "kind": "tensor", "direction": "in"}]
    assert made.to_json()["signature"] == [{"name": "eps", "kind": "scalar", "shape": [], "dtype": "float32",
                                            "value": 0.5}]
    read = plan.from_json(json.loads(json.dumps(made.to_json())))
    assert all(graph.keyed(stage, read) == graph.keyed(stage, made) for stage in STAGES)
    failed = FailedPlan("c", "kernels.k", "SpecError: bad", "default")
    assert plan.from_json(failed.to_json()) == failed and failed.error == "SpecError: bad"


def test_only_a_volatile_plan_gets_a_nonce_and_a_new_one_every_run():
    assert Plan(case="c").for_this_run().nonce is None
    volatile = Plan(case="c", volatile=["a lock"])
    first, second = volatile.for_this_run().nonce, volatile.for_this_run().nonce
    assert first is not None and second is not None and first != second


def test_outputs_read_back_typed_with_one_skip_convention():
    @dataclasses.dataclass
    class Stored:  # what store.Entry holds: JSON meta and stats
        meta: dict
        stats: dict

    verdict = ValidateMeta(outputs=[{"name": "out"}], max_abs=0.5)
    assert ValidateMeta.of(Stored(verdict.to_json(), {})) == verdict
    skipped = ValidateMeta(skipped="no golden")
    assert ValidateMeta.of(Stored(skipped.to_json(), {})).skipped == "no golden"
    assert Meta.of(Stored({"skipped": None}, {})).skipped is None
    assert Stats(seconds=1.0).to_json() == {"seconds": 1.0}
    assert Stats.of(Stored({}, {"seconds": 1.0, "kernel_us": {"median": 2.0}})).kernel_us == Timing(median=2.0)


def test_the_world_size_is_the_kernels_unless_a_case_or_ranks_says_otherwise(monkeypatch):
    from golden_tasks import Case, In, Out, SpecError, TensorSpec, jit
    from golden_tasks.planning.case import plan_of
    from golden_tasks.project import config

    @jit(backend="eager", ranks=2)
    def k(x: In, out: Out):
        out.copy_(x)

    @jit(backend="eager")
    def single(x: In, out: Out):
        out.copy_(x)

    def specs(ranks=1):  # a stacked input follows the world size
        return [TensorSpec("x", (ranks, 2), torch.float32, resident="stacked"), TensorSpec("out", (2,), torch.float32)]

    assert plan_of(Case("c", specs=specs, kernel=k).resolved())[0].ranks == 2
    made = plan_of(Case("c", specs=specs, kernel=k, ranks=4).resolved())[0]
    assert made.ranks == 4 and made.signature[0].shape == (4, 2)
    assert "ranks" in BY_NAME["abi"].plan_fields and "ranks" in BY_NAME["dispatch"].plan_fields
    config.enter(config.current().given({"ranks": "3"}.get))  # ranks=N: every multi-rank case, specs included; one-rank kernels stay
    assert config.current().ranks == 3 and config.planning_context() == "default.ranks3"
    made = plan_of(Case("c", specs=specs, kernel=k, ranks=4).resolved())[0]
    assert made.ranks == 3 and made.signature[0].shape == (3, 2)
    assert plan_of(Case("c", specs=specs, kernel=single).resolved())[0].ranks == 1
    with pytest.raises(ValueError, match=r"^doit variable ranks='0' is not a world size"):
        config.current().given({"ranks": "0"}.get)
    with pytest.raises(SpecError, match=r"^case 'c': ranks=0 is not a world size"):
        Case("c", specs=specs, kernel=k, ranks=0).resolved()
    with pytest.raises(SpecError, match=r"^kernel k: ranks=True is not a world size"):
        jit(k.fn, ranks=True)
