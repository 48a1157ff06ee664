"""Runtime dirs and replay, end to end with real doit and a real AOTInductor artifact."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from project import Project

pytestmark = pytest.mark.e2e
REPLAY = textwrap.dedent("""
    import json, sys
    from golden_tasks.pipeline.replay import replay
    result = replay(sys.argv[1], project=sys.argv[2])
    loaded = sorted(m for m in sys.modules if m.startswith("kernels"))
    print(json.dumps({"passed": result.passed, "error": result.error, "stale": result.stale,
                      "kernels_imported": loaded, "median": result.bench and result.bench.median}))
""")


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("replay") / "project", ("rms_norm",))
    code, _, _, err = proj.doit("verify:rms_norm")
    assert code == 0, err
    return proj


@pytest.fixture
def project(verified):
    yield verified
    verified.restore("rms_norm")


def replay(project, runtime_dir, where=None):
    proc = subprocess.run([sys.executable, "-c", REPLAY, str(runtime_dir), str(where or project.path)],
                          cwd=where or project.path, env=project.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_runtime_dir_is_complete_linked_and_readable_without_the_package(project):
    case_dir = project.path / "runs" / "rms_norm"
    manifest = json.loads((case_dir / "manifest.json").read_text())
    assert set(manifest["keys"]) == {"abi", "compile", "inputs", "golden", "dispatch", "policy", "validate", "inputs2",
                                     "golden2", "bench", "golden_bench", "calibrate"}
    assert "policy.pkl" in manifest["files"]
    assert manifest["artifact"]["backend"] == "aoti" and (case_dir / "artifact" / "kernel.pt2").exists()
    assert manifest["profile"] == "default"
    assert sorted(manifest["tensors"]) == ["data/golden/out.bin", "data/golden2/out.bin", "data/in/eps.bin",
                                           "data/in/weight.bin", "data/in/x.bin",
                                           *[f"data/in2/unseen{j}.{n}.bin" for j in range(3) for n in ("weight", "x")],
                                           "data/in2/weight.bin", "data/in2/x.bin", "data/out/out.bin"]
    x = case_dir / "data" / "in" / "x.bin"
    record = manifest["tensors"]["data/in/x.bin"]
    cached = project.cache / "objects" / record["digest"][:2] / record["digest"]
    assert os.stat(x).st_ino == os.stat(cached).st_ino  # a hard link, not a second copy
    array = np.fromfile(x, dtype=record["dtype"]).reshape(record["shape"])  # plain numpy reads it
    assert array.shape == (64, 300) and np.isfinite(array).all()
    assert np.fromfile(case_dir / "data" / "in" / "eps.bin", dtype="float32")[0] == pytest.approx(1e-6)
    code, results, _, _ = project.doit("verify:rms_norm")
    assert code == 0 and results["runtime:rms_norm"] == "up-to-date"


def test_replay_anywhere_with_the_cache_deleted_and_the_kernel_gone(project, tmp_path):
    elsewhere = tmp_path / "copied"
    shutil.copytree(project.path / "runs" / "rms_norm", elsewhere)
    checkout = tmp_path / "checkout"
    (checkout / "kernels").mkdir(parents=True)  # a checkout whose kernel module is gone
    (checkout / "kernels" / "__init__.py").write_text("")
    env_cache = project.env["GOLDEN_TASKS_CACHE"]
    project.env["GOLDEN_TASKS_CACHE"] = str(tmp_path / "no-cache")
    try:
        result = replay(project, elsewhere, checkout)
    finally:
        project.env["GOLDEN_TASKS_CACHE"] = env_cache
    assert result["passed"], result["error"]
    assert result["kernels_imported"] == [] and result["median"] > 0
    assert any("cannot be found in the current source" in s for s in result["stale"])


def test_a_replay_whose_source_cannot_be_checked_says_so(project, tmp_path):
    """Staleness is reported, never skipped in silence: a --project with no kernel folder is named."""
    nowhere = tmp_path / "no-checkout"
    nowhere.mkdir()
    result = replay(project, project.path / "runs" / "rms_norm", nowhere)
    assert result["passed"], result["error"]
    assert result["stale"] == [f"cannot check the source for staleness: {nowhere} has no kernel folder (give the "
                               "checkout that holds the case's source with --project)"]


def test_replay_reports_a_golden_edit_as_stale(project):
    project.edit("rms_norm", 't["out"].copy_(x / rms', 't["out"].copy_(1.0 * x / rms')
    result = replay(project, project.path / "runs" / "rms_norm")
    assert result["passed"]
    assert result["stale"] == ["golden changed since this data was saved (golden_rms_norm (body)): "
                               "the saved golden may no longer be the intended reference"]


def test_replay_of_a_current_dir_is_not_stale_and_runs_from_doit(project):
    assert replay(project, project.path / "runs" / "rms_norm")["stale"] == []
    proc = project.console("replay:rms_norm")
    assert proc.returncode == 0 and "PASS" in proc.stdout


def test_truncated_tensor_fails_the_replay_naming_the_file(project, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(project.path / "runs" / "rms_norm", damaged)
    x = damaged / "data" / "in" / "x.bin"
    os.chmod(x, 0o644)
    os.truncate(x, 1000)
    result = replay(project, damaged)
    assert not result["passed"]
    assert "data/in/x.bin: 1000 bytes, 76800 expected (truncated?)" in result["error"]


def test_an_artifact_for_another_machine_is_refused_before_dispatch(project, tmp_path):
    foreign = tmp_path / "foreign"
    shutil.copytree(project.path / "runs" / "rms_norm", foreign)
    manifest = json.loads((foreign / "manifest.json").read_text())
    manifest["toolchain"]["isa"] = "aarch64:0123"
    manifest["toolchain"]["torch"] = "2.99.0"
    os.chmod(foreign / "manifest.json", 0o644)
    (foreign / "manifest.json").write_text(json.dumps(manifest))
    result = replay(project, foreign)
    assert not result["passed"] and result["error"].startswith("refusing to run the artifact")
    assert "isa: built with 'aarch64:0123'" in result["error"] and "torch: built with '2.99.0'" in result["error"]


def test_run_writes_a_replayable_runtime_dir(tmp_path):
    from golden_tasks import In, Out, TensorSpec, jit, run
    from golden_tasks.pipeline.replay import replay as replay_dir

    @jit(backend="eager")
    def double(x: In, out: Out):
        out.copy_(x + x)

    specs = [TensorSpec("x", (8,), torch.float32, torch.randn), TensorSpec("out", (8,), torch.float32)]
    result = run(fn=double, specs=specs, golden=lambda t: t["out"].copy_(2 * t["x"]), rounds=3,
                 cache_dir=tmp_path / "c", runs_dir=tmp_path / "r")
    assert result.passed and (result.work_dir / "manifest.json").exists()
    again = replay_dir(result.work_dir, project=tmp_path)
    assert again.passed and again.bench.rounds == 3
