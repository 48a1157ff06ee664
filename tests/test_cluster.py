"""executor=ray: the stage graph on a real local Ray cluster of several nodes (Ray's own test utility,
ray.cluster_utils.Cluster), driven by real doit in a temporary project. One cluster serves every test of
this file (under xdist the file stays on one worker: --dist loadfile)."""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from project import ROOT, Project

from golden_tasks.project.toolchain import node_class

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="the ray extra is not installed")

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("ray")]

# the nodes that run stages: two CPUs each (a two-rank case's placement group fits one), of this machine's
# class; one also has a custom resource
NODE = {"num_cpus": 2, "resources": {node_class(): 1000}}
SPECIAL = {"num_cpus": 2, "resources": {node_class(): 1000, "special": 1}}

MODULE = '''
import os
import time
from pathlib import Path

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit

MARKS = Path({marks!r})


@jit
def twice(x: In, out: Out):
    torch.mul(x, 2.0, out=out)


@jit
def crashes(x: In, out: Out):
    import ctypes
    ctypes.string_at(0)  # a segfault, in the kernel's own process
    torch.mul(x, 2.0, out=out)


def golden(t):
    t["out"].copy_(2.0 * t["x"])


def slow_golden(t):
    """Its first call anywhere waits {wait} s, having left its pid in MARKS; every later call is quick."""
    if not any(MARKS.iterdir()):
        (MARKS / str(os.getpid())).write_text("")
        time.sleep({wait})
    golden(t)


SPECS = [TensorSpec("x", (32, 32), torch.float32, torch.randn), TensorSpec("out", (32, 32), torch.float32)]
CASES = [
    Case("twice", SPECS, kernel=twice, golden=golden, rtol=0.0, atol=0.0),
    Case("special", SPECS, kernel=twice, golden=golden, rtol=0.0, atol=0.0, resources={{"special": 1}}),
    Case("nowhere", SPECS, kernel=twice, golden=golden, resources={{"tpu_v9": 1}}),
    Case("crashes", SPECS, kernel=crashes, golden=golden),
    Case("slow", SPECS, kernel=twice, golden=slow_golden, rtol=0.0, atol=0.0, timeout=300.0),
]
'''


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A head node that runs nothing (no CPUs) and two nodes that run stages, their objects kept in a
    folder of this session's (GOLDEN_TASKS_NODE_STORE, which the nodes' workers inherit)."""
    os.environ["GOLDEN_TASKS_NODE_STORE"] = str(tmp_path_factory.mktemp("node-store"))
    cluster = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.node_args = {}  # node -> what it was started with
    for args in (NODE, SPECIAL):
        _add_node(cluster, args)
    yield cluster
    cluster.shutdown()
    os.environ.pop("GOLDEN_TASKS_NODE_STORE", None)


def _add_node(cluster, args: dict) -> None:
    cluster.node_args[cluster.add_node(**args)] = args
    cluster.wait_for_nodes()


def _project(path: Path, wait: float = 60.0) -> Project:
    # no calibration of this machine in its cache: a cluster's is of the node class (no host), and measured there
    proj = Project(path, modules=("hello_world", "collectives"), calibrated=False)
    (path / "marks").mkdir()
    (path / "kernels" / "on_cluster.py").write_text(MODULE.format(marks=str(path / "marks"), wait=wait))
    return proj


def _digests(cache: Path) -> dict:
    """(stage, key) -> the entry's digest, for the stages whose outputs are not timings. By key, not by case: an
    entry two cases share names whichever of them made it first."""
    entries = [json.loads(p.read_text()) for p in sorted(cache.glob("entries/*/*/*.json"))]
    # measurements (timings, the machine's limits) differ run to run
    return {(e["stage"], e["key"]): e["digest"] for e in entries
            if e["stage"] not in ("calibrate", "bench", "golden_bench")}


def _locally(proj: Project, *args) -> Path:
    """The store of a run of `args` here (executor=local), in the same checkout as the cluster's runs."""
    cache = proj.path / "local-cache"
    code, _, _, err = proj.doit(*args, "backend=eager", env={"GOLDEN_TASKS_CACHE": str(cache),
                                                             "GOLDEN_TASKS_RUNS": str(proj.path / "local-runs")})
    assert code == 0, err
    return cache


def _on_ray(cluster, proj: Project, *args, env=None):
    code, results, report, err = proj.doit(*args, "backend=eager", "executor=ray",
                                           env={"RAY_ADDRESS": cluster.address, **(env or {})})
    return code, results, json.loads((proj.path / "runs" / "report.json").read_text()), err


def _told(proj: Project, run) -> str:
    """What a console run printed, and the case logs it wrote (where a failure's traceback is)."""
    logs = [f"--- {log.name} ---\n{log.read_text()}" for log in sorted((proj.path / "runs").glob("*.log"))]
    return "\n".join([run.stdout, run.stderr, *logs])


def _submitted(proj: Project, *args) -> str:
    """The console summary's `ray:` line of a run of `args`."""
    out = proj.console(*args).stdout
    return next(line for line in out.splitlines() if line.startswith("ray: "))


def test_the_library_verifies_on_the_cluster_as_it_does_here(ray_cluster, tmp_path):
    """The same output digests as a local run, a two-rank case's too (its ranks in a placement group); each
    stage that ran was one Ray task; a warm re-run submits nothing and does not even connect (its RAY_ADDRESS
    leads nowhere)."""
    cases = ("verify:hello_world", "verify:twice", "verify:special", "verify:allreduce")
    proj = _project(tmp_path / "p")
    local = _locally(proj, "-n", "2", *cases)
    run = proj.console("-n", "2", *cases, "backend=eager", "executor=ray", env={"RAY_ADDRESS": ray_cluster.address})
    assert run.returncode == 0, _told(proj, run)
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    assert [c["status"] for c in record["cases"]] == ["PASS"] * 4
    # a task per entry made (a case whose stage has another's key waits for that one's entry and submits nothing)
    made = len(list(proj.cache.glob("entries/*/*/*.json")))
    assert f"ray: {made} tasks submitted to {ray_cluster.address}" in run.stdout, run.stdout
    # twice and special share the entries of the stages their resources do not key: one entry each
    assert _digests(proj.cache) == _digests(local) and len(_digests(local)) == 19 + 8
    hosts = [e["stats"]["node"]["host"] for e in proj.entries("bench")]
    assert len(hosts) == 4 and all(hosts)  # a timing names the machine it was measured on

    warm = proj.console("-n", "2", *cases, "backend=eager", "executor=ray",
                        env={"RAY_ADDRESS": "192.0.2.1:6379"})  # TEST-NET-1: nothing answers there
    assert warm.returncode == 0, _told(proj, warm)
    assert "ray: nothing to run, so no connection to a cluster" in warm.stdout
    assert all(s == "cached" for c in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]
               for s in c["stages"].values())


def test_a_resource_no_node_has_fails_its_case_with_the_resource_named(ray_cluster, tmp_path):
    proj = _project(tmp_path / "p")
    start = time.monotonic()
    code, _, record, _ = _on_ray(ray_cluster, proj, "verify:nowhere")
    assert code != 0 and time.monotonic() - start < 600
    (case,) = record["cases"]
    assert case["status"] == "FAIL" and case["stages"]["dispatch"] == "FAILED"
    assert "'tpu_v9'" in case["errors"]["dispatch"] and "which no node of the Ray cluster" in case["errors"]["dispatch"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_cuda_kernel_on_a_cluster_without_a_gpu_is_skipped_as_on_a_machine_without_one(ray_cluster, tmp_path):
    """Its dispatch and bench would ask for a GPU that no node has (and failed so); they run on a CPU node
    instead, which skips them as a machine without a GPU does: the library verifies on a CPU cluster."""
    proj = Project(tmp_path / "p", ("cpp_kernels", "rms_norm", "softmax", "gemm"))
    shutil.copytree(ROOT / "kernels" / "cpp", proj.path / "kernels" / "cpp")
    code, _, record, err = _on_ray(ray_cluster, proj, "verify:rms_norm_cuda")
    (case,) = record["cases"]
    assert code == 0 and case["status"] == "SKIPPED", (case, err)
    assert case["skipped"].startswith("a CUDA kernel and no CUDA device here")


def test_a_crashing_kernel_is_its_case_failing_not_a_lost_task(ray_cluster, tmp_path):
    proj = _project(tmp_path / "p")
    code, _, record, _ = _on_ray(ray_cluster, proj, "verify:crashes")
    (case,) = record["cases"]
    errors = " ".join(case["errors"].values())
    assert code != 0 and case["status"] == "FAIL" and "SIGSEGV" in errors and "lost on the Ray cluster" not in errors


def _raylet_of(cluster, pid: int):
    """The cluster's node whose raylet `pid` descends from (None if none: the process is gone)."""
    raylets = {n.all_processes["raylet"][0].process.pid: n for n in cluster.list_all_nodes()}
    while pid > 1:
        if pid in raylets:
            return raylets[pid]
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return None
    return None


def _marked_pid(proj: Project, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 600
    while not any((proj.path / "marks").iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "the slow golden never started"
        time.sleep(0.2)
    return int(next((proj.path / "marks").iterdir()).name)


def test_a_node_killed_mid_run_changes_nothing(ray_cluster, tmp_path):
    """The node running the golden dies mid-call: Ray runs the task again on the other node, and the run
    passes with the digests of a local run."""
    proj = _project(tmp_path / "p")
    (proj.path / "marks" / "0").write_text("")  # the local run's calls do not wait
    local = _locally(proj, "verify:slow")
    (proj.path / "marks" / "0").unlink()  # the cluster's first call does
    proc = subprocess.Popen(proj.command("verify:slow", "backend=eager", "executor=ray"), cwd=proj.path,
                            env={**proj.env, "RAY_ADDRESS": ray_cluster.address}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    node = _raylet_of(ray_cluster, _marked_pid(proj, proc))
    assert node is not None and not node.head
    ray_cluster.remove_node(node, allow_graceful=False)
    _add_node(ray_cluster, ray_cluster.node_args.pop(node))  # its replacement, for the tests after this one
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    assert record["cases"][0]["status"] == "PASS"
    assert _digests(proj.cache) == _digests(local)


def test_ctrl_c_cancels_what_was_submitted(ray_cluster, tmp_path):
    proj = _project(tmp_path / "p", wait=600)
    proc = subprocess.Popen(proj.command("verify:slow", "backend=eager", "executor=ray"), cwd=proj.path,
                            env={**proj.env, "RAY_ADDRESS": ray_cluster.address}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    golden = _marked_pid(proj, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "interrupted" in out, out
    deadline = time.monotonic() + 60
    while Path(f"/proc/{golden}").exists():
        assert time.monotonic() < deadline, "the golden still runs on the cluster after the driver's Ctrl-C"
        time.sleep(0.5)


RUN = """
import torch
import golden_tasks
from golden_tasks import In, Out, TensorSpec, jit


@jit
def negate(x: In, out: Out):
    torch.neg(x, out=out)


result = golden_tasks.run(negate, [TensorSpec("x", (16,), torch.float32, torch.randn), TensorSpec("out", (16,), torch.float32)],
                          lambda t: t["out"].copy_(-t["x"]), executor="ray", backend="eager", budget=0.05)
print(result.error)
print(result.status.value, sorted(set(s.value for s in result.stages.values())))
"""


def test_golden_tasks_run_takes_the_same_choice(ray_cluster, tmp_path):
    proj = _project(tmp_path / "p")
    (proj.path / "check.py").write_text(RUN)
    out = subprocess.run([sys.executable, "check.py"], cwd=proj.path, capture_output=True, text=True, timeout=600,
                         env={**proj.env, "RAY_ADDRESS": ray_cluster.address})
    assert out.returncode == 0 and out.stdout.split("\n")[-2] == "PASS ['ran']", out.stdout + out.stderr


DOCS = Path(__file__).resolve().parents[1] / "docs" / "cluster.md"


def _documented(start: str, port: int) -> list:
    """The command line of docs/cluster.md that begins with `start`, as its words, with the head at `port` here."""
    (line,) = [line for line in DOCS.read_text().splitlines() if line.startswith(start)]
    return shlex.split(line.replace("head.example.com", "127.0.0.1").replace("6379", str(port)))


def _stop(folder: Path) -> list:
    """Stop the Ray processes that keep their files in `folder` (a cluster's --temp-dir), and return those left
    (none): `ray stop` would stop every cluster of this machine, this file's own too."""
    def ours():
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and str(folder).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        return found
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in ours():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while ours() and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(folder, ignore_errors=True)
    return ours()


def test_the_documented_commands_start_a_cluster_of_this_machines_class(tmp_path):
    """docs/cluster.md's own commands: Ray's token authentication set up as it says, `golden-tasks node --head
    ...` starts a head, `golden-tasks node --address ...` joins a node to it (its arguments reach `ray start`
    as they are: argparse once refused --head), both of this machine's class, and the documented driver's run
    verifies on them; then the cluster is stopped. The head offers no CPU, so every task ran on the joined
    node."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = Path(tempfile.mkdtemp(prefix="gt-ray-", dir="/tmp"))  # short: Ray's socket paths lie below it
    proj = Project(tmp_path / "p", modules=("hello_world",))
    env = {k: v for k, v in proj.env.items() if not k.startswith("RAY_")}  # a new shell's: no cluster named
    name, _, value = _documented("export RAY_AUTH_MODE=", port)[1].partition("=")
    env[name] = value
    token = subprocess.run(_documented("ray get-auth-token", port), env=env, capture_output=True, text=True)
    assert token.returncode == 0 and Path("~/.ray/auth_token").expanduser().is_file(), token.stderr
    try:
        head = subprocess.run([*_documented("golden-tasks node --head", port), "--num-cpus", "0", "--temp-dir",
                               str(folder), "--include-dashboard", "false", "--disable-usage-stats"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert head.returncode == 0, head.stdout + head.stderr
        assert f"node class {node_class()}" in head.stdout
        node = subprocess.run([*_documented("golden-tasks node --address", port), "--num-cpus", "2",
                               "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=300)
        assert node.returncode == 0, node.stdout + node.stderr
        driver = _documented("RAY_ADDRESS=", port)
        address = driver.pop(0).partition("=")[2]
        assert driver[:2] == ["doit", "-n"] and address == f"127.0.0.1:{port}"
        run = subprocess.run([sys.executable, "-m", *driver, "backend=eager"], cwd=proj.path,
                             env={**env, "RAY_ADDRESS": address}, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, _told(proj, run)
        assert re.search(rf"^ray: \d+ tasks submitted to \S+:{port}$", run.stdout, re.M), run.stdout
    finally:
        left = _stop(folder)
    assert not left, f"still running after the cluster was stopped: {left}"
