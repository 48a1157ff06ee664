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


def test_entry_with_a_missing_or_truncated_object_is_a_miss(store):
    obj = {**put_tensor(store, torch.ones(8)), "kind": "tensor"}
    store.commit("inputs", "k", "case", {"x": obj}, {}, {})
    path = store.object_path(obj["digest"])
    with open(path, "r+b") as f:
        f.truncate(4)
    assert Store(store.root).get("inputs", "k") is None
    os.unlink(path)
    assert Store(store.root).get("inputs", "k") is None


def test_no_temporary_files_left_behind(store):
    put_tensor(store, torch.ones(3))
    store.commit("abi", "k", "case", {}, {}, {})
    leftovers = [p for p in store.root.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
