"""The second kernel form: C++ and CUDA sources compiled to a shared library, called through a C ABI.

    @cpp("cpp/axpy.cpp")
    def axpy(x: In[torch.float32], y: InOut[torch.float32], alpha: Scalar[torch.float32], n: Scalar[torch.int64]): ...

The Python function is a stub: its typed markers declare the signature, since a
C signature cannot say In from Out. The source (relative to the stub's module)
exports `extern "C" void <symbol>(...)` taking, in parameter order, a pointer
per tensor (its data: contiguous, of the declared dtype, on the artifact's
device) and per scalar the C type of its dtype: int8_t, int32_t, int64_t,
uint8_t, bool, float, and uint16_t holding the bit pattern for float16 and
bfloat16 (a _Float16 argument travels in another register class, so the bit
pattern is the only portable ABI). A CUDA symbol is a host function that
launches its kernels; its pointers are device pointers.
"""
import ctypes
import functools
import inspect
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import torch

from .errors import CompileError, StageFailed
from .forms import Artifact, KernelForm
from .hashing import digest_file
from .specs import ScalarSpec, declared_params, dtype_name, dtype_of, table_of

CXX_FLAGS = ("-O3", "-march=native", "-fopenmp")
CUDA_FLAGS = ("-O3",)
DIAGNOSTICS_CHARS = 6000  # the first errors are the useful ones; a template cascade can run to megabytes

SCALAR_CTYPES = {"int8": ctypes.c_int8, "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
                 "bool": ctypes.c_bool, "float32": ctypes.c_float, "float16": ctypes.c_uint16,
                 "bfloat16": ctypes.c_uint16}

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)


@functools.lru_cache(maxsize=1024)  # per call otherwise: checking a value costs more than a small kernel
def c_scalar(value, dtype: str, name: str = "scalar"):
    """`value` as the ctypes argument for a scalar of dtype name `dtype`, checked for type and
    range as a ScalarSpec is (SpecError, a ValueError, naming `name`). Half types carry their
    bit pattern, rounded by torch exactly as the golden's copy of the value is."""
    spec = ScalarSpec(name, dtype_of(dtype), value)
    if dtype in ("float16", "bfloat16"):
        return ctypes.c_uint16(spec.tensor.view(torch.int16).item() & 0xFFFF)
    return SCALAR_CTYPES[dtype](spec.value)


@functools.cache
def compiler_identity(compiler: tuple) -> str:
    """`compiler --version`'s whole output (nvcc names its release only on its last lines)."""
    try:
        out = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"
    return out.stdout.strip()


def include_dirs(flags, root: Path) -> list:
    """The -I directories of `flags`, relative to `root` (where the compiler runs)."""
    dirs, flags = [], list(flags)
    for i, flag in enumerate(flags):
        if flag == "-I" and i + 1 < len(flags):
            dirs.append(root / flags[i + 1])
        elif flag.startswith("-I") and flag != "-I":
            dirs.append(root / flag[2:])
    return dirs


def sources(source: Path, dirs: list) -> list:
    """`source` and every header it includes, transitively, that exists outside the system:
    "x.h" relative to the including file, then in `dirs`; <x.h> in `dirs`. Every #if branch is
    followed (a superset is safe); a computed `#include MACRO` is not."""
    seen, todo = [], [source.resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for quote, name in _INCLUDE.findall(path.read_bytes()):
            bases = ([path.parent] if quote == b'"' else []) + dirs
            found = next((base / name.decode() for base in bases if (base / name.decode()).is_file()), None)
            if found:
                todo.append(found.resolve())
    return seen


class CppKernel(KernelForm):
    """A C++ or CUDA source exporting `symbol`, compiled with `flags` (see the module docstring)."""

    def __init__(self, fn, source, symbol=None, flags=None, cuda=None):
        self.name = fn.__name__
        self.root = Path(inspect.getfile(fn)).resolve().parent
        self.source = self.root / source
        self.symbol = symbol or self.name
        self.cuda = self.source.suffix == ".cu" if cuda is None else bool(cuda)
        self.flags = tuple(flags) if flags is not None else CUDA_FLAGS if self.cuda else CXX_FLAGS
        self.compiler = ("nvcc",) if self.cuda else tuple(shlex.split(os.environ.get("CXX", "c++")))
        self._params = declared_params(fn, typed=True)

    def __repr__(self):
        return f"<cpp kernel {self.name} from {self.source}>"

    def __fingerprint__(self, fingerprinter) -> dict:
        """Every source file's digest (recorded in `fingerprinter.files`, so that an edit re-plans),
        flags, symbol, signature and the compiler's identity. Paths are relative to the module:
        two checkouts of the same sources share the key."""
        if not self.source.is_file():
            raise FileNotFoundError(f"kernel {self.name}: source {self.source} not found")
        files = sources(self.source, include_dirs(self.flags, self.root))
        fingerprinter.files.update(str(f) for f in files)
        return {**{f"file {os.path.relpath(f, self.root)}": digest_file(f) for f in files},
                "flags": list(self.flags), "symbol": self.symbol, "params": self._params, "cuda": self.cuda,
                "compiler": compiler_identity(self.compiler)}

    def params(self) -> list:
        return [dict(row) for row in self._params]

    def command(self, flags, out: Path) -> list:
        pic = ["-Xcompiler", "-fPIC"] if self.cuda else ["-fPIC"]
        return [*self.compiler, "-shared", *pic, *flags, "-o", str(out), str(self.source)]

    def compile(self, specs, options, workdir):
        """Build workdir/kernel.so with `options["flags"]` if given, else the kernel's flags."""
        declared = {p["name"]: p["dtype"] for p in self._params}
        for s in specs:
            if s.name in declared and dtype_name(s.dtype) != declared[s.name]:
                raise CompileError(f"kernel {self.name}: parameter {s.name!r} is declared {declared[s.name]}, "
                                   f"spec has {dtype_name(s.dtype)}")
        workdir = Path(workdir)
        cmd = self.command(options.get("flags", self.flags), workdir / "kernel.so")
        try:  # LC_ALL=C: diagnostics in plain ASCII and English, the same on every machine
            proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, check=False,
                                  env={**os.environ, "LC_ALL": "C"})
        except OSError as exc:
            raise CompileError(f"kernel {self.name}: cannot run {shlex.join(cmd)}: {exc}") from None
        if proc.returncode:
            text = (proc.stderr + proc.stdout).strip()
            cut = f"\n... ({len(text) - DIAGNOSTICS_CHARS} more characters)" if len(text) > DIAGNOSTICS_CHARS else ""
            raise CompileError(f"{shlex.join(cmd)}\n{text[:DIAGNOSTICS_CHARS]}{cut}")
        call = {"symbol": self.symbol, "device": "cuda" if self.cuda else "cpu"}
        (workdir / "call.json").write_text(json.dumps(call))
        table = table_of(specs, [(s.shape, dtype_name(s.dtype)) for s in specs if s.kind == "tensor"])
        return CppArtifact(table, {"kernel.so": workdir / "kernel.so", "call.json": workdir / "call.json"})


def cpp(source, symbol=None, flags=None, cuda=None):
    """Declare a C++ (or, for `.cu` sources or cuda=True, CUDA) kernel on a typed stub:
    `@cpp("cpp/k.cpp", flags=("-O2",))`. `flags` default to CXX_FLAGS or CUDA_FLAGS."""
    return lambda fn: CppKernel(fn, source, symbol, flags, cuda)


class CppArtifact(Artifact):
    """kernel.so plus call.json ({"symbol", "device"}): everything a call needs is in its files."""
    backend = "cpp"

    def __init__(self, table, files):
        super().__init__(table, files)
        call = json.loads(self.files["call.json"].read_text())
        self.symbol, self.device = call["symbol"], call["device"]

    def unavailable(self):
        if self.device == "cuda" and not torch.cuda.is_available():
            return "a CUDA kernel and no CUDA device here: dispatch, validate and bench need a GPU"
        return None

    def load(self):
        if self.device == "cuda" and not torch.cuda.is_available():
            raise StageFailed(f"kernel {self.symbol} is a CUDA kernel and CUDA is not available here")
        # dlopen ignores the suffix; store objects are named by content, so a path never changes meaning
        try:
            fn = getattr(ctypes.CDLL(str(self.files["kernel.so"])), self.symbol)
        except (OSError, AttributeError) as exc:
            raise StageFailed(f"cannot load {self.symbol!r} (is it extern \"C\"?): {exc}") from None
        fn.argtypes = [ctypes.c_void_p if r["kind"] == "tensor" else SCALAR_CTYPES[r["dtype"]] for r in self.table]
        fn.restype = None
        expected = [(r, (dtype_of(r["dtype"]), r["shape"], self.device, True)) for r in self.table]

        def call(*args):
            if len(args) != len(expected):
                raise TypeError(f"kernel {self.symbol} takes {len(expected)} arguments, got {len(args)}")
            fn(*[_c_arg(row, want, arg) for (row, want), arg in zip(expected, args)])
        return call


def _c_arg(row, want, arg):
    """The ctypes argument for one table row; a tensor that the C code would misread is refused."""
    if row["kind"] == "scalar":
        return c_scalar(arg, row["dtype"], row["name"])
    if not isinstance(arg, torch.Tensor):
        raise TypeError(f"parameter {row['name']!r}: expected a tensor, got {type(arg).__name__}")
    got = (arg.dtype, list(arg.shape), arg.device.type, arg.is_contiguous())
    if got != want:
        raise ValueError(f"parameter {row['name']!r}: the kernel takes {_describe(*want)}, got {_describe(*got)}")
    return arg.data_ptr()


def _describe(dtype, shape, device, contiguous) -> str:
    layout = "contiguous" if contiguous else "non-contiguous"
    return f"a {layout} {dtype_name(dtype)} tensor of shape {tuple(shape)} on {device}"
