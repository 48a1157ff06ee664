"""Keys: what enters them, and resolution through upstream entries (graph.Lookups); running a stage (execution)."""
import dataclasses
import importlib
import json

from golden_tasks.model.outputs import AbiMeta, Outputs
from golden_tasks.model.plan import Plan
from golden_tasks.model.rows import ParamRow, SignatureRow, compiled_for
from golden_tasks.pipeline import execution, graph, stored
from golden_tasks.pipeline.stage_table import BY_NAME, STAGES
from golden_tasks.project import toolchain
from golden_tasks.storage.store import Store

PLAN = Plan(case="c", kernel="k1", golden="g1", bench={"warmup": 1, "rounds": 1}, policy="p1")


def commit(store, stage, plan, meta):
    key, _ = graph.Lookups(plan, store).resolve(BY_NAME[stage])
    return store.commit(stage, key, plan.case, {}, meta, {})


def test_key_needs_every_upstream_entry(tmp_path):
    store = Store(tmp_path)
    assert graph.Lookups(PLAN, store).resolve(BY_NAME["abi"])[0] is not None
    assert graph.Lookups(PLAN, store).resolve(BY_NAME["inputs"]) == (None, {})
    commit(store, "abi", PLAN, {"table": []})
    key, upstream = graph.Lookups(PLAN, store).resolve(BY_NAME["inputs"])
    assert key and set(upstream) == {"abi"}


def test_key_covers_only_the_stage_plan_fields(tmp_path):
    store = Store(tmp_path)
    commit(store, "abi", PLAN, {"table": []})
    inputs = BY_NAME["inputs"]
    base = graph.Lookups(PLAN, store).resolve(inputs)[0]
    assert graph.Lookups(dataclasses.replace(PLAN, kernel="k2", golden="g2"), store).resolve(inputs)[0] == base
    assert graph.Lookups(dataclasses.replace(PLAN, seed=1), store).resolve(inputs)[0] != base


def test_upstream_digest_change_changes_downstream_key(tmp_path):
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    commit(a, "abi", PLAN, {"table": [1]})
    commit(b, "abi", PLAN, {"table": [2]})
    inputs = BY_NAME["inputs"]
    assert graph.Lookups(PLAN, a).resolve(inputs)[0] != graph.Lookups(PLAN, b).resolve(inputs)[0]


def test_pipeline_version_is_stable():
    assert toolchain.pipeline_version() == toolchain.pipeline_version()


def key_of(stage, plan, store):
    """The stage's key, its upstream committed first with the same (empty) outputs whatever the plan:
    only the plan's own contribution to the key can differ."""
    for name in stage.reads:
        upstream = BY_NAME[name]
        store.commit(name, key_of(upstream, plan, store), plan.case, {}, {}, {})
    return graph.Lookups(plan, store).resolve(stage)[0]


def keys_differ(stage_name, edit, tmp_path):
    """Whether editing the plan (fields replaced) changes the stage's key."""
    store, stage = Store(tmp_path), BY_NAME[stage_name]
    return key_of(stage, PLAN, store) != key_of(stage, dataclasses.replace(PLAN, **edit), store)


def compiled(*signature: SignatureRow, generic: bool = False) -> dict:
    return {"compiled_for": compiled_for([ParamRow(s.name, s.kind, "in") for s in signature], list(signature), generic)}


def test_scalar_values_enter_the_compile_key(tmp_path):
    """AOTInductor compiles scalar values in as constants."""
    assert keys_differ("compile", compiled(SignatureRow("eps", "scalar", (), "float32", value=2.0)), tmp_path)
    assert compiled(SignatureRow("eps", "scalar", (), "float32", value=2.0), generic=True) == \
        compiled(SignatureRow("eps", "scalar", (), "float32", value=3.0), generic=True)  # a build serving every call


def test_a_kernel_one_build_serves_has_one_compile_key_for_every_shape(tmp_path):
    """A sweep's points that differ in shapes share the compile of a kernel one build serves (KernelForm.builds_once),
    and only its; the compile reads nothing of the ABI's output, whose table holds the shapes."""
    def compile_key(shape, generic, dtype="float32"):
        plan = dataclasses.replace(PLAN, signature=[SignatureRow("x", "tensor", shape, dtype)],
                                   **compiled(SignatureRow("x", "tensor", shape, dtype), generic=generic))
        return key_of(BY_NAME["compile"], plan, Store(tmp_path))
    assert BY_NAME["compile"].reads == ()
    assert compile_key((4, 8), True) == compile_key((16, 8), True)
    assert compile_key((4, 8), True) != compile_key((4, 8), True, dtype="bfloat16")
    assert compile_key((4, 8), False) != compile_key((16, 8), False)


def test_the_golden_key_follows_the_specs_and_seed(tmp_path):
    """The golden fills pure Outs from their init_value, seeded: neither reaches it through inputs."""
    out = SignatureRow("o", "tensor", (2,), "float32", init="nan-marker")
    assert keys_differ("golden", {"specs": [out]}, tmp_path)
    assert keys_differ("golden", {"seed": 1}, tmp_path)


def test_declared_reads_enter_every_stage_that_runs_user_code(tmp_path):
    external = {"external": {"files": {"table.bin": {"table.bin": "d1"}}, "env": {}}}
    assert not keys_differ("abi", external, tmp_path)
    for stage in ("compile", "inputs", "golden", "dispatch", "validate", "bench"):
        assert keys_differ(stage, external, tmp_path), stage


def test_a_nonce_changes_every_key_of_a_case(tmp_path):
    for stage in STAGES:  # calibrate's holds nothing of a case: one measure of the machine serves every case
        assert keys_differ(stage.name, {"nonce": "n1"}, tmp_path) == stage.per_case, stage.name


def test_a_stage_sees_only_the_plan_fields_its_key_covers(tmp_path, monkeypatch):
    seen = {}

    def spy(case, plan, workdir, upstream):
        for field in dataclasses.fields(Plan):
            try:
                seen[field.name] = getattr(plan, field.name)
            except AttributeError as exc:
                assert str(exc) == f"the abi stage read plan field {field.name!r}, which is not in its key"
        return Outputs(meta=AbiMeta())
    monkeypatch.setattr(importlib.import_module(BY_NAME["abi"].module), "run", spy)
    execution.execute(BY_NAME["abi"], dataclasses.replace(PLAN, timeout=1.0), Store(tmp_path))
    assert set(seen) == {"case", "module", "profile", "timeout", "params", "signature", "ranks", "nonce"}
    assert seen["timeout"] == 1.0


def test_a_waiting_computation_finds_the_entry_made_while_it_waited(tmp_path):
    store = Store(tmp_path)
    key, _ = graph.Lookups(PLAN, store).resolve(BY_NAME["abi"])
    with store.computing("abi", key):
        store.commit("abi", key, "c", {}, {"table": ["made by the lock holder"]}, {})
    entry, ran = execution.execute(BY_NAME["abi"], PLAN, store)
    assert not ran and entry.meta == {"table": ["made by the lock holder"]}


def test_a_replaced_entry_is_read_again(tmp_path):
    """Another process may recompute a dropped entry under the same key, with another digest."""
    store = Store(tmp_path)
    first = commit(store, "abi", PLAN, {"table": [1]})
    assert store.get("abi", first.key).digest == first.digest
    other = Store(tmp_path).commit("abi", first.key, "c", {}, {"table": [2]}, {})
    assert store.get("abi", first.key).digest == other.digest != first.digest


def test_round_times_live_in_a_samples_object_beside_the_summary(tmp_path):
    from golden_tasks.model.outputs import SAMPLES_FILE, Stats
    from golden_tasks.model.records import Timing

    store = Store(tmp_path)
    timing = Timing.of_rounds([10.0, 11.0, 10.5, 40.0, 10.2], "rounds", 1)
    ranked = dataclasses.replace(timing, ranks=[Timing.of_rounds([1.0, 2.0], "rounds", 1),
                                                Timing.of_rounds([3.0, 4.0], "rounds", 1)])
    made = stored.store_outputs(store, Outputs(stats=Stats(kernel_us=ranked, golden_us=timing)), 0.5)
    objects, stats = made.objects, made.stats
    assert "times" not in json.dumps(stats) and stats["kernel_us"]["outliers"] == 1
    assert stats["kernel_us"]["ranks"][1]["median"] == 3.5 and SAMPLES_FILE in objects
    entry = store.commit("bench", "k", "c", objects, {}, stats)
    joined = stored.load_timings(store, entry)
    assert joined.kernel_us == ranked and joined.golden_us == timing and joined.seconds == 0.5
