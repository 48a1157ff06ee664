import json
import os

import pytest
import torch

from golden_tasks.store import Store
from golden_tasks.tensors import load_tensor, put_tensor


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "store")


@pytest.mark.parametrize("tensor", [
    torch.randn(3, 5), torch.randn(4, 6).to(torch.bfloat16), torch.tensor(3.5, dtype=torch.float16),
    torch.zeros(0, 4), torch.tensor([True, False]), torch.arange(-5, 5, dtype=torch.int8).reshape(2, 5),
    torch.randn(6, 4).t(),  # non-contiguous: stored contiguous
])
def test_tensor_round_trip_is_bitwise(store, tensor):
    record = put_tensor(store, tensor)
    back = load_tensor(store, record)
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.reshape(-1).view(torch.uint8) if back.numel() else back,
                       tensor.contiguous().reshape(-1).view(torch.uint8) if tensor.numel() else tensor)


def test_same_content_same_object(store):
    a = put_tensor(store, torch.ones(4))
    b = put_tensor(store, torch.ones(4))
    c = put_tensor(store, torch.ones(4, dtype=torch.float64))
    assert a == b and a["digest"] != c["digest"]


def test_entry_round_trip_and_digest(store):
    obj = {**put_tensor(store, torch.ones(2)), "kind": "tensor"}
    e1 = store.commit("golden", "k1", "case", {"out": obj}, {"x": 1}, {"seconds": 1.0})
    e2 = store.commit("golden", "k2", "case", {"out": obj}, {"x": 1}, {"seconds": 9.0})
    assert e1.digest == e2.digest  # stats stay out of the digest
    assert Store(store.root).get("golden", "k1") == e1
    assert store.get("golden", "missing") is None


def stored_entry(store):
    obj = {**put_tensor(store, torch.arange(64, dtype=torch.float32)), "kind": "tensor"}
    store.commit("inputs", "k", "case", {"x": obj}, {}, {})
    return store.object_path(obj["digest"])


def flip_byte(path, offset=17):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("damage,problem", [
    (lambda p: os.truncate(p, 100), "has 100 bytes, 256 recorded (truncated?)"),
    (flip_byte, "content does not match its digest (corrupted)"),
    (os.unlink, "is missing"),
])
def test_damaged_object_is_a_miss_with_a_warning_naming_the_entry(store, capsys, damage, problem):
    path = stored_entry(store)
    damage(path)
    assert Store(store.root).get("inputs", "k") is None
    assert f"cache entry inputs:case (key k): object 'x' {problem}; dropping it" in capsys.readouterr().err
    assert not store.entry_path("inputs", "k").exists() and not path.exists()
    # recomputing the same content stores it again
    assert stored_entry(Store(store.root)).exists() and Store(store.root).get("inputs", "k")


def test_a_flip_is_caught_on_load_even_when_mtime_is_unchanged(store):
    path = stored_entry(store)
    record = store.get("inputs", "k").objects["x"]
    st = os.stat(path)
    flip_byte(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: no trace in the metadata
    assert Store(store.root).get("inputs", "k") is not None  # the cheap status check cannot see it
    with pytest.raises(ValueError, match="does not match its digest"):
        load_tensor(store, record)


def test_read_only_store_writes_only_to_its_overlay(store, tmp_path):
    stored_entry(store)
    before = sorted(p for p in store.root.rglob("*"))
    ro = Store(store.root, readonly=True, overlay=tmp_path / "overlay")
    assert ro.get("inputs", "k") is not None
    obj = {**put_tensor(ro, torch.ones(3)), "kind": "tensor"}
    ro.commit("golden", "g", "case", {"out": obj}, {}, {})
    ro.log_run({"hits": {}})
    assert sorted(p for p in store.root.rglob("*")) == before
    assert ro.get("golden", "g") is not None and torch.equal(load_tensor(ro, obj), torch.ones(3))
    assert Store(store.root).get("golden", "g") is None


def test_no_temporary_files_left_behind(store):
    put_tensor(store, torch.ones(3))
    store.commit("abi", "k", "case", {}, {}, {})
    leftovers = [p for p in store.root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_an_edited_entry_record_is_a_miss_and_is_dropped(tmp_path, capsys):
    """The entry's digest covers its metadata: an edited verdict is corruption, never a report."""
    store = Store(tmp_path)
    entry = store.commit("validate", "k" * 32, "c", {}, {"status": "pass", "max_abs": 1.0}, {})
    path = store.entry_path("validate", entry.key)
    record = json.loads(path.read_text())
    record["meta"]["max_abs"] = 0.0
    path.write_text(json.dumps(record))
    assert store.get("validate", entry.key) is None
    assert "its record does not match its digest" in capsys.readouterr().err and not path.exists()
