"""Keys: what enters them, and resolution through upstream entries."""
from golden_tasks import graph
from golden_tasks.store import Store

PLAN = {"case": "c", "params": [], "signature": [], "kernel": "k1", "backend": None, "options": {},
        "specs": [], "seed": 0, "golden": "g1", "bench": {"warmup": 1, "rounds": 1}, "policy": "p1",
        "data_in": {}, "data_out": {}, "external": {}}


def commit(store, stage, plan, meta):
    key, _ = graph.resolve(graph.BY_NAME[stage], plan, store)
    return store.commit(stage, key, plan["case"], {}, meta, {})


def test_stages_are_in_topological_order():
    seen = set()
    for stage in graph.STAGES:
        assert set(stage.reads) | set(stage.after) <= seen, stage.name
        seen.add(stage.name)


def test_key_needs_every_upstream_entry(tmp_path):
    store = Store(tmp_path)
    assert graph.resolve(graph.BY_NAME["abi"], PLAN, store)[0] is not None
    assert graph.resolve(graph.BY_NAME["inputs"], PLAN, store) == (None, {})
    commit(store, "abi", PLAN, {"table": []})
    key, upstream = graph.resolve(graph.BY_NAME["inputs"], PLAN, store)
    assert key and set(upstream) == {"abi"}


def test_key_covers_only_the_stage_plan_fields(tmp_path):
    store = Store(tmp_path)
    commit(store, "abi", PLAN, {"table": []})
    inputs = graph.BY_NAME["inputs"]
    base = graph.resolve(inputs, PLAN, store)[0]
    assert graph.resolve(inputs, {**PLAN, "kernel": "k2", "golden": "g2"}, store)[0] == base
    assert graph.resolve(inputs, {**PLAN, "seed": 1}, store)[0] != base


def test_upstream_digest_change_changes_downstream_key(tmp_path):
    a, b = Store(tmp_path / "a"), Store(tmp_path / "b")
    commit(a, "abi", PLAN, {"table": [1]})
    commit(b, "abi", PLAN, {"table": [2]})
    inputs = graph.BY_NAME["inputs"]
    assert graph.resolve(inputs, PLAN, a)[0] != graph.resolve(inputs, PLAN, b)[0]


def test_pipeline_version_is_stable():
    assert graph.pipeline_version() == graph.pipeline_version()
