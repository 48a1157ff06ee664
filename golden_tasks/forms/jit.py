"""The first kernel form: `@golden_tasks.jit` Python functions over torch ops.

The body writes its Out/InOut parameters in place. It is compiled for the spec
shapes (JIT specialisation) by a backend: `aoti` (torch.export, then
AOTInductor into a `.pt2` package, the default) or `eager` (no code
generation, for debugging). Scalars are specialised into the artifact as
constants; their values are part of the compile key.

A verifier checks what the kernel says, so `aoti` emulates the precision the
body is written in: Inductor would otherwise keep float16/bfloat16
intermediates of a fused expression in float32, and a kernel that accumulates
in half precision would pass compiled and fail under `eager`
(`options={"emulate_precision_casts": False}` compiles what is fastest instead).
"""
import contextlib
import tempfile
from pathlib import Path

import cloudpickle
import torch

from ..model.errors import CompileError
from ..model.origin import dumps_by_value
from ..model.plan import BACKENDS
from ..model.specs import declared_params, dtype_name, table_of
from .base import Artifact, KernelForm, world_size

DEFAULT_BACKEND = "aoti"
AOTI_DEFAULTS = {"emulate_precision_casts": True}  # Inductor configs; a case's options override them


class JitKernel(KernelForm):
    """`params`: the parameter table, where not the one `fn`'s annotations declare (a baseline's: its case's)."""

    def __init__(self, fn, backend=None, options=None, ranks=1, params=None):
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self.ranks = world_size(ranks, f"kernel {self.name}")
        self.backend = backend
        self.options = dict(options or {})
        self._params = declared_params(fn) if params is None else list(params)

    def __call__(self, *args):
        return self.fn(*args)

    def __repr__(self):
        return f"<jit kernel {self.name}>"

    def params(self) -> list:
        return list(self._params)

    def compile(self, specs, options, workdir):
        ranks = options.get("ranks", self.ranks)
        backend = options.get("backend") or self.backend or (DEFAULT_BACKEND if ranks == 1 else "eager")
        if backend not in BACKENDS:
            raise CompileError(f"kernel {self.name}: unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        if ranks == 1:  # a multi-rank body's collectives need its group: dispatch checks In tensors
            _check_writes(_unshared(self.fn), self.name, specs)
        merged = {**self.options, **{k: v for k, v in options.items() if k not in ("backend", "ranks")}}
        return Artifact.registry[backend].build(self.fn, specs, merged, Path(workdir))


def jit(fn=None, *, backend=None, options=None, ranks=1):
    """Declare a kernel: `@jit` or `@jit(backend="eager", options={...inductor configs}, ranks=2)`
    (`ranks`: the world size of a multi-rank kernel; see TensorSpec.resident)."""
    if fn is None:
        return lambda f: JitKernel(f, backend, options, ranks)
    return JitKernel(fn, backend, options, ranks)


def _args(specs, tensor_for):
    return [s.argument(tensor_for) for s in specs]


def _unshared(fn):
    """A copy of `fn` with copies of the user modules it reaches (unpickled by value), so that running
    it leaves no state behind in `fn`: a body that memoises on its first call (a table, a workspace)
    would otherwise keep a fake tensor of the write check and carry it into the artifact. `fn` itself
    where it cannot be pickled (aoti exports what the pickle could not hold)."""
    try:
        return cloudpickle.loads(dumps_by_value(fn))
    except Exception:  # noqa: BLE001 -- unpicklable state: the check runs on the kernel itself, as before
        return fn


def _check_writes(fn, name, specs):
    """A body that writes an In parameter or never writes an Out parameter is a compile error.

    Runs the body once on fake tensors (shapes only, no compute); a body with
    data-dependent control flow is run on real zero tensors instead.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    def versions_after(make):
        args = _args(specs, make)
        before = [a._version if isinstance(a, torch.Tensor) else None for a in args]
        fn(*args)
        return [None if b is None else a._version > b for a, b in zip(args, before)]

    try:
        with FakeTensorMode():
            written = versions_after(lambda s: torch.empty(s.shape, dtype=s.dtype))
    except Exception:  # noqa: BLE001 -- data-dependent ops cannot run on fake tensors
        try:
            written = versions_after(lambda s: torch.zeros(s.shape, dtype=s.dtype))
        except Exception as exc:
            raise CompileError(f"kernel {name}: body raised {type(exc).__name__}: {exc}") from exc
    for spec, w in zip(specs, written):
        if w is None:
            continue
        if spec.direction == "in" and w:
            raise CompileError(f"kernel {name}: writes its In parameter {spec.name!r}")
        if spec.direction == "out" and not w:
            raise CompileError(f"kernel {name}: never writes its Out parameter {spec.name!r}")


class _Call(torch.nn.Module):
    """Exportable wrapper: takes the tensors in spec order, scalars are constants."""

    def __init__(self, fn, specs):
        super().__init__()
        self.fn, self.specs = fn, specs

    def forward(self, *tensors):
        it = iter(tensors)
        self.fn(*_args(self.specs, lambda s: next(it)))
        return ()


@contextlib.contextmanager
def _as_pt2(path: Path):
    """`path` under a `.pt2` name while the block runs: the loader insists on the suffix, store objects are
    named by digest. The link sits in a directory of its own, removed afterwards, so concurrent loads never
    share a link and none is left behind: the loader has unpacked the package when it returns (torch's
    loader of a file object deletes its temporary copy at that point too)."""
    if path.suffix == ".pt2":
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="golden-tasks-pt2-") as links:
        link = Path(links) / "kernel.pt2"
        link.symlink_to(path.resolve())
        yield link


class AotiArtifact(Artifact):
    backend = "aoti"

    @classmethod
    def build(cls, fn, specs, options, workdir):
        example = tuple(torch.empty(s.shape, dtype=s.dtype) for s in specs if not s.by_value)  # _Call's tensors
        try:
            program = torch.export.export(_Call(fn, specs), example, strict=False)
            path = torch._inductor.aoti_compile_and_package(
                program, package_path=str(workdir / "kernel.pt2"), inductor_configs={**AOTI_DEFAULTS, **options})
        except Exception as exc:
            raise CompileError(f"AOTInductor failed for {fn.__name__}: {type(exc).__name__}: {exc}") from exc
        user_inputs = set(program.graph_signature.user_inputs)
        metas = [n.meta["val"] for n in program.graph.nodes if n.op == "placeholder" and n.name in user_inputs]
        table = table_of(specs, [(tuple(m.shape), dtype_name(m.dtype)) for m in metas])
        return cls(table, {"kernel.pt2": path})

    def load(self):
        with _as_pt2(self.files["kernel.pt2"]) as package:
            runner = torch._inductor.aoti_load_package(str(package))
        tensor_slots = [i for i, row in enumerate(self.table) if not row.by_value]

        def call(*args):
            runner(*[args[i] for i in tensor_slots])
        return call


class EagerArtifact(Artifact):
    backend = "eager"

    @classmethod
    def build(cls, fn, specs, options, workdir):
        path = workdir / "kernel.pkl"
        path.write_bytes(dumps_by_value(fn))  # an edit to the kernel or a helper changes the artifact
        return cls(table_of(specs), {"kernel.pkl": path})

    def load(self):
        return cloudpickle.loads(self.files["kernel.pkl"].read_bytes())
