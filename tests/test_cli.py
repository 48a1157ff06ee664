"""The golden-tasks command: stats, verify (fsck), gc and explain, on a real verified project."""
import os
import sys
import time
import types
from pathlib import Path

import pytest
from project import Project, stage_results

from golden_tasks.frontends import cli
from golden_tasks.pipeline.stage_table import STAGES

EAGER = "backend=eager"


@pytest.fixture
def project(tmp_path):
    proj = Project(tmp_path / "project", ("hello_world", "rms_norm"))
    code, _, _, err = proj.doit("verify", EAGER)
    assert code == 0, err
    return proj


@pytest.mark.e2e
def test_stats_counts_entries_bytes_and_runs(project):
    project.doit("verify", EAGER)
    out = project.cli("stats").stdout
    assert "compile           3" in out  # hello_world, rms_norm, rms_norm_bf16
    assert "last 2 runs:" in out
    stages = 3 * (len(STAGES) - 1) + 1  # each case's stages, and the one calibrate:machine every case reads
    # the first run finds only the machine's calibration, which the cache held (tests start with it: conftest)
    assert f"3 cases, 1 hits, {stages - 1} misses" in out
    assert f"3 cases, {stages} hits, 0 misses" in out


@pytest.mark.e2e
def test_verify_finds_and_drops_a_corrupt_object(project):
    assert project.cli("verify").returncode == 0
    (entry,) = [e for e in project.entries("inputs") if e["case"] == "rms_norm"]
    digest = entry["objects"]["x"]["digest"]
    path = project.cache / "objects" / digest[:2] / digest
    path.write_bytes(b"garbage" + path.read_bytes()[7:])
    found = project.cli("verify")
    assert found.returncode == 1
    assert f"corrupt object {path}" in found.stdout and "bad entry inputs:rms_norm" in found.stdout
    dropped = project.cli("verify", "--drop")
    assert dropped.returncode == 0 and "dropped" in dropped.stdout
    assert project.cli("verify").stdout.strip().endswith("0 problem(s) found")
    code, results, _, _ = project.doit("verify:rms_norm", EAGER)
    assert code == 0 and results["inputs:rms_norm"] == "success"


@pytest.mark.e2e
def test_gc_unused_keeps_exactly_what_the_library_uses(project):
    project.edit("rms_norm", 't["out"].copy_(x / rms', 't["out"].copy_(1.0 * x / rms')
    assert project.doit("verify", EAGER)[0] == 0
    before = len(project.entries("golden"))
    out = project.cli("gc", "--unused", EAGER).stdout
    assert len(project.entries("golden")) == before - 2  # the old goldens of rms_norm and rms_norm_bf16
    assert out.startswith("dropped ")
    code, results, _, _ = project.doit("verify", EAGER)
    assert code == 0 and set(stage_results(results).values()) == {"up-to-date"}
    assert project.cli("verify").returncode == 0


@pytest.mark.e2e
def test_gc_by_age_and_by_size(project):
    old = time.time() - 10 * 86400
    for path in (project.cache / "entries" / "bench").glob("*/*.json"):
        os.utime(path, (old, old))
    project.cli("gc", "--older-than", "5")
    assert project.entries("bench")  # made long ago, but a run used them now (log/used)
    for path in (project.cache / "log" / "used").glob("*"):
        os.utime(path, (old, old))
    project.cli("gc", "--older-than", "5")
    assert project.entries("bench") == [] and project.entries("golden")
    project.cli("gc", "--max-size", "0")
    assert project.entries() == [] and not [p for p in (project.cache / "objects").glob("*/*")]


@pytest.mark.e2e
def test_explain_names_what_changed(project):
    assert "is up to date" in project.cli("explain", "golden:rms_norm", EAGER).stdout
    project.edit("rms_norm", 't["out"].copy_(x / rms', 't["out"].copy_(1.0 * x / rms')
    project.edit("rms_norm", "TILE = 128", "TILE = 96")
    assert "golden changed: golden_rms_norm (body)" in project.cli("explain", "golden:rms_norm", EAGER).stdout
    assert "kernel changed: TILE" in project.cli("explain", "compile:rms_norm", EAGER).stdout
    assert "its key depends on upstream dispatch, golden, not cached yet" in project.cli(
        "explain", "validate:rms_norm", EAGER).stdout
    assert "backend" in project.cli("explain", "compile:rms_norm").stdout  # aoti never ran here
    project.restore("rms_norm")
    project.edit("rms_norm", 'TensorSpec("x", (ROWS, COLS), dtype, init_value=torch.randn)',
                 'TensorSpec("x", (ROWS, COLS), dtype, init_value=torch.rand)')
    assert "specs changed: x" in project.cli("explain", "inputs:rms_norm", EAGER).stdout


@pytest.mark.e2e
def test_explain_names_a_toolchain_change(project):
    project.env["CXX"] = "a-compiler-that-is-not-there"
    out = project.cli("explain", "abi:hello_world", EAGER).stdout
    assert "toolchain changed: toolchain.cxx" in out


@pytest.mark.parametrize("argv", [
    ["--project", "{p}", "--cache", "{c}", "stats"],
    ["stats", "--project", "{p}", "--cache", "{c}"],
    ["--project", "{p}", "stats", "--cache", "{c}"],  # one before, one after: neither is lost
    ["--cache", "{c}", "stats", "--project", "{p}"],
])
def test_global_options_before_or_after_the_subcommand(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.delenv("GOLDEN_TASKS_CACHE_READONLY", raising=False)
    cache = tmp_path / "c"
    cache.mkdir()
    argv = [a.format(p=tmp_path, c=cache) for a in argv]
    assert cli.main(argv) == 0
    assert f"cache: {cache}" in capsys.readouterr().out


def test_replay_takes_project_after_its_directory(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("golden_tasks.pipeline.replay")
    fake.main = lambda runtime_dir, project: calls.append((runtime_dir, project)) or 0
    monkeypatch.setitem(sys.modules, "golden_tasks.pipeline.replay", fake)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["replay", "runs/rms_norm", "--project", str(tmp_path / "checkout")]) == 0
    assert cli.main(["--project", str(tmp_path / "checkout"), "replay", "runs/rms_norm"]) == 0
    assert cli.main(["replay", "runs/rms_norm"]) == 0
    assert calls == [(Path("runs/rms_norm"), tmp_path / "checkout")] * 2 + [(Path("runs/rms_norm"), tmp_path)]


@pytest.mark.e2e
def test_doit_info_gives_a_readable_reason(tmp_path):
    """`doit info` names why a task runs (not doit's `<function ...>`), and its explain line names what changed."""
    proj = Project(tmp_path / "project", ("hello_world",))

    def info(task, *variables):
        out = proj.console("info", task, EAGER, *variables).stdout
        assert "<function" not in out
        return out

    cold = info("validate:hello_world")
    assert "validate:hello_world: its key depends on upstream abi, dispatch, golden, inputs, policy, not cached yet" \
        in cold
    assert "runs/hello_world holds no run yet" in info("runtime:hello_world")
    code, _, _, err = proj.doit("verify", EAGER)
    assert code == 0, err
    assert "status     : up-to-date" in info("validate:hello_world")
    assert "bench:hello_world: fresh=1 measures its timings again" in info("bench:hello_world", "fresh=1")
    proj.edit("hello_world", 't["out"].copy_(t["x"] + t["y"])', 't["out"].copy_(t["y"] + t["x"])')
    edited = info("golden:hello_world")
    assert "golden:hello_world: no cached entry under its key" in edited
    assert "`golden-tasks explain golden:hello_world backend=eager` names what changed" in edited
    assert "golden changed: golden_hello_world (body)" in proj.cli("explain", "golden:hello_world", EAGER).stdout
