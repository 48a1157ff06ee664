"""Size profiles: `profile=NAME` (or $GOLDEN_TASKS_PROFILE) picks the shapes a kernel module plans.

Nothing here compiles: planning imports the modules, the abi stage only reads the plan.
"""
import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest
from project import Project, recipe

from golden_tasks.frontends import cli
from golden_tasks.model.records import MANIFEST_FORMAT, Manifest, SavedArtifact
from golden_tasks.pipeline import graph, replay, runtime
from golden_tasks.planning import discover
from golden_tasks.project import config
from golden_tasks.project.toolchain import toolchain
from golden_tasks.storage.store import Store

PROFILED = '''
import torch
import golden_tasks
from golden_tasks import Case, In, Out, TensorSpec, jit

N = {"default": 4, "flash": 4096}[golden_tasks.profile()]

@jit
def p(x: In, out: Out):
    out.copy_(x)

def golden_p(t):
    t["out"].copy_(t["x"])

CASES = [Case("p", specs=lambda: [TensorSpec("x", (N,), torch.float32), TensorSpec("out", (N,), torch.float32)])]
'''
PLAIN = PROFILED.replace('{"default": 4, "flash": 4096}[golden_tasks.profile()]', "2").replace(
    'Case("p"', 'Case("q"').replace("def p(", "def q(").replace("golden_p", "golden_q")


def write_kernels(kernels):
    kernels.mkdir(exist_ok=True)
    (kernels / "__init__.py").write_text("")
    (kernels / "p.py").write_text(textwrap.dedent(PROFILED))
    (kernels / "q.py").write_text(textwrap.dedent(PLAIN))


@pytest.fixture
def root(tmp_path):
    write_kernels(tmp_path / "kernels")
    return tmp_path


def plans(root, variables=()):
    """The planned library as `golden-tasks explain/gc ... VARIABLES` sees it."""
    return cli._plans(root, Store(root / "cache"), variables)


def shape(plan):
    return list(plan.signature[0].shape)


def test_profile_changes_the_shapes_and_both_plan_sets_are_kept(root, monkeypatch):
    calls = []
    real = discover.plan_in_subprocess
    monkeypatch.setattr(discover, "plan_in_subprocess", lambda *a: calls.append(a) or real(*a))
    default = plans(root)
    assert shape(default["p"]) == [4] and default["p"].profile == "default"
    flash = plans(root, ["profile=flash"])
    assert shape(flash["p"]) == [4096] and flash["p"].profile == "flash"
    assert flash["q"].signature == default["q"].signature  # a module without profiles ignores it
    assert len(calls) == 2
    monkeypatch.setenv(config.PROFILE_ENV, "default")
    assert plans(root) == default and plans(root, ["profile=flash"]) == flash
    assert len(calls) == 2  # switching back and forth re-planned nothing
    (checkout,) = (root / "cache" / "plans").iterdir()
    assert sorted(p.relative_to(checkout).as_posix() for p in checkout.glob("*/*.json")) == [
        "default/kernels.p.json", "default/kernels.q.json", "flash/kernels.p.json", "flash/kernels.q.json"]


def test_an_unknown_profile_is_a_plan_error_of_the_module_that_rejects_it(root):
    result = plans(root, ["profile=nope"])
    assert result["p"].error.startswith("kernels/p.py failed to import: KeyError: 'nope'")
    assert result["q"].error is None


def test_profile_enters_no_stage_key_directly(root, monkeypatch):
    store = Store(root / "cache")
    q = plans(root)["q"]
    assert graph.Lookups(plans(root, ["profile=flash"])["q"], store).keys() == graph.Lookups(q, store).keys()


def test_runtime_dir_is_current_only_under_its_profile(root, tmp_path):
    store = Store(root / "cache")
    plan = plans(root)["q"]
    case_dir = tmp_path / "runs" / "q"
    case_dir.mkdir(parents=True)
    manifest = {"format": MANIFEST_FORMAT, "case": "q", "keys": graph.Lookups(plan, store).keys(),
                "profile": "default", "fingerprints": {}, "toolchain": {}, "pipeline": "p", "table": [], "bench": {},
                "tensors": {}, "files": {}, "mtimes": {},
                "artifact": {"backend": "eager", "module": "golden_tasks.forms.jit", "table": [], "files": {}}}
    (case_dir / runtime.MANIFEST).write_text(json.dumps(manifest))
    assert runtime.is_current(graph.Lookups(plan, store), case_dir)
    assert not runtime.is_current(graph.Lookups(dataclasses.replace(plan, profile="flash"), store), case_dir)


def test_replay_checks_staleness_under_the_recorded_profile(root, monkeypatch):
    plan = plans(root, ["profile=flash"])["p"]
    manifest = Manifest(format=MANIFEST_FORMAT, case="p", module="kernels.p", profile="flash", toolchain=toolchain(),
                        fingerprints={f: plan.field_json(f) for f in runtime.FINGERPRINTS}, keys={}, pipeline="p",
                        table=[], bench={}, tensors={}, files={},
                        artifact=SavedArtifact(backend="eager", module="golden_tasks.forms.jit", table=[], files={}))
    monkeypatch.setenv(config.PROFILE_ENV, "default")  # the replaying process's own profile is not used
    assert replay.staleness(root, manifest, root) == []
    stale = replay.staleness(root, dataclasses.replace(manifest, profile="default"), root)
    assert any(s.startswith("signature changed") for s in stale), stale


@pytest.mark.e2e
def test_the_doit_variable_reaches_planning_and_stages(tmp_path):
    proj = Project(tmp_path / "project", modules=())
    write_kernels(proj.path / "kernels")
    code, results, _, err = proj.doit("abi:p", "profile=flash", env={config.PROFILE_ENV: "nope"})
    assert code == 0 and results["abi:p"] == "success", err
    (entry,) = proj.entries("abi")
    assert recipe(proj.cache, entry)["plan"]["signature"][0]["shape"] == [4096]  # the variable beat the environment
    code, results, report, _ = proj.doit("--continue", "plan", "profile=nope")
    assert code != 0 and results["plan:p"] == "fail" and results["plan:q"] != "fail"
    (failure,) = [t for t in report["tasks"] if t["name"] == "plan:p"]
    assert "kernels/p.py failed to import: KeyError: 'nope'" in failure["error"]


def test_reading_the_profile_imports_no_torch():
    code = "import sys, golden_tasks; golden_tasks.profile(); assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.e2e
def test_an_unknown_profile_is_named_with_the_known_ones_not_answered_with_no_task(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "sized.py").write_text(textwrap.dedent(PROFILED).replace(
        'N = {"default": 4, "flash": 4096}[golden_tasks.profile()]',
        'PROFILES = {"default": 4, "flash": 4096}\nN = PROFILES[golden_tasks.profile(PROFILES)]'))
    proc = proj.console("verify:p", "profile=flsh")
    assert proc.returncode == 3 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("golden-tasks: no task 'verify:p'; ")
    assert ("kernels.sized could not be planned, so its cases are not known: kernels/sized.py failed to import: ValueError: "
            "unknown profile 'flsh' (profile=NAME or $GOLDEN_TASKS_PROFILE); this module's profiles: default, flash "
            "(at kernels/sized.py:7)") in proc.stderr, proc.stderr
