import json
import os
import subprocess
import sys
import time

import pytest
import torch

from golden_tasks.model.hashing import digest_json
from golden_tasks.storage import store as store_module
from golden_tasks.storage.entry import RACY_NS
from golden_tasks.storage.store import Store
from golden_tasks.storage.tensors import load_tensor, put_tensor


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
    assert a == b and a.digest != c.digest


def test_entry_round_trip_and_digest(store):
    obj = put_tensor(store, torch.ones(2))
    e1 = store.commit("golden", "k1", "case", {"out": obj}, {"x": 1}, {"seconds": 1.0})
    e2 = store.commit("golden", "k2", "case", {"out": obj}, {"x": 1}, {"seconds": 9.0})
    assert e1.digest == e2.digest  # stats stay out of the digest
    assert Store(store.root).get("golden", "k1") == e1
    assert store.get("golden", "missing") is None


def test_an_entry_records_each_object_with_its_kind(store):
    tensor, file = put_tensor(store, torch.ones(2)), store.put_buffer(b"launch")
    store.commit("compile", "k", "case", {"out": tensor, "launch.json": file}, {}, {})
    written = json.loads(store.entry_path("compile", "k").read_text())["objects"]
    assert written == {"out": {"digest": tensor.digest, "nbytes": 8, "dtype": "float32", "shape": [2], "kind": "tensor"},
                       "launch.json": {"digest": file.digest, "nbytes": 6, "kind": "file"}}
    assert Store(store.root).get("compile", "k").objects == {"out": tensor, "launch.json": file}


@pytest.mark.parametrize("malformed,field", [
    ({"nbytes": "8"}, "objects.out.nbytes: expected a count"),
    ({"kind": "blob"}, "objects.out: expected an object's record, its kind one of tensor, file"),
    ({"size": 8}, "objects.out.size: not a field of StoredTensor"),
])
def test_an_entry_with_a_malformed_object_record_is_dropped_and_recomputed(store, capsys, malformed, field):
    obj = put_tensor(store, torch.ones(2))
    store.commit("golden", "k", "case", {"out": obj}, {}, {})
    path = store.entry_path("golden", "k")
    record = json.loads(path.read_text())
    record["objects"]["out"].update(malformed)
    record["digest"] = content_digest_of(record)  # written so: its digest matches
    path.write_text(json.dumps(record))
    assert Store(store.root).get("golden", "k") is None
    assert f"cache entry golden:case (key k): its record is malformed: {field}" in capsys.readouterr().err
    assert not path.exists() and store.object_path(obj.digest).exists()  # its objects are gc's to collect
    recomputed = store.commit("golden", "k", "case", {"out": obj}, {}, {})
    assert Store(store.root).get("golden", "k") == recomputed


def content_digest_of(record: dict) -> str:
    return digest_json({"objects": record["objects"], "meta": record["meta"]})


def stored_entry(store):
    obj = put_tensor(store, torch.arange(64, dtype=torch.float32))
    store.commit("inputs", "k", "case", {"x": obj}, {}, {})
    return store.object_path(obj.digest)


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


def test_an_object_damaged_within_its_timestamps_granularity_is_found_damaged(store, capsys):
    """git's racy-clean case: a write within the file system's timestamp granularity of the recorded one
    leaves the same mtime (and a flip, the same size); a stat recorded that close to the commit proves
    nothing, so the object is re-hashed."""
    obj = put_tensor(store, torch.arange(64, dtype=torch.float32))
    path = store.object_path(obj.digest)
    now = time.time_ns()
    os.utime(path, ns=(now, now))  # written just now (an object written before the stamping, say)
    store.commit("inputs", "k", "case", {"x": obj}, {}, {})
    flip_byte(path)
    os.utime(path, ns=(now, now))  # the damaging write, in the same tick of the file system's clock
    assert Store(store.root).get("inputs", "k") is None
    assert "object 'x' content does not match its digest" in capsys.readouterr().err


def test_a_stored_object_is_stamped_in_the_past_so_its_stat_proves_it_unchanged(store, monkeypatch):
    """Every object is stamped RACY_NS before its write: any later write gives it another time, so a lookup
    trusts its size and mtime and reads nothing (a no-op run re-hashes no object)."""
    path = stored_entry(store)
    entry = Store(store.root).get("inputs", "k")
    digest = entry.objects["x"].digest
    assert entry.proof_of_content(digest) == os.stat(path).st_mtime_ns <= time.time_ns() - RACY_NS
    monkeypatch.setattr(store_module, "digest_file", lambda path: pytest.fail(f"{path} was re-hashed"))
    assert Store(store.root).get("inputs", "k") == entry
    flip_byte(path)  # now: another time
    monkeypatch.undo()
    assert Store(store.root).get("inputs", "k") is None


def test_read_only_store_writes_only_to_its_overlay(store, tmp_path):
    stored_entry(store)
    before = sorted(p for p in store.root.rglob("*"))
    ro = Store(store.root, readonly=True, overlay=tmp_path / "overlay")
    assert ro.get("inputs", "k") is not None
    obj = put_tensor(ro, torch.ones(3))
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


def test_a_lookup_writes_nothing_and_reads_an_entry_again_only_once_it_is_replaced(store):
    obj = put_tensor(store, torch.ones(2))
    store.commit("golden", "k1", "case", {"out": obj}, {"x": 1}, {})
    path = store.entry_path("golden", "k1")
    before = os.stat(path)
    assert store.get("golden", "k1").meta == {"x": 1} and store.get("golden", "k1").meta == {"x": 1}
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns  # no utime: gc learns of use from record_use
    store.commit("golden", "k1", "case", {"out": obj}, {"x": 2}, {})  # another process recomputed it
    assert store.get("golden", "k1").meta == {"x": 2}


def test_use_is_one_file_per_set_of_entries_and_its_time_is_their_last_use(store):
    used = {("golden", "k1"), ("inputs", "k2")}
    store.record_use(used)
    (record,) = (store.root / "log" / "used").iterdir()
    os.utime(record, (1000.0, 1000.0))
    assert store.last_used() == {("golden", "k1"): 1000.0, ("inputs", "k2"): 1000.0}
    store.record_use(used)  # the same set again: its file's time only
    store.record_use({("golden", "k1")})
    assert len(list((store.root / "log" / "used").iterdir())) == 2
    last = store.last_used()
    assert last[("inputs", "k2")] > 1000.0 and last[("golden", "k1")] >= last[("inputs", "k2")]


def test_an_entry_names_its_recipe_which_only_explain_reads(store):
    entry = store.commit("abi", "k1", "case", {}, {}, {}, {"stage": "abi", "plan": {"specs": [1, 2]}})
    assert len(store.entry_path("abi", "k1").read_bytes()) < 400  # the recipe is an object of its own
    assert store.recipe(entry) == {"stage": "abi", "plan": {"specs": [1, 2]}}
    store.object_path(entry.recipe).write_text("{}")
    assert store.recipe(entry) is None  # damaged: explain says there is no earlier run to compare with


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_files_get_the_mode_the_umask_gives_not_0600(tmp_path, mask):
    script = ("import os, sys; from pathlib import Path; from golden_tasks.storage.store import atomic_write; "
              f"os.umask({mask:#o}); atomic_write(Path(sys.argv[1]), lambda f: f.write(b'x'))")
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "f")], check=True)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_read_only_store_keeps_its_own_copy_of_an_object_whose_root_copy_is_damaged(tmp_path):
    """A read-only run that recomputes an output whose object lies damaged in the root (same digest) writes
    its copy to the overlay and reads that one, leaving the root as it was (the root's copy shadowed the
    recomputed one: a later stage then failed on the damage)."""
    root = Store(tmp_path / "root")
    digest = root.put_buffer(b"golden bytes").digest
    damaged = root.object_path(digest)
    os.chmod(damaged, 0o644)
    damaged.write_bytes(b"damaged byte")  # the same size
    readonly = Store(tmp_path / "root", readonly=True, overlay=tmp_path / "overlay")
    readonly.put_buffer(b"golden bytes")
    assert readonly.object_path(digest).read_bytes() == b"golden bytes"
    assert damaged.read_bytes() == b"damaged byte"
