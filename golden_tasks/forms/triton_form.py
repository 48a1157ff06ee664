"""The third kernel form: Triton kernels, called by a launcher.

    @triton.jit
    def _double(X, Y, n, BLOCK: tl.constexpr): ...

    @triton_kernel
    def double(x: In, y: Out, *, BLOCK: int = 256, num_warps: int = 4):
        _double[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK, num_warps=num_warps)

The launcher's positional parameters carry In, Out, InOut and Scalar markers (the parameter table); its
keyword-only parameters are meta-parameters (block sizes, num_warps, num_stages), given by the case's
options (`Case(options={"BLOCK": 128})`), which enter the compile key.

Where it runs: on the GPU where one is visible; without one, under Triton's interpreter
(TRITON_INTERPRET=1) on CPU tensors ($TRITON_INTERPRET, when set, decides: toolchain.triton_interpreted). The
interpreter computes in numpy, which has no bfloat16: a bfloat16 `tl.dot` gives garbage with no error,
and libdevice calls fail. So a kernel whose jitted code or arguments hold bfloat16, or that calls
libdevice, is never run by the interpreter (`unfaithful`): its artifact is unavailable on CPU (the case
is SKIPPED with the reason) and runs on a GPU.

The artifact is the launcher pickled by value, every @triton.jit function it reaches pickled as its
Python function and jit options, made again by triton.jit where the artifact is loaded, in the mode
the artifact was compiled for (the mode is read when a function is decorated). An autotuned kernel
(triton.autotune) is pinned to one configuration at compile, recorded in the artifact and so in every
key downstream: its first, since the interpreter times nothing; tuning on the device is not done yet.
"""
import importlib.metadata
import importlib.util
import inspect
import io
import json
import linecache
import os
import re
import types
from pathlib import Path

import cloudpickle

from ..model.errors import CompileError, StageFailed
from ..model.origin import by_value, is_user_module
from ..model.specs import declared_params, dtype_name, table_of
from ..project.fingerprint import cell_filled
from ..project.toolchain import TRITON_INTERPRET_ENV, triton_interpreted, triton_settings
from .base import Artifact, KernelForm

JIT_OPTIONS = ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline")
NOT_META = ("backend", "ranks")  # the options every form receives
# what the interpreter gets wrong without an error (numpy has no bfloat16; libdevice is not emulated)
UNFAITHFUL = re.compile(r"\b(bfloat16|bf16|libdevice)\b")


def installed() -> str | None:
    """Triton's version, or None when the triton extra is not installed (nothing is imported)."""
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.metadata.version("triton")


def import_hint(exc: BaseException) -> str | None:
    """What to write instead, for the error a kernel module meets where Triton runs interpreted when it asks
    Triton's driver about the device as it is imported (Triton's tutorials do: `DEVICE =
    triton.runtime.driver.active.get_active_torch_device()`, autotune configurations from
    `get_current_target()`); None for any other error."""
    if installed() is None or not triton_interpreted() or "active drivers" not in str(exc):
        return None
    return ("Triton's interpreter (no GPU here) has no driver to ask: a launcher gets its tensors on the device "
            "they run on (x.device), golden_tasks.triton.DEVICE names it, and autotune configurations are listed "
            "as they are, not chosen by asking the driver (docs/triton.md)")


def _jitted(obj) -> bool:
    """Whether `obj` is one of Triton's kernel objects (@triton.jit, autotune, heuristics), by its class."""
    return type(obj).__module__.startswith("triton.runtime.") and hasattr(obj, "fn")


def reached(fn) -> list:
    """The @triton.jit functions (their Python functions) and the user functions that `fn` reaches
    through the names its code uses and its closure, `fn` first."""
    found, stack = {}, [fn]
    while stack:
        obj = stack.pop()
        while _jitted(obj):
            obj = obj.fn
        if not isinstance(obj, types.FunctionType) or id(obj) in found:
            continue
        found[id(obj)] = obj
        codes, names = [obj.__code__], set()
        while codes:
            code = codes.pop()
            names.update(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        stack += [obj.__globals__[n] for n in sorted(names) if n in obj.__globals__]
        stack += [c.cell_contents for c in obj.__closure__ or () if cell_filled(c)]
    return [f for f in found.values() if is_user_module(f.__module__)]


def unfaithful(launcher, specs: list) -> list:
    """What the interpreter would compute wrong without saying so: bfloat16 tensor arguments, and bfloat16 or
    libdevice named in the source of a function the launcher reaches."""
    found = [f"its argument {s.name!r} is bfloat16" for s in specs
             if not s.by_value and dtype_name(s.dtype) == "bfloat16"]
    for fn in reached(launcher):
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            found.append(f"the source of {fn.__qualname__} cannot be read")
            continue
        for n, line in enumerate(lines):
            code = line.split("#", 1)[0]
            if m := UNFAITHFUL.search(code):
                found.append(f"{fn.__qualname__} uses {m[1]} ({Path(inspect.getsourcefile(fn)).name}:{first + n})")
    return found


class TritonKernel(KernelForm):
    """A launcher of Triton kernels (see the module docstring)."""

    def __init__(self, fn, params: list = None):
        """`params`: the parameter table, where not the one `fn`'s annotations declare (a solution's: its problem's)."""
        self.fn = fn
        self.name = fn.__name__
        self._params = declared_params(fn, meta_keywords=True) if params is None else list(params)
        self.meta = {p.name: p.default for p in inspect.signature(fn).parameters.values()
                     if p.kind == p.KEYWORD_ONLY}

    def __call__(self, *args, **meta):
        return self.fn(*args, **meta)

    def __repr__(self):
        return f"<triton kernel {self.name}>"

    def __fingerprint__(self, fingerprinter) -> dict:
        """The launcher (and, through it, every @triton.jit function it reaches and their constants), its
        meta-parameters' defaults, Triton's version, whether it is interpreted here, and Triton's settings
        (toolchain.triton_settings: the precision of a float32 `tl.dot` among them)."""
        return {"launcher": fingerprinter.token(self.fn), "meta": fingerprinter.token(self.meta),
                "triton": installed(), "interpreted": triton_interpreted(), **triton_settings()}

    def __reduce__(self):
        """Crossing into another process (an isolated stage, a cluster node): the launcher as an artifact
        carries it, its Triton functions made again there in this process's mode."""
        return _rebuilt, (_dumps(self.fn, {}), triton_interpreted())

    def params(self) -> list:
        return list(self._params)

    def compile(self, specs, options, workdir):
        given = {k: v for k, v in options.items() if k not in NOT_META}
        if unknown := sorted(set(given) - set(self.meta)):
            raise CompileError(f"kernel {self.name}: option {unknown[0]!r} is not one of its meta-parameters "
                               f"({', '.join(self.meta) or 'it has none'}: its keyword-only parameters)")
        meta = {**self.meta, **given}
        if unset := [k for k, v in meta.items() if v is inspect.Parameter.empty]:
            raise CompileError(f"kernel {self.name}: meta-parameter {unset[0]!r} has no default and the case's "
                               "options do not give it")
        if odd := [k for k, v in meta.items() if v is not None and not isinstance(v, (bool, int, float, str))]:
            raise CompileError(f"kernel {self.name}: meta-parameter {odd[0]!r} is {meta[odd[0]]!r}: a constexpr is "
                               "None, a bool, an int, a float or a str")
        launch = {"device": "cpu" if triton_interpreted() else "cuda", "meta": meta, "unavailable": None, "pinned": {}}
        files = {}
        if installed() is None:
            launch["unavailable"] = ("a Triton kernel, and triton is not installed here "
                                     "(pip install 'golden-tasks[triton]')")
        elif launch["device"] == "cpu" and (found := unfaithful(self.fn, specs)):
            launch["unavailable"] = ("a Triton kernel that Triton's interpreter (no GPU here) would compute wrong "
                                     f"without an error: {'; '.join(found)}; it runs on a GPU")
        else:
            files["kernel.pkl"] = Path(workdir) / "kernel.pkl"
            files["kernel.pkl"].write_bytes(_dumps(self.fn, launch["pinned"]))
        files["launch.json"] = Path(workdir) / "launch.json"
        files["launch.json"].write_text(json.dumps(launch, sort_keys=True))
        return TritonArtifact(table_of(specs), files)


def triton_kernel(fn) -> TritonKernel:
    """Declare a Triton kernel by its launcher: `@triton_kernel` (one rank)."""
    return TritonKernel(fn)


def _rebuilt(launcher: bytes, interpreted: bool) -> TritonKernel:
    os.environ[TRITON_INTERPRET_ENV] = "1" if interpreted else "0"
    return TritonKernel(cloudpickle.loads(launcher))


class TritonArtifact(Artifact):
    """kernel.pkl (the launcher, see the module) and launch.json: the device it runs on, the meta-parameters,
    the configurations autotuned kernels are pinned to, or why it cannot run anywhere like this machine."""
    backend = "triton"

    def __init__(self, table, files):
        super().__init__(table, files)
        launch = json.loads(self.files["launch.json"].read_text())
        self.device, self.meta, self.pinned = launch["device"], launch["meta"], launch["pinned"]
        self._unavailable = launch["unavailable"]

    def unavailable(self):
        if self._unavailable:
            return self._unavailable
        if self.device == "cuda":
            import torch  # noqa: PLC0415

            if not torch.cuda.is_available():
                return "a Triton kernel compiled for a GPU, and no CUDA device here"
        return None

    def timing_caveat(self):
        return ("measured under Triton's interpreter (no GPU): not a performance figure"
                if self.device == "cpu" else None)

    def config(self):
        """The configuration each autotuned kernel was pinned to, by the kernel's name."""
        return {"pinned": self.pinned} if self.pinned else {}

    def load(self):
        if reason := self.unavailable():
            raise StageFailed(reason)
        os.environ[TRITON_INTERPRET_ENV] = "1" if self.device == "cpu" else "0"  # read as each function is re-made
        import triton.language as tl  # noqa: PLC0415

        if (type(tl.zeros).__name__ == "InterpretedFunction") != (self.device == "cpu"):
            raise StageFailed(f"this process imported triton {'without' if self.device == 'cpu' else 'with'} "
                              f"${TRITON_INTERPRET_ENV} before the artifact could say how it runs (on {self.device}): "
                              "Triton decides as it is imported whether its library functions are interpreted")
        launcher, meta = cloudpickle.loads(self.files["kernel.pkl"].read_bytes()), self.meta

        def call(*args):
            return launcher(*args, **meta)
        return call


def _dumps(launcher, pinned: dict) -> bytes:
    """The launcher by value, each Triton kernel object it reaches as (its function, its options), made
    again by `_rejit` when loaded; an autotuned one pinned to its first configuration (named in `pinned`)."""

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if not _jitted(obj):
                return super().reducer_override(obj)
            if hasattr(obj, "configs"):  # triton.autotune
                config = obj.configs[0].all_kwargs()  # its meta-parameters and launch options
                if callable(obj.configs[0].pre_hook):
                    raise CompileError(f"the first configuration of {_python(obj).__name__} has a pre_hook, which "
                                       "pinning a configuration does not run")
                pinned[_python(obj).__name__] = config
                return _Pinned, (obj.fn, config)
            if not isinstance(obj.fn, types.FunctionType):
                raise CompileError(f"{type(obj).__name__} around {_python(obj).__name__}: only triton.jit and "
                                   "triton.autotune are supported")
            options = obj.kwargs if hasattr(obj, "kwargs") else {k: getattr(obj, k) for k in JIT_OPTIONS}
            lines, first = inspect.getsourcelines(obj.fn)
            return _rejit, (obj.fn, {k: v for k, v in options.items() if k in JIT_OPTIONS and v is not None},
                            (obj.fn.__module__, first, lines))

    with by_value(), io.BytesIO() as out:
        Pickler(out).dump(launcher)
        return out.getvalue()


def _rejit(fn, options: dict, source: tuple):
    """triton.jit(fn) where the artifact is loaded, in the mode it was made for. Triton reads a function's
    source (the interpreter rewrites it, the compiler parses it): it is the one the artifact holds, under
    the name of the module it came from, marked as such (no file of that name is ever read for it)."""
    import triton  # noqa: PLC0415

    module, first, lines = source
    name = f"{module} (as compiled)"  # its module, not its path: the artifact is the same in any checkout
    known = list(linecache.cache[name][2]) if name in linecache.cache else []  # the file's other functions
    known += ["\n"] * (first - 1 + len(lines) - len(known))
    known[first - 1:first - 1 + len(lines)] = lines
    linecache.cache[name] = (sum(map(len, known)), None, known, name)
    fn.__code__ = fn.__code__.replace(co_filename=name)
    return triton.jit(fn, **options)


class _Pinned:
    """An autotuned kernel with its configuration fixed: launched as the kernel with the configuration's
    meta-parameters and launch options."""

    def __init__(self, kernel, config: dict):
        self.kernel, self.config = kernel, config

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, **kwargs, **self.config)


def _python(kernel):
    """The Python function under Triton's kernel objects."""
    while _jitted(kernel):
        kernel = kernel.fn
    return kernel
