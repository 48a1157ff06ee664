"""Triton for kernel modules: `from golden_tasks.triton import triton, tl` (and DEVICE).

Where the triton extra is installed, these are `triton` and `triton.language` themselves, imported with
$TRITON_INTERPRET set as golden-tasks runs Triton kernels on this machine (the interpreter where no GPU
is visible; Triton reads it as each @triton.jit function is decorated). Without the extra, stand-ins, so
that the module still imports: its launchers never run, and their cases are SKIPPED, saying why.

DEVICE is the torch device Triton kernels run on here ("cuda", or "cpu" under the interpreter), for what
Triton's tutorials ask the driver at import (`triton.runtime.driver.active.get_active_torch_device()`),
which the interpreter has none of.
"""

from .forms.triton_form import installed
from .project.toolchain import settle_triton_mode, triton_interpreted


class _Absent:
    """Any name of triton or triton.language where triton is not installed: a decorator returns what it
    decorates, anything else another stand-in."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        return _Absent(f"{self._name}.{attr}")

    def __getitem__(self, item):
        return self

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Absent(f"{self._name}(...)")

    def __repr__(self):
        return f"<{self._name}: triton is not installed>"


if installed():
    settle_triton_mode()
    import triton
    import triton.language as tl
else:
    triton, tl = _Absent("triton"), _Absent("triton.language")

DEVICE = "cpu" if triton_interpreted() else "cuda"

__all__ = ["DEVICE", "tl", "triton"]
