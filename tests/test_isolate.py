"""Kernel calls run isolated: a crash, a hang, an out-of-bounds write or a missing device fails
(or skips) one case with a precise message, and every other case is still verified."""
import os
import signal
import subprocess
import sys

import pytest
import torch
from project import Project

import golden_tasks
from golden_tasks import In, Out, TensorSpec, jit
from golden_tasks.forms.base import Artifact, KernelForm
from golden_tasks.forms.isolate import GUARD_BYTES, Guarded
from golden_tasks.model.rows import ParamRow
from golden_tasks.model.specs import table_of

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine

# The misbehaviour is data dependent (x > 0) so that compile-time checks, which run the
# body on fakes or zeros, never trigger it; dispatch runs it on x = 1.
MISBEHAVING = '''
import ctypes
import os
import time

import torch

from golden_tasks import Case, In, Out, TensorSpec, jit


def golden(t):
    t["out"].copy_(t["x"] * 2)


@jit(backend="eager")
def segfault(x: In, out: Out):
    out.copy_(x * 2)
    if bool(x[0] > 0):
        ctypes.string_at(0)


@jit(backend="eager")
def aborts(x: In, out: Out):
    out.copy_(x * 2)
    if bool(x[0] > 0):
        os.abort()


@jit(backend="eager")
def hangs(x: In, out: Out):
    out.copy_(x * 2)
    while bool(x[0] > 0):
        time.sleep(0.1)


@jit(backend="eager")
def writes_past_end(x: In, out: Out):
    out.copy_(x * 2)
    if bool(x[0] > 0):
        ctypes.memset(out.data_ptr() + out.numel() * out.element_size(), 0, 4)


@jit(backend="eager")
def writes_before_start(x: In, out: Out):
    out.copy_(x * 2)
    if bool(x[0] > 0):
        ctypes.memset(out.data_ptr() - 4, 0, 4)


@jit(backend="eager")
def raises(x: In, out: Out):
    out.copy_(x * 2)
    if bool(x[0] > 0):
        raise ValueError("boom")


SPECS = [TensorSpec("x", (16,), torch.float32, init_value=1.0), TensorSpec("out", (16,), torch.float32)]
CASES = [Case(k.name, specs=SPECS, kernel=k, golden=golden, timeout=3)
         for k in (segfault, aborts, hangs, writes_past_end, writes_before_start, raises)]
'''

# The same misbehaviour in C++, plus a compile error.
MISBEHAVING_CPP = {
    "cpp_kernels_bad.py": '''
import torch

from golden_tasks import Case, In, Out, Scalar, ScalarSpec, TensorSpec, cpp
from kernels.misbehaving import golden


@cpp("bad.cpp", flags=("-O2",))
def cpp_segfault(x: In[torch.float32], out: Out[torch.float32], n: Scalar[torch.int64]): ...


@cpp("bad.cpp", flags=("-O2",))
def cpp_hangs(x: In[torch.float32], out: Out[torch.float32], n: Scalar[torch.int64]): ...


@cpp("bad.cpp", flags=("-O2",))
def cpp_writes_one_past(x: In[torch.float32], out: Out[torch.float32], n: Scalar[torch.int64]): ...


@cpp("broken.cpp")
def cpp_compile_error(x: In[torch.float32], out: Out[torch.float32], n: Scalar[torch.int64]): ...


SPECS = [TensorSpec("x", (16,), torch.float32, init_value=1.0), TensorSpec("out", (16,), torch.float32),
         ScalarSpec("n", torch.int64, 16)]
CASES = [Case(k.name, specs=SPECS, kernel=k, golden=golden, timeout=3)
         for k in (cpp_segfault, cpp_hangs, cpp_writes_one_past, cpp_compile_error)]
''',
    "bad.cpp": '''
#include <cstdint>
extern "C" void cpp_segfault(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = 2 * x[i];
    *(volatile int*)nullptr = 1;
}
extern "C" void cpp_hangs(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = 2 * x[i];
    for (volatile bool spin = true; spin;) {}
}
extern "C" void cpp_writes_one_past(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i <= n; ++i) out[i] = 2 * x[i < n ? i : 0];  // <=: one element too far
}
''',
    "broken.cpp": '''
#include <cstdint>
extern "C" void cpp_compile_error(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = 2 * x[i]
}
''',
}

EXPECTED = {
    "segfault": "the kernel of segfault crashed: killed by signal SIGSEGV (11: Segmentation fault)",
    "aborts": "the kernel of aborts crashed: killed by signal SIGABRT (6: Aborted)",
    "hangs": "the kernel of hangs hung: no result after 3 s (the case's timeout); its process and every process it started were killed",
    "writes_past_end": "the guard region out (after) lost its canary",
    "writes_before_start": "the guard region out (before) lost its canary",
    "raises": "ValueError: boom",
    "cpp_segfault": "the kernel of cpp_segfault crashed: killed by signal SIGSEGV (11: Segmentation fault)",
    "cpp_hangs": "the kernel of cpp_hangs hung: no result after 3 s (the case's timeout); its process and every process it started were killed",
    "cpp_writes_one_past": "the guard region out (after) lost its canary",
}


def test_guard_regions_report_the_clobbered_side_how_much_and_where():
    g = Guarded("out", torch.arange(8, dtype=torch.float32))
    assert g.tensor.data_ptr() % 64 == 0 and g.clobbered() == []
    assert torch.equal(g.tensor, torch.arange(8, dtype=torch.float32))
    g.buffer[GUARD_BYTES - 1] = 0
    assert g.clobbered() == [("before", f"1 of its {GUARD_BYTES} bytes changed, the nearest at byte 0 below the "
                                        "first element (element 0 below it, of float32)")]
    g.buffer[GUARD_BYTES + 8 * 4 + 4:GUARD_BYTES + 8 * 4 + 12] = 0  # elements 1 and 2 past the end
    assert g.clobbered()[1] == ("after", f"8 of its {GUARD_BYTES} bytes changed, the nearest at byte 4 past the last "
                                         "element (element 1 past it, of float32)")


@pytest.mark.e2e
def test_misbehaving_kernels_fail_and_the_rest_of_the_run_passes(tmp_path):
    proj = Project(tmp_path / "p", ("rms_norm",))
    (proj.path / "kernels" / "misbehaving.py").write_text(MISBEHAVING)
    for name, text in MISBEHAVING_CPP.items():
        (proj.path / "kernels" / name).write_text(text)
    code, results, report, err = proj.doit("-n", "2", "--continue", "verify")
    assert code != 0
    errors = {t["name"]: t.get("error") or "" for t in report["tasks"]}
    assert results["validate:rms_norm"] == "success" and results["bench:rms_norm"] == "success", err
    # a compile error is the compiler's diagnostic, not a Python traceback
    assert results["compile:cpp_compile_error"] == "fail"
    assert "broken.cpp:4:" in errors["compile:cpp_compile_error"] and "error: expected ';'" in \
        errors["compile:cpp_compile_error"] and "Traceback" not in errors["compile:cpp_compile_error"]
    for case, message in EXPECTED.items():
        assert results[f"dispatch:{case}"] == "fail", case
        assert message in errors[f"dispatch:{case}"], errors[f"dispatch:{case}"]
    assert "Traceback" not in errors["dispatch:segfault"] + errors["dispatch:cpp_segfault"]


@pytest.mark.e2e
def test_timeout_is_a_doit_variable(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "kernels" / "misbehaving.py").write_text(MISBEHAVING)
    code, _, report, _ = proj.doit("dispatch:hangs", "timeout=1.5")
    error = next(t["error"] for t in report["tasks"] if t["name"] == "dispatch:hangs")
    assert code != 0 and "no result after 1.5 s" in error


class _Offline(Artifact):
    """An artifact for a device this machine does not have."""
    backend = "test-offline"

    def load(self):
        raise AssertionError("never loaded without its device")

    def unavailable(self):
        return "no test accelerator on this machine"


class _OfflineKernel(KernelForm):
    name = "offline"

    def params(self):
        return [ParamRow("x", "tensor", "in"), ParamRow("out", "tensor", "out")]

    def compile(self, specs, options, workdir):
        return _Offline(table_of(specs), {})


@pytest.mark.e2e
def test_an_artifact_without_its_device_is_skipped_with_the_reason_never_passed(tmp_path):
    specs = [TensorSpec("x", (4,), torch.float32), TensorSpec("out", (4,), torch.float32)]
    result = golden_tasks.run(_OfflineKernel(), specs, lambda t: t["out"].copy_(t["x"]), runs_dir=tmp_path)
    assert not result.passed and result.report.status == result.status == "SKIPPED"
    assert result and not result.failed and result.skipped == "no test accelerator on this machine"  # not a failure
    assert result.error == "SKIPPED: no test accelerator on this machine"
    assert result.stages["dispatch"] == "skipped" and result.stages["bench"] == "skipped" and result.bench is None


@jit(backend="eager")
def _double(x: In, out: Out):
    out.copy_(x * 2)


@pytest.mark.e2e
def test_isolated_dispatch_returns_the_outputs(tmp_path):
    specs = [TensorSpec("x", (1000,), torch.float32, init_value=torch.randn), TensorSpec("out", (1000,), torch.float32)]
    result = golden_tasks.run(_double, specs, lambda t: t["out"].copy_(t["x"] * 2), runs_dir=tmp_path, rounds=3)
    assert result.passed, result.error
    assert result.bench.rounds == 3


@pytest.mark.e2e
def test_an_unguarded_script_calling_run_is_not_reimported_by_the_children(tmp_path):
    script = tmp_path / "verify_double.py"
    script.write_text(
        "import torch\nimport golden_tasks\nfrom golden_tasks import In, Out, TensorSpec, jit\n\n"
        "print('script body ran')\n\n"
        "@jit(backend='eager')\ndef double(x: In, out: Out):\n    out.copy_(x * 2)\n\n"
        "specs = [TensorSpec('x', (8,), torch.float32, init_value=torch.randn), TensorSpec('out', (8,), torch.float32)]\n"
        "result = golden_tasks.run(double, specs, lambda t: t['out'].copy_(t['x'] * 2), rounds=2)\n"
        "print('passed' if result.passed else result.error)\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["script body ran", "passed"]


def inductor_cxx():
    import torch._inductor.config  # read by torch when the forkserver imported it

    return torch._inductor.config.cpp.cxx[1]


def test_a_changed_environment_reaches_what_torch_read_at_import(monkeypatch):
    from golden_tasks.forms import isolate

    for compiler in ("gt-first-cxx", "gt-second-cxx"):
        monkeypatch.setenv("CXX", compiler)
        assert isolate.call(inductor_cxx, (), 60, "reading CXX") == compiler


def cache_folder() -> str:
    return os.environ["GOLDEN_TASKS_CACHE"]


def test_a_change_that_only_calls_read_keeps_the_forkserver(monkeypatch, tmp_path):
    """The control beside it: a new cache folder (as every test's is) reaches the call without a new forkserver."""
    import multiprocessing.forkserver

    from golden_tasks.forms import isolate

    servers = []
    for n in range(2):
        monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(tmp_path / f"cache{n}"))
        assert isolate.call(cache_folder, (), 60, "reading the cache folder") == str(tmp_path / f"cache{n}")
        servers.append(multiprocessing.forkserver._forkserver._forkserver_pid)
    assert servers[0] == servers[1] is not None


@pytest.mark.e2e
def test_run_from_a_script_shows_the_users_warnings_not_torchs(tmp_path):
    """torch's export pickles a deprecated treespec (a FutureWarning in the caller's process, once the
    artifact is loaded): hidden, while the golden's own warning shows."""
    script = tmp_path / "verify_add.py"
    script.write_text(
        "import warnings\nimport torch\nimport golden_tasks\nfrom golden_tasks import In, Out, TensorSpec, jit\n\n"
        "@jit(backend='aoti')\ndef add1(x: In, out: Out):\n    out.copy_(x + 1)\n\n"
        "def golden(t):\n    warnings.warn('the golden is approximate')\n    t['out'].copy_(t['x'] + 1)\n\n"
        "specs = [TensorSpec('x', (8,), torch.float32, init_value=torch.randn), TensorSpec('out', (8,), torch.float32)]\n"
        "result = golden_tasks.run(add1, specs, golden, rounds=2, warmup=1)\n"
        "print(result.status)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0 and proc.stdout == "PASS\n", proc.stderr
    assert "FutureWarning" not in proc.stderr and "DeprecationWarning" not in proc.stderr, proc.stderr
    assert "the golden is approximate" in proc.stderr


def test_the_forkserver_and_its_children_ignore_sigint_which_the_caller_keeps():
    """A Ctrl-C reaches every process of the terminal's group: the isolation forkserver, started while this
    process ignores SIGINT (reaper.sigint_ignored), ignores it for its life, and so do the kernels' children
    (no traceback from an interpreter cut short while it starts); the caller's own handler is back after."""
    from golden_tasks.forms import isolate

    forkserver, child_ignores = isolate.call(_parent_and_sigint, (), 60, "a child")
    assert child_ignores and _ignores_sigint(forkserver)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not _ignores_sigint(os.getpid())


def _ignores_sigint(pid: int) -> bool:
    status = open(f"/proc/{pid}/status").read()
    return bool(int(status.split("SigIgn:")[1].split()[0], 16) & (1 << (signal.SIGINT - 1)))


def _parent_and_sigint() -> tuple:
    return os.getppid(), _ignores_sigint(os.getpid())


@pytest.mark.e2e
def test_an_isolated_call_runs_under_a_deep_temporary_folder(tmp_path):
    """The forkserver's unix socket would lie below $TMPDIR, whose path can be too long for one (107 bytes):
    a call still runs, and leaves nothing of ours behind."""
    deep = tmp_path / ("deep" * 20)
    deep.mkdir()
    code = "from golden_tasks.forms import isolate; print(isolate.call(abs, (-3,), 60.0, 'a probe'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(deep)})
    assert done.returncode == 0 and done.stdout.strip().endswith("3"), done.stderr[-2000:]
    assert [p.name for p in deep.iterdir() if not p.name.startswith("torchinductor_")] == []  # torch's cache
