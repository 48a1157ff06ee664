"""`golden-tasks watch`: a real watcher over a real project, real doit runs, files saved as editors save them."""
import os
import select
import signal
import subprocess
import sys
import time

import pytest
from project import Project

pytestmark = pytest.mark.e2e
ADDER = '''import torch

from golden_tasks import Case, In, Out, TensorSpec, jit


@jit(backend="eager")
def adder(x: In, out: Out):
    out.copy_(x + 1)


def golden_adder(t):
    t["out"].copy_(t["x"] + 1)


CASES = [Case("adder", [TensorSpec("x", (8,), torch.float32, torch.randn), TensorSpec("out", (8,), torch.float32)],
              adder, golden=golden_adder, warmup=1, rounds=3)]
'''


def read_line(proc, seconds: float) -> str | None:
    """The watch's next line, or None when it printed none within `seconds`."""
    if select.select([proc.stdout], [], [], seconds)[0]:
        return proc.stdout.readline()
    return None


def doit_running(proc) -> str:
    """The pid of the watch's doit run in progress ("" when none)."""
    return subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "doit"], capture_output=True, text=True).stdout.strip()


def save_atomically(path, text: str) -> None:
    """As editors save: a temporary file beside it, renamed over it."""
    temporary = path.with_name(f".{path.name}.swp")
    temporary.write_text(text)
    os.replace(temporary, path)


@pytest.fixture
def watching(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "adder.py").write_text(ADDER)
    (proj.path / "kernels" / "other.py").write_text(ADDER.replace("adder", "other"))
    proc = subprocess.Popen([sys.executable, "-m", "golden_tasks.cli", "watch", "verify:adder", "backend=eager"],
                            cwd=proj.path, env=proj.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1, start_new_session=True)  # its own process group, as a terminal's job
    yield proj, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def test_a_broken_kernel_fails_under_the_watch_unrelated_saves_do_nothing_and_ctrl_c_leaves_nothing(watching):
    proj, proc = watching
    first = read_line(proc, 300)
    assert first is not None and first.rstrip().endswith("] first run: adder PASS"), (first, proc.stderr)
    # saves of files the case does not depend on: notes beside the kernels, a script in another folder
    (proj.path / "notes.txt").write_text("unrelated\n")
    save_atomically(proj.path / "notes.txt", "still unrelated\n")
    (proj.path / "scripts").mkdir()
    (proj.path / "scripts" / "plot.py").write_text("print('unrelated')\n")
    assert read_line(proc, 8) is None
    # the kernel broken, saved as an editor saves it: the watch runs it again and it fails
    kernel = proj.path / "kernels" / "adder.py"
    save_atomically(kernel, ADDER.replace("out.copy_(x + 1)", "out.copy_(x + 2)"))
    broken = read_line(proc, 300)
    assert broken is not None and "] kernels/adder.py changed: adder FAIL (validate: " in broken, broken
    report = (proj.path / "runs" / "report.json").read_text()
    assert '"status": "FAIL"' in report or '"status":"FAIL"' in report  # the reports are rewritten
    # mended (new content: planned again, so its run takes seconds), then saved twice more while that run
    # is in progress: those two queue one run after it, not two
    save_atomically(kernel, ADDER + "# mended\n")
    deadline = time.monotonic() + 60
    while not (running := doit_running(proc)) and time.monotonic() < deadline:
        time.sleep(0.02)
    save_atomically(kernel, ADDER + "# a\n")
    save_atomically(kernel, ADDER + "# b\n")
    assert running and doit_running(proc) == running, "the saves did not land during the run"
    runs = [read_line(proc, 300), read_line(proc, 300), read_line(proc, 15)]
    assert [line and line.split("] ", 1)[1] for line in runs] == ["kernels/adder.py changed: adder PASS\n"] * 2 + [None]
    # Ctrl-C, as a terminal sends it to the job: the watch ends, and nothing it started is left
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    assert proc.stdout.read().endswith("golden-tasks watch: stopped\n")
    assert "Traceback" not in proc.stderr.read()
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(proj.path)], capture_output=True, text=True).stdout
    assert left == "", left


def test_a_selection_that_is_not_verify_or_an_unknown_variable_is_one_line(tmp_path):
    proj = Project(tmp_path / "p", ())
    proc = subprocess.run([sys.executable, "-m", "golden_tasks.cli", "watch", "bench:adder", "timout=5"],
                          cwd=proj.path, env=proj.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == ("golden-tasks watch: 'bench:adder' is not verify or verify:CASE; "
                                                    "unknown doit variable timout (did you mean timeout?)\n")


def test_a_file_the_kernel_starts_importing_is_watched_from_the_next_run(watching):
    """After each run the watch reads again what the case depends on: a module the kernel starts
    importing is followed from then on (the watcher is made again, and nothing saved meanwhile is lost)."""
    proj, proc = watching
    assert read_line(proc, 300).rstrip().endswith("] first run: adder PASS")
    helper = proj.path / "kernels" / "step.py"
    helper.write_text("STEP = 1\n")
    # a new module where planning lists the kernel modules (it may define cases): a run
    assert read_line(proc, 300).split("] ", 1)[1] == "kernels/step.py changed: adder PASS\n"
    kernel = proj.path / "kernels" / "adder.py"
    save_atomically(kernel, ADDER.replace("import torch\n", "import torch\n\nfrom kernels.step import STEP\n")
                    .replace("out.copy_(x + 1)", "out.copy_(x + STEP)"))
    assert read_line(proc, 300).split("] ", 1)[1] == "kernels/adder.py changed: adder PASS\n"
    save_atomically(helper, "STEP = 2\n")
    changed = read_line(proc, 300)
    assert changed and changed.split("] ", 1)[1].startswith("kernels/step.py changed: adder FAIL (validate: "), changed
