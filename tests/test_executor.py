"""The executor choice and the cluster executor's parts that need no cluster (tests/test_cluster.py runs one)."""
import json
import sys

import pytest
from project import Project

from golden_tasks.model.errors import StageFailed
from golden_tasks.pipeline import cluster
from golden_tasks.pipeline.execution import produce_here
from golden_tasks.project import config, toolchain


def test_the_executor_is_local_unless_ray_is_asked_for(monkeypatch, tmp_path):
    monkeypatch.delenv(config.EXECUTOR_ENV, raising=False)
    assert config.current().executor == "local" and cluster.producer(tmp_path) is produce_here
    monkeypatch.setenv(config.EXECUTOR_ENV, "ray")
    assert isinstance(cluster.producer(tmp_path).__self__, cluster.RayCluster)
    assert "ray" not in sys.modules or cluster.cluster(tmp_path.resolve()).address is None  # made, not connected
    with pytest.raises(ValueError, match="doit variable executor='dask' is not one of local, ray"):
        config.current().given({"executor": "dask"}.get)


def test_on_a_cluster_a_timing_names_the_machine_by_its_class_not_its_host(monkeypatch):
    monkeypatch.delenv(config.EXECUTOR_ENV, raising=False)
    here = toolchain.machine()
    monkeypatch.setenv(config.EXECUTOR_ENV, "ray")
    assert toolchain.machine() == {k: v for k, v in here.items() if k != "host"}
    assert toolchain.node_class().startswith("golden_tasks_node_")


def test_a_node_joins_as_its_class_beside_the_resources_it_is_given():
    command = cluster.start_node(["--address", "head:6379", "--resources", '{"H100": 2}', "--num-cpus", "4"])
    assert command[1:4] == ["-m", "ray.scripts.scripts", "start"]
    assert command[4:8] == ["--address", "head:6379", "--num-cpus", "4"] and command[8] == "--resources"
    assert json.loads(command[9]) == {"H100": 2, toolchain.node_class(): cluster.NODE_CLASS_UNITS}
    assert json.loads(cluster.start_node(["--head", "--resources={}"])[-1]) == {toolchain.node_class(): 1000}
    with pytest.raises(ValueError, match="is not a JSON object"):
        cluster.start_node(["--resources", "H100=2"])


def test_the_sources_that_reach_the_nodes_are_the_kernel_folders_by_digest(tmp_path, monkeypatch):
    (tmp_path / "kernels" / "sub").mkdir(parents=True)
    (tmp_path / "kernels" / "a.py").write_text("A = 1\n")
    (tmp_path / "kernels" / "sub" / "data.txt").write_text("x")
    found = cluster.sources(config.Project.at(tmp_path))
    assert sorted(found) == ["kernels/a.py", "kernels/sub/data.txt"]
    assert cluster._checkout(str(tmp_path), found) == tmp_path
    monkeypatch.chdir(tmp_path)  # the job's working_dir
    with pytest.raises(StageFailed, match=r"without kernels/a.py as the driver has it \(different content in the "):
        cluster._checkout(str(tmp_path), {**found, "kernels/a.py": "0" * 32})  # as if edited on the way
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "pyproject.toml").write_text('[tool.golden-tasks]\nkernels = ["../kernels"]\n')
    with pytest.raises(StageFailed, match="outside the checkout"):
        cluster.sources(config.Project.at(tmp_path / "elsewhere"))


@pytest.mark.e2e
def test_doit_submits_from_one_process(tmp_path):
    """With executor=ray doit's workers are threads of the one Ray driver: -P process is refused, plainly."""
    proj = Project(tmp_path / "p", modules=("hello_world",))
    run = proj.console("-n", "2", "-P", "process", "verify", "executor=ray")
    assert run.returncode == 3 and "executor=ray submits from one process" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.e2e
def test_a_cluster_that_does_not_answer_fails_the_run_at_once_naming_its_address(tmp_path):
    """ray.init waits minutes for an address where nothing listens; the run says so in seconds, and every
    stage after the first fails with the same line without trying again."""
    import socket

    with socket.socket() as closed:  # a port that was free a moment ago: nothing listens there
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proj = Project(tmp_path / "p", modules=("hello_world",))
    code, _, report, _ = proj.doit("--continue", "verify:hello_world", "executor=ray",
                                   env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    errors = record["cases"][0]["errors"]
    assert code != 0 and record["cases"][0]["status"] == "FAIL" and errors
    assert all(f"cannot reach the Ray cluster at 127.0.0.1:{port}" in e for e in errors.values()), errors


@pytest.mark.e2e
def test_the_json_reporter_of_a_ray_run_that_fails_a_case_is_whole(tmp_path):
    """What a CI job on a cluster reads: doit's JSON on stdout and nothing else, whatever the outcome, the
    failing case beside a passing one (a failure stops nothing), the record, and runs/report.html drawn
    again by this run, with no traceback. doit's -n workers are threads there: an action's output, which
    doit captures by swapping sys.stdout, is not captured (two threads swapping it left it swapped, and the
    JSON reporter, which restores and reads it at the end, printed nothing)."""
    proj = Project(tmp_path / "p", modules=("hello_world", "rms_norm"), html=True)
    proj.edit("hello_world", "torch.sub(x, y, alpha=-1)", "torch.sub(x, y)")
    proj.env.pop("RAY_ADDRESS", None)  # a Ray instance of the run's own
    code, results, report, err = proj.doit("-n", "2", "verify:hello_world", "verify:rms_norm", "executor=ray",
                                           "backend=eager", "rounds=3")
    assert code != 0 and results["validate:hello_world"] == "fail" and results["validate:rms_norm"] == "success"
    assert "Traceback" not in err and "Exception ignored" not in err, err
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    statuses = {c["case"]: c["status"] for c in record["cases"]}
    assert statuses.pop("hello_world") == "FAIL" and set(statuses.values()) == {"PASS"}, statuses
    page = proj.path / "runs" / "report.html"
    assert page.stat().st_mtime >= record["finished"] and "hello_world" in page.read_text()


def test_golden_tasks_node_passes_its_arguments_to_ray_start_or_says_why_it_cannot(monkeypatch, capsys):
    """Every argument after `node` is ray start's (argparse once read --head as its own, and refused it);
    without ray installed, one line says so."""
    from golden_tasks.frontends import cli

    assert cli._ray_start_arguments(["--project", "p", "node", "--head", "--port", "6379"]) == \
        (["--project", "p", "node"], ["--head", "--port", "6379"])
    assert cli._ray_start_arguments(["stats", "--runs", "3"]) == (["stats", "--runs", "3"], [])
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name: None)
    assert cli.main(["node", "--head", "--port", "6379"]) == 2
    assert capsys.readouterr().err == "golden-tasks node: ray is not installed here: pip install 'golden-tasks[ray]'\n"
