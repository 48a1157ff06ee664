"""Configuration read from the environment and the doit command line; the summary table."""
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from golden_tasks.frontends.doit_session import CommandLine
from golden_tasks.model.records import CaseRow, RunRecord
from golden_tasks.model.verdicts import Verdict
from golden_tasks.project import config
from golden_tasks.project.toolchain import machine, toolchain
from golden_tasks.reports import report


@pytest.mark.parametrize("argv,workers", [
    (["-n", "2", "verify"], 2), (["-n4"], 4), (["--process=3", "verify"], 3), (["verify"], 1),
    (["verify:x", "backend=eager"], 1), (["-n", "0", "verify"], 1), (["run", "-n", "2"], 2),
])
def test_worker_count_from_the_doit_command_line(argv, workers):
    assert CommandLine.parse(argv).workers == workers


def test_threads_share_the_cores(monkeypatch):
    monkeypatch.delenv(config.THREADS_ENV, raising=False)
    monkeypatch.setenv(config.WORKERS_ENV, str(os.cpu_count() * 2))
    assert config.current().threads_per_worker() == 1
    monkeypatch.setenv(config.WORKERS_ENV, "1")
    assert config.current().threads_per_worker() == os.cpu_count()
    monkeypatch.setenv(config.THREADS_ENV, "3")
    assert config.current().threads_per_worker() == 3


def test_locations_follow_the_environment(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "c"))
    monkeypatch.setenv(config.RUNS_ENV, str(tmp_path / "r"))
    assert (config.Project.at().cache, config.Project.at().runs) == (tmp_path / "c", tmp_path / "r")
    monkeypatch.delenv(config.CACHE_ENV)
    monkeypatch.delenv(config.RUNS_ENV)
    assert (config.Project.at(tmp_path).cache, config.Project.at().runs) == (tmp_path / "cache", tmp_path / "runs")


def test_a_project_is_built_once_and_what_is_given_wins(monkeypatch, tmp_path):
    for name in (config.CACHE_ENV, config.RUNS_ENV, config.READONLY_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(config.OVERLAY_ENV, "")  # recorded, so the overlay the read-only store sets is undone after
    (tmp_path / "pyproject.toml").write_text('[tool.golden-tasks]\ncache = "store"\nruns = "out"\n')
    project = config.Project.at(tmp_path)
    assert config.Project.at(str(tmp_path / ".")) is project and project.store is project.store
    assert (project.cache, project.runs, project.store.root) == (tmp_path / "store", tmp_path / "out", tmp_path / "store")
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "env"))
    assert config.Project.at(tmp_path).cache == tmp_path / "env"  # the environment over the table
    given = config.Project.at(tmp_path, cache=tmp_path / "mine", runs=tmp_path / "reports")
    assert (given.cache, given.runs) == (tmp_path / "mine", tmp_path / "reports")
    monkeypatch.setenv(config.READONLY_ENV, "1")
    assert config.Project.at(tmp_path).store.readonly and not project.store.readonly


def test_a_read_only_store_uses_an_overlay_only_for_the_cache_it_was_made_for(monkeypatch, tmp_path):
    """GOLDEN_TASKS_OVERLAY inherited from a run over another cache would serve that run's objects before this
    cache's own (hiding their damage): a new overlay is made. One made for this cache is shared. Overlays
    hold computed answers: they are withheld from kernels like the cache."""
    monkeypatch.setenv(config.READONLY_ENV, "1")
    monkeypatch.setenv(config.OVERLAY_ENV, "")  # recorded: what the stores set is undone after
    for name in "abc":
        (tmp_path / name).mkdir()
    first = config.Project.at(tmp_path / "a", cache=tmp_path / "cache-a").store.overlay.root
    second = config.Project.at(tmp_path / "b", cache=tmp_path / "cache-b").store.overlay.root
    assert first != second and os.environ[config.OVERLAY_ENV] == str(second)
    assert config.Project.at(tmp_path / "c", cache=tmp_path / "cache-b").store.overlay.root == second
    assert {first, second} <= config.Project.answer_folders()


def test_profile_follows_the_environment_and_the_doit_variable(monkeypatch):
    import golden_tasks

    monkeypatch.delenv(config.PROFILE_ENV)
    assert config.profile() == golden_tasks.profile() == "default"
    monkeypatch.setenv(config.PROFILE_ENV, "flash")
    assert golden_tasks.profile() == "flash"
    config.enter(config.current().given(lambda name, default: default))  # no profile= variable: the environment stands
    assert config.profile() == "flash"
    config.enter(config.current().given({"profile": "small"}.get, "layout"))  # profile= overrides the environment
    assert config.profile() == "small"
    monkeypatch.delenv(config.PROFILE_ENV)  # the project's profile where neither names one
    assert config.current().given(lambda name, default: default, "layout").profile == "layout"
    for bad in ("../x", "a/b", ".hidden"):
        monkeypatch.setenv(config.PROFILE_ENV, bad)
        with pytest.raises(ValueError, match="is not a name"):
            config.profile()


def test_the_run_context_is_entered_once_and_read_back_whole(monkeypatch):
    """What a run starts with reaches the processes it starts as the one value it entered; a bad variable is
    named, from the environment or a run's NAME=VALUE."""
    context = config.RunContext(profile="flash", ranks=4, sandbox="off", executor="ray", ray_address="auto",
                                workers=3, threads=2, journal="/run/journal.jsonl")
    config.enter(context)
    assert config.current() == context and config.planning_context() == "flash.ranks4"
    assert config.current().given({"ranks": "2"}.get) == replace(context, ranks=2)
    config.enter(config.RunContext())  # the defaults: nothing left of the journal, the threads, the world size
    assert config.current() == config.RunContext() and config.current().threads_per_worker() == os.cpu_count()
    for name, env, text, message in [("ranks", config.RANKS_ENV, "0", "ranks='0' is not a world size"),
                                     ("sandbox", config.SANDBOX_ENV, "x", "sandbox='x' is not one of auto"),
                                     ("workers", config.WORKERS_ENV, "many", "workers='many' is not a count")]:
        monkeypatch.setenv(env, text)
        with pytest.raises(ValueError, match=message):
            config.current()
        monkeypatch.delenv(env)
        if name in config.RunContext.VARIABLES:
            with pytest.raises(ValueError, match=f"doit variable {message}"):
                config.current().given({name: text}.get)


def test_only_the_run_context_touches_its_variables():
    """No module but project/config.py reads or writes a variable of the run's context: they ask
    config.current(), and a run enters its context in one place (config.enter)."""
    names = [n for n in dir(config) if n.endswith("_ENV") and getattr(config, n) in config.RunContext().environment()]
    assert len(names) == len(config.RunContext().environment())
    package = Path(config.__file__).parents[1]
    found = [f"{path.relative_to(package)}:{i}" for path in sorted(package.rglob("*.py")) if path.name != "config.py"
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if "environ" in line and any(name in line for name in names)]
    assert found == []


def test_toolchain_names_every_component():
    tc = toolchain()
    assert set(tc) == {"python", "torch", "cxx", "nvcc", "isa", "gpus", "sandbox"}
    assert tc["torch"].startswith("2.13.0")
    assert tc["gpus"].split()[0].isdigit()


def test_the_toolchain_follows_the_compiler_the_environment_names_now(monkeypatch):
    """A process that changed $CXX keys with the new compiler, and with the old one once it is back."""
    monkeypatch.setenv("CXX", "c++")
    before = toolchain()["cxx"]
    monkeypatch.setenv("CXX", "no-such-compiler-gt")
    assert toolchain()["cxx"] == "no-such-compiler-gt: unavailable"
    monkeypatch.setenv("CXX", "c++")
    assert toolchain()["cxx"] == before
    monkeypatch.setenv("CXX", "env c++")  # a command line, as @cpp runs it (ccache g++, say)
    assert toolchain()["cxx"] == before


def test_the_timing_machine_follows_the_visibility_mask_the_environment_names_now(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert machine()["visible"] == "0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine()["visible"] == "1" and "visible=1 models=" in toolchain()["gpus"]


def test_summary_table_layout():
    stages = {"abi": "cached", "compile": "ran", "inputs": "cached", "golden": "cached", "dispatch": "ran",
              "validate": "FAILED", "inputs2": "cached", "golden2": "cached", "bench": "-", "golden_bench": "ran"}
    row = CaseRow.from_json({"case": "c", "status": "FAIL", "stages": stages, "kernel_us": 10.0, "golden_us": 25.0,
                             "speedup": 2.5, "baseline": "torch", "reason": "validate: 3 of 4 mismatched"})
    skipped = replace(row, case="g", status=Verdict.SKIPPED, skipped="no GPU", reason=None)
    ranked = replace(row, case="r", status=Verdict.PASS, reason=None, rank_us=[9.5, 10.0],
                     imbalance="rank 1 was the slowest", speedup_err=0.125, warnings=["output 'o': vacuous"])
    logged = replace(row, case="l", log="/elsewhere/l.log")
    header, rule, line, skipped_line, ranked_line, logged_line, reason, warned, per_rank, failed, failed_logged = \
        report.format_table([row, skipped, ranked, logged]).splitlines()
    assert reason == "g: SKIPPED: no GPU"
    assert warned == "r: WARNING: output 'o': vacuous" and ranked_line.endswith("2.50x ±0.12 over torch")
    assert failed == "c: FAIL at validate: 3 of 4 mismatched"
    assert failed_logged == "l: FAIL at validate: 3 of 4 mismatched  (all messages: /elsewhere/l.log)"
    assert per_rank == "r: per rank, median us: 0: 9.5, 1: 10.0; LOAD IMBALANCE: rank 1 was the slowest"
    assert header.split() == ["case", "status", "abi", "compile", "inputs", "golden", "dispatch", "policy", "validate",
                              "inputs2", "golden2", "bench", "golden_bench", "max", "err", "kernel", "median", "us",
                              "GB/s", "TFLOP/s", "SOL", "speedup"]
    assert set(rule.replace(" ", "")) == {"-"}
    # a record written before the policy stage existed: its column says the stage did not run
    assert line.split() == ["c", "FAIL", "cached", "ran", "cached", "cached", "ran", "-", "FAILED", "cached", "cached",
                            "-", "ran", "-", "10.0", "-", "-", "-", "2.50x", "over", "torch"]


def rows_of(*statuses: str) -> list:
    return [CaseRow(case=f"c{i}", status=Verdict(s)) for i, s in enumerate(statuses)]


def test_a_skipped_case_is_not_a_failure_and_the_last_line_counts_every_status():
    rows = rows_of("PASS", "SKIPPED", "PASS")
    assert RunRecord(cases=rows).passed and RunRecord(cases=rows).counts == {"SKIPPED": 1, "PASS": 2}
    assert report.outcome_line(rows) == "3 cases: 1 SKIPPED, 2 PASS"
    failed = rows + rows_of("INCOMPLETE", "FAIL")
    assert not RunRecord(cases=failed).passed
    assert report.outcome_line(failed) == "5 cases: 1 FAIL, 1 INCOMPLETE, 1 SKIPPED, 2 PASS"
    assert report.outcome_line(rows_of("SKIPPED", "SKIPPED")) == \
        "all 2 selected cases SKIPPED: nothing was verified on this machine (the reasons are above)"


def test_torchs_cuda_home_notice_is_not_shown_in_the_processes_that_load_it():
    """A CUDA build of torch on a machine without a GPU logs "No CUDA runtime is found" as cpp_extension loads;
    the forkserver (which loads it) and the planning process quiet that logger first. Here its message is
    logged as torch would, after the quieting, and nothing shows; an error of it still would."""
    code = ("import logging, sys; from golden_tasks.project import config; config.quiet_third_party_logs(); "
            "log = logging.getLogger('torch.utils.cpp_extension'); "
            "log.warning(\"No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'\"); log.error('a real error')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr == "a real error\n"


def test_the_exit_status_follows_doits_meanings_whatever_doit_returned():
    """doit returns 2 for a dependency cascade under --continue (UnmetDependency is one of its errors): a run
    whose only failures are cases' verdicts and the tasks they kept from running exits 1; an error of
    another kind (an up-to-date check that raised, say) exits 2; skips are not failures."""
    import io

    from doit.exceptions import TaskError, TaskFailed, UnmetDependency

    from golden_tasks.frontends.doit_reporter import SummaryReporter

    reporter = SummaryReporter(io.StringIO(), {})
    skipped_and_passed = RunRecord(cases=rows_of("PASS", "SKIPPED"))
    assert reporter.exit_status(skipped_and_passed) == 0
    reporter.failures = [{"task": None, "exception": TaskFailed("validation FAILED")},
                         {"task": None, "exception": UnmetDependency("bench:c")}]
    assert reporter.exit_status(RunRecord(cases=rows_of("FAIL", "PASS", "SKIPPED"))) == 1
    reporter.failures.append({"task": None, "exception": TaskError("checking dependencies raised")})
    assert reporter.exit_status(RunRecord(cases=rows_of("FAIL"))) == 2
    reporter.failures, reporter.runtime_errors = [], ["a cyclic dependency"]
    assert reporter.exit_status(skipped_and_passed) == 2


def test_the_gpus_models_enter_every_key(monkeypatch):
    """An artifact built for one GPU architecture is never found by another machine's key: the toolchain names
    the models (the driver's /proc files), not only how many GPUs there are."""
    import golden_tasks.project.toolchain as tc

    monkeypatch.setattr(tc, "_gpu_models", lambda: ["NVIDIA H100 80GB HBM3"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "h100-test")  # a mask no other test uses: computed afresh
    h100 = toolchain()["gpus"]
    monkeypatch.setattr(tc, "_gpu_models", lambda: ["NVIDIA A100-SXM4-80GB"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "a100-test")
    assert h100.endswith("models=NVIDIA H100 80GB HBM3") and toolchain()["gpus"].endswith("models=NVIDIA A100-SXM4-80GB")
