"""Never a wrong PASS, with real doit: one computation per key under -n 2, damage found and
recomputed within the run, stale plans cured by running again, and cases that cannot be
fingerprinted or planned."""
import json
import os

import pytest
from project import Project, stage_results
from test_cache_faults import flip_byte, fsck, object_of

pytestmark = pytest.mark.e2e
# One kernel at several seeds: every case shares one compile key. The body notes each process that
# traces it (compiling runs it), so the test can tell how many processes compiled.
SEEDS = '''
import os
import torch
from golden_tasks import Case, In, Out, TensorSpec, jit

@jit
def seeded(x: In, out: Out):
    with open(os.environ["GT_TRACE_LOG"], "a") as log:
        log.write(f"{os.getpid()}\\n")
    out.copy_(x * 2 + 1)

def golden_seeded(t):
    t["out"].copy_(t["x"] * 2 + 1)

def specs():
    return [TensorSpec("x", (16, 32), torch.float32, torch.randn), TensorSpec("out", (16, 32), torch.float32)]

CASES = [Case(f"seeded_{seed}", specs=specs, seed=seed, rounds=2) for seed in range(4)]
'''


def test_cases_sharing_a_compile_key_compile_it_once_and_all_pass(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "seeded.py").write_text(SEEDS)
    log = tmp_path / "traces.log"
    # sandbox=off: a confined kernel could not write the test's log
    proc = proj.console("-n", "2", "verify", env={"GT_TRACE_LOG": str(log), "GOLDEN_TASKS_SANDBOX": "off"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((proj.path / "runs" / "report.json").read_text())["cases"]
    assert sorted((r["case"], r["status"]) for r in rows) == [(f"seeded_{s}", "PASS") for s in range(4)]
    assert len(set(log.read_text().split())) == 1, "more than one process compiled the shared key"
    assert len(proj.entries("compile")) == 1


@pytest.fixture(scope="module")
def verified(tmp_path_factory):
    """hello_world verified with the default backend (AOTInductor packages are not byte-identical
    when rebuilt: a recompiled artifact changes every key downstream)."""
    proj = Project(tmp_path_factory.mktemp("damage"), ("hello_world",))
    code, _, _, err = proj.doit("-n", "2", "verify")
    assert code == 0, err
    return proj


@pytest.mark.parametrize("stage, kind", [("compile", "file"), ("inputs", "tensor"), ("policy", "file")])
def test_damage_is_recomputed_and_the_case_passes_in_the_same_run(verified, stage, kind):
    flip_byte(object_of(verified, stage, "hello_world", kind))
    proc = verified.console("-n", "2", "--continue", "verify")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"cache entry {stage}:hello_world" in proc.stderr and "dropping it and recomputing" in proc.stderr
    assert "hello_world  PASS" in proc.stdout
    assert json.loads((verified.path / "runs" / "report.json").read_text())["passed"]
    fsck(verified)


def manifest_of(project, module):
    (path,) = project.cache.glob(f"plans/*/default/kernels.{module}.json")
    return path


def test_a_plan_that_no_longer_matches_its_source_is_cured_by_running_again(tmp_path):
    """Whatever made a plan stale (something planning could not see), the worker that notices
    forgets it, and the next run plans again instead of refusing forever."""
    proj = Project(tmp_path / "p", ("hello_world",))
    assert proj.doit("verify", "backend=eager")[0] == 0
    path = manifest_of(proj, "hello_world")
    manifest = json.loads(path.read_text())
    manifest["cases"][0]["golden"] = "0" * 32  # what a missed dependency looks like to a worker
    path.write_text(json.dumps(manifest))
    code, results, report, _ = proj.doit("verify", "backend=eager")
    # each stage reading the golden's fingerprint (golden, golden2) notices; the tasks below them never start
    errors = {t["name"]: t["error"] for t in report["tasks"] if t.get("error") and t["started"]}
    assert code != 0 and set(errors) & {"golden:hello_world", "golden2:hello_world"}, results
    for error in errors.values():
        assert "changed since the task graph was planned (golden)" in error and "run doit again" in error
    code, results, _, err = proj.doit("verify", "backend=eager")
    assert code == 0, err
    assert set(stage_results(results).values()) == {"up-to-date"}


SENTINEL_MODULE = '''
import torch
from golden_tasks import Case, In, Out, TensorSpec, jit

import threading

GUARD = threading.Lock()  # its state is not visible to Python: it cannot be fingerprinted

@jit
def sentinel(x: In, out: Out):
    out.copy_(x * 2.0)

def golden_sentinel(t):
    with GUARD:
        t["out"].copy_(t["x"] * 2.0)

CASES = [Case("sentinel", specs=lambda: [TensorSpec("x", (8,), torch.float32, torch.randn),
                                         TensorSpec("out", (8,), torch.float32)], rounds=2)]
'''


def test_objects_that_cannot_be_fingerprinted_pass_on_every_run(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "sentinel.py").write_text(SENTINEL_MODULE)
    for _ in range(2):
        code, results, _, err = proj.doit("verify", "backend=eager")
        assert code == 0, err
        assert results["golden:sentinel"] == "success"  # recomputed, never trusted from the cache
    explained = proj.cli("explain", "golden:sentinel", "backend=eager").stdout
    assert "recomputes on every run: it depends on what cannot be fingerprinted" in explained
    assert "_thread.lock" in explained


def test_a_stage_of_a_case_that_cannot_be_planned_shows_the_plan_error(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "broken.py").write_text("raise ValueError('boom')\n")
    proc = proj.console("abi:broken")
    assert proc.returncode != 0
    assert "kernels/broken.py failed to import: ValueError: boom" in proc.stdout + proc.stderr
    assert "Invalid parameter" not in proc.stdout + proc.stderr
    os.remove(proj.path / "kernels" / "broken.py")


SCALED = '''
import torch
from golden_tasks import Case, In, Out, Scalar, ScalarSpec, TensorSpec, jit

@jit
def scaled(x: In, alpha: Scalar, out: Out):
    out.copy_(x * alpha)

def golden_scaled(t):
    t["out"].copy_(t["x"] * t["alpha"])

CASES = [Case("scaled", specs=lambda: [TensorSpec("x", (8,), torch.float32, torch.randn),
                                       ScalarSpec("alpha", torch.float32, 2.0),
                                       TensorSpec("out", (8,), torch.float32)], rounds=2)]
'''


def test_a_scalar_compiled_into_the_artifact_recompiles_when_its_value_changes(tmp_path):
    """AOTInductor bakes scalar values in: a stale artifact would compute with the old value."""
    proj = Project(tmp_path / "p", ())
    module = proj.path / "kernels" / "scaled.py"
    module.write_text(SCALED)
    assert proj.doit("verify")[0] == 0
    module.write_text(SCALED.replace("2.0)", "3.0)"))
    code, results, _, err = proj.doit("verify")
    assert code == 0, err
    assert results["compile:scaled"] == "success"
