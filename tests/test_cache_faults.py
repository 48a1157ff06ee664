"""The cache under faults, done for real: damaged objects, SIGKILL mid-run, concurrent
processes, an unwritable or full cache, read-only use, and sharing between checkouts."""
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from project import Project, ran, stage_results

pytestmark = pytest.mark.e2e
EAGER = "backend=eager"
MODULES = ("hello_world", "rms_norm", "softmax")


@pytest.fixture
def project(tmp_path):
    proj = Project(tmp_path / "project", MODULES)
    code, _, _, err = proj.doit("-n", "2", "verify", EAGER)
    assert code == 0, err
    return proj


@pytest.fixture
def scratch():
    """The temporary folder of the processes a test SIGKILLs, which leave their own behind: short, as
    reaper.make_temp's are (a socket's path inside must fit), and removed with what they left."""
    path = Path(tempfile.mkdtemp(prefix="gt-scratch-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def object_of(project, stage, case, kind):
    (entry,) = [e for e in project.entries(stage) if e["case"] == case]
    (record,) = [r for r in entry["objects"].values() if r["kind"] == kind][:1]
    return project.cache / "objects" / record["digest"][:2] / record["digest"]


def flip_byte(path, keep_mtime=False):
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)[0]
        f.seek(st.st_size // 2)
        f.write(bytes([byte ^ 0x10]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def fsck(project):
    if not project.cache.exists():  # killed before anything was stored
        return
    proc = project.cli("verify")
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.strip().endswith("0 problem(s) found")


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_input_is_detected_warned_and_recomputed(project, damage):
    path = object_of(project, "inputs", "rms_norm", "tensor")
    {"truncate": lambda: os.truncate(path, 10), "flip": lambda: flip_byte(path),
     "delete": lambda: path.unlink()}[damage]()
    code, results, _, err = project.doit("verify:rms_norm", EAGER)
    assert code == 0
    assert "warning: cache entry inputs:rms_norm" in err and "dropping it and recomputing" in err
    assert results["inputs:rms_norm"] == "success"
    # the recomputed inputs are bitwise the same: nothing downstream re-runs. The runtime dir's
    # data/in files are links to the object: damaged in place, they are written again
    rewritten = {"runtime:rms_norm"} if damage != "delete" else set()
    assert ran(stage_results(results)) == {"inputs:rms_norm"} | rewritten
    fsck(project)


def test_damaged_artifact_is_recompiled(project):
    os.truncate(object_of(project, "compile", "softmax", "file"), 7)
    code, results, _, err = project.doit("verify:softmax", EAGER)
    assert code == 0 and results["compile:softmax"] == "success"
    assert "cache entry compile:softmax" in err


def test_silent_bit_rot_is_caught_when_the_object_is_read(project):
    """A flip that leaves size and mtime alone passes the cheap status check; the
    stage that reads the object re-hashes it, drops the entry and recomputes it."""
    flip_byte(object_of(project, "golden", "rms_norm", "tensor"), keep_mtime=True)
    # a kernel edit that changes the output bits: validate must run, reading the golden's output
    project.edit("rms_norm", "inv_rms = torch.rsqrt(", "inv_rms = (1 + 2**-20) * torch.rsqrt(")
    code, results, report, err = project.doit("verify:rms_norm", EAGER)
    assert code == 0, report
    assert results["validate:rms_norm"] == "success"
    assert "cache entry golden:rms_norm" in err and "content does not match its digest" in err
    fsck(project)


def test_sigkill_at_any_moment_leaves_the_cache_consistent(tmp_path, scratch):
    proj = Project(tmp_path / "p", MODULES)
    rng = random.Random(7)
    for _ in range(4):
        proc = subprocess.Popen(proj.command("-n", "2", "verify", EAGER), cwd=proj.path,
                                env={**proj.env, "TMPDIR": str(scratch)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(2.0, 9.0))  # planning, compiling, storing
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        fsck(proj)
    code, results, report, err = proj.doit("verify", EAGER)
    assert code == 0, [(t["name"], t["error"]) for t in report["tasks"] if t["result"] == "fail"]
    fsck(proj)


def test_sigkill_during_compile_redoes_only_what_was_unfinished(tmp_path, scratch):
    proj = Project(tmp_path / "p", ("rms_norm",))
    proc = subprocess.Popen(proj.command("verify:rms_norm"), cwd=proj.path, env={**proj.env, "TMPDIR": str(scratch)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while not list(scratch.glob("golden-compile-*")) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # inside AOTInductor now
    assert proc.poll() is None and not proj.entries("compile")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    fsck(proj)
    code, results, _, err = proj.doit("verify:rms_norm")
    assert code == 0, err
    assert results["abi:rms_norm"] == "up-to-date" and results["compile:rms_norm"] == "success"


RUN_BESIDE = textwrap.dedent("""
    import sys
    sys.path.insert(0, ".")
    import golden_tasks, kernels.softmax as m
    case = m.CASES[0].resolved(m)
    result = golden_tasks.run(fn=case.kernel, specs=case.specs, golden=case.golden, name="softmax",
                              rtol=case.rtol, atol=case.atol, backend="eager")
    sys.exit(0 if result.passed else f"run failed: {result.error}")
""")


def test_two_doit_processes_and_a_run_call_share_one_cache(tmp_path):
    proj = Project(tmp_path / "p", MODULES)
    procs = [subprocess.Popen(proj.command("-n", "2", "verify", EAGER), cwd=proj.path, env=proj.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    procs.append(subprocess.Popen([sys.executable, "-c", RUN_BESIDE], cwd=proj.path, env=proj.env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out + err
    fsck(proj)
    keys = [(e["stage"], e["key"]) for e in proj.entries()]
    assert len(keys) == len(set(keys))
    code, results, _, _ = proj.doit("verify", EAGER)
    assert code == 0 and set(stage_results(results).values()) == {"up-to-date"}


def test_a_second_checkout_sharing_the_cache_verifies_with_zero_compiles(project, tmp_path):
    other = Project(tmp_path / "checkout2", MODULES, cache=project.cache)
    code, results, _, _ = other.doit("verify", EAGER)
    assert code == 0
    stages = stage_results(results)
    assert {r for n, r in stages.items() if not n.startswith("runtime:")} == {"up-to-date"}
    assert {r for n, r in stages.items() if n.startswith("runtime:")} == {"success"}  # its own runs/


def snapshot(root):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_read_only_mode_reuses_and_never_writes(project):
    before = snapshot(project.cache)
    readonly = {"GOLDEN_TASKS_CACHE_READONLY": "1"}
    code, results, _, _ = project.doit("verify", EAGER, env=readonly)
    assert code == 0 and set(stage_results(results).values()) == {"up-to-date"}
    project.edit("rms_norm", 't["out"].copy_(x / rms', 't["out"].copy_(1.0 * x / rms')
    code, results, _, err = project.doit("verify:rms_norm", EAGER, env=readonly)
    assert code == 0, err
    assert "golden:rms_norm" in ran(results)
    assert snapshot(project.cache) == before


def child_run(project, preexec_fn=None, readonly=False, prefix=()):
    env = {**project.env, "GOLDEN_TASKS_CACHE_READONLY": "1" if readonly else ""}
    return subprocess.run([*prefix, sys.executable, "-c", RUN_BESIDE], cwd=project.path, env=env,
                          capture_output=True, text=True, timeout=600, preexec_fn=preexec_fn)


def test_unwritable_cache_is_a_clear_error_and_works_read_only(tmp_path):
    proj = Project(tmp_path / "p", ("softmax",), calibrated=False)
    proj.cache.mkdir()
    os.chmod(proj.cache, 0o555)
    prefix = ()
    if os.geteuid() == 0:  # root ignores permission bits unless it gives up that capability
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot make a directory unwritable")
        prefix = ("setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps=-all")
    proc = child_run(proj, prefix=prefix)
    assert proc.returncode != 0
    assert "cannot write to the cache: Permission denied" in proc.stderr
    assert "GOLDEN_TASKS_CACHE_READONLY=1" in proc.stderr
    assert list(proj.cache.iterdir()) == []
    assert child_run(proj, readonly=True, prefix=prefix).returncode == 0
    assert list(proj.cache.iterdir()) == []


def small_disk():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, like ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))


def test_full_disk_is_a_clear_error_and_leaves_no_partial_entry(tmp_path):
    proj = Project(tmp_path / "p", ("softmax",))
    proc = child_run(proj, preexec_fn=small_disk)
    assert proc.returncode != 0
    assert "cannot write to the cache: File too large" in proc.stderr
    leftovers = [p for p in proj.cache.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    for entry in proj.entries():  # whatever was committed is whole
        for record in entry["objects"].values():
            path = proj.cache / "objects" / record["digest"][:2] / record["digest"]
            assert path.stat().st_size == record["nbytes"]
    assert child_run(proj).returncode == 0
