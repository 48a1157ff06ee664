"""What `doit verify` shows a person at a terminal and leaves in a log, from real doit runs.

A terminal is a real pseudo-terminal (the pty module) that is the run's controlling terminal, so
Ctrl-C there is a real SIGINT to its process group. The project holds hello_world (compiled with
AOTInductor, whose export makes torch emit its FutureWarning) and a case whose golden warns.
"""
import fcntl
import json
import os
import pty
import re
import select
import subprocess
import termios
import time
from xml.etree import ElementTree

import pytest
from project import Project

from golden_tasks.model.plan import VARIABLES
from golden_tasks.pipeline.stage_table import STAGES
from golden_tasks.project import config

OWN_WARNING = "a kernel's own warning, which must show"
WARNS = f'''"""add, with a golden that warns."""
import warnings

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit


@jit
def warns(x: In, out: Out):
    out.copy_(x + 1)


def golden_warns(t):
    warnings.warn("{OWN_WARNING}")
    t["out"].copy_(t["x"] + 1)


CASES = [Case("warns", specs=[TensorSpec("x", (8,), torch.float32, init_value=torch.randn),
                              TensorSpec("out", (8,), torch.float32)], backend="eager", warmup=1, rounds=3)]
'''
FAST = ("warmup=1", "rounds=3")


def on_terminal(project, *args, interrupt_on=None, env=None):
    """Run doit on a pseudo-terminal that is its controlling terminal; (exit status, all it wrote).
    With `interrupt_on`, type Ctrl-C once the output shows that text."""
    master, slave = pty.openpty()
    env = {**project.env, "COLUMNS": "160", **(env or {})}
    env.pop("PYTHONWARNINGS")  # a user's shell: warnings show unless we filter them

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(project.command(*args), cwd=project.path, env=env, stdin=slave, stdout=slave,
                            stderr=slave, preexec_fn=controlling_terminal)
    os.close(slave)
    out, deadline = b"", time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every process holding the terminal has exited
                    break
                if not chunk:
                    break
                out += chunk
                if interrupt_on and interrupt_on.encode() in out:
                    os.write(master, b"\x03")
                    interrupt_on = None
        return proc.wait(timeout=120), out.decode(errors="replace")
    finally:
        proc.kill()
        os.close(master)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = Project(tmp_path_factory.mktemp("terminal"), ("hello_world",), html=True, calibrated=False)
    (proj.path / "kernels" / "warns.py").write_text(WARNS)
    proj.cold = on_terminal(proj, "-n", "2", "verify", *FAST)
    return proj


@pytest.mark.e2e
def test_a_terminal_shows_live_progress_then_the_summary(project):
    code, out = project.cold
    assert code == 0, out
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)  # the view, without its escape codes
    tasks = 2 * (1 + len(STAGES) - 1 + 1) + 1  # each case's plan, stages and runtime dir, and calibrate:machine
    assert "\x1b[" in out and re.search(rf"\d+/{tasks} tasks", plain) and "running: compile:hello_world" in plain
    assert re.search(r"hello_world +PASS +ran", out) and re.search(r"warns +PASS +ran", out)
    assert "runs/report.json" in out
    # an empty cache: the view counts no cache hit (a case's plan is not one)
    assert re.search(r"tasks +[0-9:]+ +0 cached", plain), plain
    # torch's deprecation chatter is filtered, in the isolated children too; ours is not
    assert "FutureWarning" not in out and "DeprecationWarning" not in out
    assert OWN_WARNING in out


@pytest.mark.e2e
def test_a_no_op_run_prints_the_summary_only(project):
    proc = project.console("verify", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    header, rule, *rows, files, last = proc.stdout.splitlines()
    assert header.startswith("case ") and set(rule) == {"-", " "}
    assert [r.split()[:3] for r in rows] == [["hello_world", "PASS", "cached"], ["warns", "PASS", "cached"]]
    assert files == f"report: {project.path / 'runs' / 'report.json'} (also report.xml, report.html)"
    assert last == "2 cases: 2 PASS"
    assert "\x1b" not in proc.stdout + proc.stderr


@pytest.fixture
def broken(project):
    project.edit("hello_world", "torch.sub(x, y, alpha=-1)", "torch.sub(x, y)")
    yield project
    project.restore("hello_world")


@pytest.mark.e2e
def test_a_failing_case_gets_one_reason_line_and_a_log(broken):
    proc = broken.console("-n", "2", "verify", "backend=eager", *FAST)
    assert proc.returncode == 1  # a case failed: doit's status 1, with --no-continue and -n as without
    assert proc.stdout.splitlines()[-1] == "2 cases: 1 FAIL, 1 PASS"
    # the figure that failed is shown, not "-"
    assert re.search(r"^hello_world +FAIL( +\S+){11} +[0-9.]+e[+-]\d\d ", proc.stdout, re.M), proc.stdout
    shown = proc.stdout + proc.stderr
    assert "UnmetDependency" not in shown and "<stdout>" not in shown and "####" not in shown
    assert "\x1b" not in shown
    log = broken.path / "runs" / "hello_world.log"
    (reason,) = [line for line in proc.stdout.splitlines() if line.startswith("hello_world: FAIL")]
    assert reason == ("hello_world: FAIL at validate: validation FAILED for hello_world: output 'out': "
                      "3840/3840 elements mismatched (rtol=0, atol=0)  (all messages: runs/hello_world.log)")
    assert "worst at" in log.read_text()
    # doit's own failure output, for those who ask
    full = broken.console("--failure-verbosity=2", "verify:hello_world", "backend=eager", *FAST)
    assert "TaskFailed - taskid:validate:hello_world" in full.stdout and "worst at" in full.stdout
    assert full.returncode == 1


@pytest.mark.e2e
def test_a_failing_case_never_keeps_the_others_from_their_verdicts(broken):
    """One run, one worker: hello_world fails first, and warns (edited, so that it has stages to run) is still
    verified after it; `--no-continue` stops at the failure and names the cases it left."""
    broken.edit("warns", "x + 1", "1 + x")
    try:
        proc = broken.console("verify", "backend=eager", *FAST)
        assert proc.returncode == 1 and proc.stdout.splitlines()[-1] == "2 cases: 1 FAIL, 1 PASS", proc.stdout
        (warns,) = [line.split() for line in proc.stdout.splitlines() if line.startswith("warns ")]
        assert warns[1] == "PASS" and "ran" in warns[2:12] and "not reached" not in proc.stdout  # ran after the failure
        broken.edit("warns", "1 + x", "x + 1.0")
        stopped = broken.console("--no-continue", "verify", "backend=eager", *FAST)
        assert stopped.returncode == 1 and re.search(r"^warns +INCOMPLETE ", stopped.stdout, re.M), stopped.stdout
        assert "not reached: warns (--no-continue stopped the run at the first failure)" in stopped.stdout
    finally:
        (broken.path / "kernels" / "warns.py").write_text(WARNS)


@pytest.mark.e2e
def test_the_json_reporter_run_writes_the_record_and_a_fresh_page(broken):
    """What a CI job runs: valid JSON on stdout, the record, and runs/report.html drawn again by this run
    (it is drawn as the doit parent exits), with no traceback."""
    page = broken.path / "runs" / "report.html"
    page.unlink(missing_ok=True)
    before = time.time()
    code, results, _, err = broken.doit("verify", "backend=eager", *FAST)
    assert code != 0 and results["validate:hello_world"] == "fail"
    assert "Traceback" not in err and "Exception ignored" not in err, err
    record = json.loads((broken.path / "runs" / "report.json").read_text())
    assert record["started"] >= before - 60 and record["finished"] >= record["started"]
    assert not record["passed"]
    rows = {r["case"]: r for r in record["cases"]}
    assert rows["hello_world"]["status"] == "FAIL" and rows["warns"]["status"] == "PASS"
    assert rows["hello_world"]["stages"]["validate"] == "FAILED" and rows["warns"]["stages"]["validate"] == "cached"
    assert rows["hello_world"]["reason"].startswith("validate: validation FAILED for hello_world: output 'out'")
    assert "worst at" in rows["hello_world"]["errors"]["validate"]
    assert (broken.path / "runs" / "hello_world.log").exists()
    junit = ElementTree.parse(broken.path / "runs" / "report.xml").getroot()
    assert junit.get("failures") == "1" and junit.find("testcase[@name='hello_world']/failure") is not None
    assert page.stat().st_mtime >= before
    page = page.read_text()
    assert page.startswith("<!DOCTYPE html>") and "hello_world" in page
    # the case passes again: its log goes
    broken.restore("hello_world")
    code, _, _, _ = broken.doit("verify", *FAST, env={"GOLDEN_TASKS_HTML": "0"})
    assert code == 0 and not (broken.path / "runs" / "hello_world.log").exists()
    assert not (broken.path / "runs" / "report.html").exists()  # not drawn, and not left from the run before


@pytest.mark.e2e
def test_ctrl_c_is_one_line_and_keeps_the_last_complete_report(project):
    saved = (project.path / "runs" / "report.json").read_bytes()
    code, out = on_terminal(project, "-n", "2", "verify", "warmup=1", "rounds=4", interrupt_on="running: ")
    assert code != 0
    assert "Traceback" not in out and "golden-tasks: interrupted;" in out
    assert (project.path / "runs" / "report.json").read_bytes() == saved


@pytest.mark.e2e
@pytest.mark.parametrize("moment", ["verify ", "running: compile:hello_world", "running: bench:hello_world"])
def test_ctrl_c_at_any_moment_is_one_line_and_leaves_no_temp_dir_or_process(tmp_path, moment):
    proj = Project(tmp_path / "p", ("hello_world",))
    (tmp_path / "tmp").mkdir()
    code, out = on_terminal(proj, "-n", "2", "verify", *FAST, interrupt_on=moment, env={"TMPDIR": str(tmp_path / "tmp")})
    assert code != 0 and "Traceback" not in out and "golden-tasks: interrupted" in out, out
    time.sleep(1)  # the workers' exit: they clean up as they go
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")] == []  # torch's cache
    left = subprocess.run(["pgrep", "-f", str(proj.path)], capture_output=True, text=True).stdout
    assert left == "", left


@pytest.mark.e2e
def test_mistyped_names_bad_variables_and_help(project):
    typo = project.console("verify:helo_world")
    assert typo.returncode == 3
    assert "golden-tasks: no task 'verify:helo_world'; did you mean verify:hello_world" in typo.stderr
    bad = project.console("verify", "rounds=abc")
    assert bad.returncode == 3 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == "golden-tasks: doit variable rounds='abc' is not an integer >= 1"
    # a misspelt variable is not ignored in silence
    misspelt = project.console("verify", "timout=5", "rounds=3", "colour=red")
    assert misspelt.returncode == 3 and misspelt.stdout == ""
    assert misspelt.stderr == ("golden-tasks: unknown doit variables timout (did you mean timeout?), colour; "
                               "`doit help verify` lists the variables\n")
    shown = project.console("help", "verify").stdout
    for name in (*VARIABLES, *config.RunContext.VARIABLES):
        assert re.search(rf"^  {name} +\S", shown, re.M), name


def test_the_selection_is_read_as_doit_reads_it():
    from golden_tasks.frontends.doit_session import CommandLine

    line = CommandLine.parse(["-n", "2", "--continue", "verify:a", "rounds=3"])
    assert line.command == "run" and line.tasks == ("verify:a",) and line.selects("verify:a")
    assert not line.selects("verify:b")
    assert CommandLine.parse(["--reporter=json"]).selects("verify:b")  # the default tasks
    assert CommandLine.parse(["run", "verify:*"]).selects("verify:b")
    assert not CommandLine.parse(["compile:a"]).selects("verify:a")
    assert CommandLine.parse(["list", "--all"]).command == "list"
    # another command's own options are not task names (`info --no-status` is not a task to look for)
    assert CommandLine.parse(["info", "--no-status", "verify:a"]).tasks == ("verify:a",)
    assert CommandLine.parse(["info", "-f", "dodo.py", "verify:a"]).tasks == ("verify:a",)
    assert CommandLine.parse(["list", "--all", "-s"]).tasks == ()


RAISING = '''"""cases whose user code raises: a spec's init, a golden, the specs themselves."""
import torch

from golden_tasks import Case, In, Out, TensorSpec, jit


def no_such_size():
    raise ValueError('no such size')


@jit
def copy(x: In, out: Out):
    out.copy_(x)


def golden_copy(t):
    t["out"].copy_(t["x"])


def golden_broken(t):
    t['out'].copy_(t['missing'])


def specs(init=torch.randn):
    return [TensorSpec("x", (8,), torch.float32, init_value=init), TensorSpec("out", (8,), torch.float32)]


def no_specs():
    return {}['x']


CASES = [Case("bad_init", specs=specs(no_such_size), kernel=copy, golden=golden_copy, backend="eager"),
         Case("bad_golden", specs=specs(), kernel=copy, golden=golden_broken, backend="eager"),
         Case("bad_specs", specs=no_specs, kernel=copy, golden=golden_copy, backend="eager")]
'''


@pytest.mark.e2e
def test_user_code_that_raises_is_named_with_its_message_and_line(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "raising.py").write_text(RAISING)
    lines = RAISING.splitlines()

    def at(text):
        return f"(at {os.path.join('kernels', 'raising.py')}:{lines.index(text) + 1})"

    proc = proj.console("--continue", "verify", *FAST)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    reasons = {r.partition(":")[0]: r for r in proc.stdout.splitlines() if ": FAIL at " in r}
    assert reasons["bad_init"] == ("bad_init: FAIL at inputs: spec 'x': its init_value raised ValueError: no such "
                                   f"size {at('    raise ValueError(' + repr('no such size') + ')')}  "
                                   "(all messages: runs/bad_init.log)")
    assert reasons["bad_golden"] == ("bad_golden: FAIL at golden: golden of bad_golden raised KeyError: 'missing' "
                                     f"{at('    t[' + repr('out') + '].copy_(t[' + repr('missing') + '])')}  "
                                     "(all messages: runs/bad_golden.log)")
    assert reasons["bad_specs"].startswith(f"bad_specs: FAIL at plan: KeyError: 'x' {at('    return {}[' + repr('x') + ']')}")
    assert "Traceback" not in proc.stdout + proc.stderr
    for case in ("bad_init", "bad_golden", "bad_specs"):  # the log keeps the whole traceback
        assert "Traceback (most recent call last)" in (proj.path / "runs" / f"{case}.log").read_text(), case
