"""Kernel forms: what the pipeline needs from a kernel, whatever it is written in.

A form declares its parameter table (names, kinds, directions) before any
compile work, and compiles itself for a list of specs into an Artifact. The
pipeline never asks which form it holds; new forms (C++ sources, multi-rank
programs) subclass KernelForm and register their Artifact type.
"""
import importlib
from pathlib import Path

from ..model.errors import CompileError, SpecError


def world_size(value, owner: str) -> int:
    """A checked world size (ranks): an int >= 1; anything else is a SpecError naming `owner`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{owner}: ranks={value!r} is not a world size (an int >= 1)")
    return value


class KernelForm:
    """Base class of kernel forms."""

    name: str
    ranks: int = 1  # the world size it runs at unless a case or `ranks=N` says otherwise
    # whether trusted code must never import its code (forms.untrusted, forms.solution): its module never runs beside
    # the golden, and only confined processes load it
    untrusted: bool = False
    # whether one build serves every call (its build reads nothing of the specs' shapes or scalar values, which it
    # is called with, and its artifact's table leaves them open: ParamRow.open): the points of a sweep then share
    # one compile (Plan.compiled_for)
    builds_once: bool = False

    def params(self) -> list:
        """The declared parameter table: a model.rows.ParamRow per parameter, in order; a row may
        also declare a dtype and a shape, which the ABI stage then checks."""
        raise NotImplementedError

    def compile(self, specs: list, options: dict, workdir: Path) -> "Artifact":
        """Build an artifact specialised to `specs` (stamped) in `workdir`. `options` is the
        case's options dict as is (command-line overrides merged), plus "backend": the chosen
        backend or None, and "ranks": the world size it runs at."""
        raise NotImplementedError


class Artifact:
    """A compiled kernel: payload files plus the parameter table it embeds.

    `table` rows are model.rows.ParamRow, every field set (specs.table_of). Subclasses
    are registered by `backend` name so a stored artifact is reloaded without
    knowing the kernel's source.
    """

    backend: str
    device: str = "cpu"  # where its tensor arguments must live
    registry: dict = {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "backend" in cls.__dict__:  # a class rebuilt by cloudpickle gets its attributes after this
            Artifact.registry[cls.backend] = cls

    def __init__(self, table: list, files: dict):
        self.table = table
        self.files = {k: Path(v) for k, v in files.items()}

    @classmethod
    def restore(cls, backend: str, table: list, files: dict, module: str) -> "Artifact":
        """The artifact from its stored description; `module` defines its class."""
        importlib.import_module(module)
        try:
            return cls.registry[backend](table, files)
        except KeyError:
            raise CompileError(f"unknown artifact backend {backend!r} (module {module})") from None

    def load(self):
        """A callable taking every argument positionally in spec order."""
        raise NotImplementedError

    def unavailable(self) -> str:
        """Why this machine cannot run the artifact (a missing device), or None when it can."""
        return None

    def timing_caveat(self) -> str:
        """Why its timings are not performance figures (it runs emulated), or None when they are."""
        return None

    def config(self) -> dict:
        """What compile chose for the kernel that its source does not say (an autotuned Triton kernel's
        configuration), for the reports: JSON values; empty when nothing was chosen."""
        return {}
