"""The DeepSeek-V4 attention family end to end: real `doit` in a temporary copy, compiled eagerly (AOTInductor's
builds of the family are the README's cold run's, which verifies every library case), the flagship cases across
ten seeds, and the flash profile's planning."""
import json

import pytest
from project import ROOT, Project, recipe_differences, stage_results

import golden_tasks

pytestmark = pytest.mark.e2e
MODULES = ("decode_attention", "sparse_attention", "compressor", "indexer")
CASES = {"decode_swa", "decode_hca", "decode_csa", "decode_hca_tp", "sparse_attn", "sparse_attn_prefill",
         "compressor_ratio4", "compressor_ratio128", "indexer"}
# decode_hca across its load (a sweep): its point at the flagship's shape has the flagship's keys
POINTS = {f"decode_hca_shapes.batch-{b}.context-{c}" for b in (2, 8) for c in (300, 2400)}
FLAGSHIP_POINT = "decode_hca_shapes.batch-2.context-300"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("dsv4"), MODULES)
    (proj.path / "pyproject.toml").write_text('[tool.golden-tasks]\nbackend = "eager"\n')
    proj.cold = proj.doit("-n", "2", "verify")
    return proj


SHARED_VALIDATION = {"decode_hca", "decode_hca_tp", FLAGSHIP_POINT}


def test_every_case_verifies(project):
    code, results, _, err = project.cold
    assert code == 0, err
    assert {n.split(":", 1)[1] for n in results if n.startswith("verify:")} == CASES | POINTS | {"decode_hca_shapes"}
    for case in (CASES | POINTS) - {"decode_hca", FLAGSHIP_POINT}:
        assert results[f"compile:{case}"] == "success", case
    # whichever of the two runs first compiles; the other finds its entry (up to date, or found by its task once
    # the first's lock is free)
    twins = [results[f"compile:{c}"] for c in ("decode_hca", FLAGSHIP_POINT)]
    assert "success" in twins and set(twins) <= {"success", "up-to-date"}, twins
    for case in (CASES | POINTS) - SHARED_VALIDATION:
        assert results[f"validate:{case}"] == "success", case
    # decode_hca_tp gathers exactly decode_hca's outputs and shares its golden and policy, as the flagship's point
    # does: the same validate key, so whichever validates after the first may find its entry (early cutoff)
    assert {results[f"validate:{c}"] for c in SHARED_VALIDATION} == {"success", "up-to-date"}


def test_flagship_rerun_is_all_cached(project):
    code, results, _, _ = project.doit("verify:decode_hca", "verify:decode_swa", "verify:decode_csa")
    assert code == 0 and set(stage_results(results).values()) == {"up-to-date"}


def test_validation_report_names_the_comparators_figures(project):
    report = json.loads((project.path / "runs" / "decode_hca" / "report.json").read_text())
    outputs = {o["name"]: o for o in report["validation"]["outputs"]}
    assert set(outputs) == {"ori_kv", "compress_state", "cmp_kv", "o_packed"}
    o = outputs["o_packed"]
    assert o["passed"] and o["stats"]["error_ratio"] <= 0.005
    # the tail rows t >= T are NaN in the golden: they are not compared
    assert o["stats"]["considered"] == 2 * 8 * 4 * 64


@pytest.mark.parametrize("name", ["decode_swa", "decode_hca", "decode_csa"])
def test_flagship_passes_across_ten_seeds(project, tmp_path, monkeypatch, name):
    """Each seed draws other positions, block tables and data; the compiled kernel is reused."""
    monkeypatch.syspath_prepend(str(ROOT))
    from kernels import decode_attention

    for seed in range(10):
        case = decode_attention.case(name, seed)
        result = golden_tasks.run(case.kernel, case.specs, case.golden, name=name, compare=case.compare,
                                  seed=seed, warmup=0, rounds=1, cache_dir=project.cache, runs_dir=tmp_path,
                                  backend="eager")
        assert result.passed, f"{name} seed {seed}: {result.error}"
        assert result.stages["compile"] == "cached", recipe_differences(project.cache, "compile", name)


def test_flash_profile_plans_production_shapes(project):
    code, _, _, err = project.doit("plan:decode_hca", "profile=flash")
    assert code == 0, err
    [manifest] = project.cache.glob("plans/*/flash/kernels.decode_attention.json")
    plans = {p["case"]: p for p in json.loads(manifest.read_text())["cases"]}
    shapes = {s["name"]: s["shape"] for s in plans["decode_hca"]["signature"]}
    assert shapes["q"] == [512, 64, 512] and shapes["o_packed"] == [8, 512, 8 * 512]
    assert shapes["compress_state"][1:] == [8, 1024] and shapes["ape"] == [128, 512]
    assert {s["name"]: s["shape"] for s in plans["decode_csa"]["signature"]}["position_ids"] == [512, 1]
    # the small profile's plans are still there: switching back re-plans nothing
    assert len(list(project.cache.glob("plans/*/default/kernels.decode_attention.json"))) == 1
