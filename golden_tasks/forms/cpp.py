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
import tempfile
from pathlib import Path

import torch

from ..model.errors import CompileError, StageFailed
from ..model.hashing import digest_file
from ..model.specs import ScalarSpec, declared_params, dtype_name, dtype_of, table_of
from ..project.toolchain import compiler
from .base import Artifact, KernelForm, world_size

CXX_FLAGS = ("-O3", "-march=native", "-fopenmp")
CUDA_FLAGS = ("-O3",)
DIAGNOSTICS_CHARS = 6000  # the first errors are the useful ones; a template cascade can run to megabytes

SCALAR_CTYPES = {"int8": ctypes.c_int8, "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
                 "bool": ctypes.c_bool, "float32": ctypes.c_float, "float16": ctypes.c_uint16,
                 "bfloat16": ctypes.c_uint16}


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


def c_locale() -> dict:
    """The environment every compiler run gets: LC_ALL=C for plain ASCII English diagnostics
    (and a parsable `-E -v`), the same on every machine."""
    return {**os.environ, "LC_ALL": "C"}


@functools.cache
def system_dirs(compiler: tuple, cuda: bool) -> tuple:
    """The compiler's implicit `#include <...>` directories, resolved, as `-E -v` lists them
    (nvcc: its CUDA directories, then its host compiler's); () if it cannot run."""
    probe = ["-E", "-x", "cu", "-Xcompiler", "-v"] if cuda else ["-E", "-v", "-x", "c++"]
    try:
        out = subprocess.run([*compiler, *probe, os.devnull], capture_output=True, text=True, timeout=60,
                             check=False, env=c_locale())
    except (OSError, subprocess.TimeoutExpired):
        return ()
    dirs, listing = [], False
    for line in out.stderr.splitlines():
        if line.startswith("#include <...> search starts here:") or line.startswith("End of search list."):
            listing = line.startswith("#include")
        elif listing:
            dirs.append(Path(line.strip()).resolve())
    return tuple(dict.fromkeys(dirs))


_MAKE_WORD = re.compile(r"(\\+)([ \t])|\\#|\$\$|\s|.")


def prerequisites(rule: str) -> list:
    """The prerequisites of the make rule a compiler writes for `-M`/`-MD`: the words after the
    first ':' (the target, set by -MT, has none), split at white space and backslash-newlines.
    As in make, 2N+1 backslashes before a blank are N and a blank, 2N are N and a split;
    `\\#` is '#' and `$$` is '$' (nvcc writes both raw; only a name with "$$" would be misread,
    and a misread name is not a file, which the caller refuses)."""
    words, word = [], ""
    for m in _MAKE_WORD.finditer(rule.partition(":")[2].replace("\\\n", " ")):
        run, blank, text = m[1] or "", m[2], m[0]
        word += "\\" * (len(run) // 2)
        if blank and len(run) % 2:
            word += blank
        elif blank or text.isspace():
            words.append(word)
            word = ""
        else:
            word += {"\\#": "#", "$$": "$"}.get(text, text)
    return [w for w in [*words, word] if w]


class CppKernel(KernelForm):
    """A C++ or CUDA source exporting `symbol`, compiled with `flags` (see the module docstring)."""

    def __init__(self, fn, source, symbol=None, flags=None, cuda=None, ranks=1):
        self.name = fn.__name__
        self.ranks = world_size(ranks, f"kernel {self.name}")
        self.root = Path(inspect.getfile(fn)).resolve().parent
        self.source = self.root / source
        self.symbol = symbol or self.name
        self.cuda = self.source.suffix == ".cu" if cuda is None else bool(cuda)
        self.flags = tuple(flags) if flags is not None else CUDA_FLAGS if self.cuda else CXX_FLAGS
        self.compiler = ("nvcc",) if self.cuda else compiler()
        self._params = declared_params(fn, typed=True)

    def __repr__(self):
        return f"<cpp kernel {self.name} from {self.source}>"

    def __fingerprint__(self, fingerprinter) -> dict:
        """The digests of the source and of every header the compiler reports reading with the
        kernel's flags (`hashed_files`), named by their paths relative to the module (two
        checkouts of the same sources share the key) and recorded in `fingerprinter.files` (an
        edit re-plans); flags, symbol, signature and the compiler's identity. If the compiler
        cannot tell which headers it reads, the source alone and a `fingerprinter.volatile` entry:
        the plan then recomputes on every run, and compile fails with the compiler's message."""
        if not self.source.is_file():
            raise FileNotFoundError(f"kernel {self.name}: source {self.source} not found")
        files, unknown = self.hashed_files()
        if unknown:
            fingerprinter.volatile.append(f"kernel {self.name}: cannot tell which headers it reads: {unknown}")
        fingerprinter.files.update(str(f) for f in files)
        return {**{f"file {os.path.relpath(f, self.root)}": digest_file(f) for f in files},
                "flags": list(self.flags), "symbol": self.symbol, "params": [p.to_json() for p in self._params],
                "cuda": self.cuda, "compiler": compiler_identity(self.compiler)}

    def hashed_files(self) -> tuple[list, str | None]:
        """The files the fingerprint hashes and, if the compiler could not tell them, why.

        They are what the compiler itself reports reading when it preprocesses the source with
        the kernel's flags, in the module's directory, as compile runs it: the source, `-include`
        files and every header found through -I, -iquote, -isystem or a computed `#include
        MACRO`, transitively, wherever they are. Left out: files under the compiler's implicit
        directories (`system_dirs`), such as <vector>, <omp.h>, <cuda_runtime.h>. They are the
        toolchain's, which every key names by the compilers' versions; hashing them by path would
        tie keys to where the machine installs them and to the module's depth below /, so two
        checkouts would no longer share keys. The price: a system header changed without a
        compiler version change (a libc or CUDA update) is not seen. If the compiler cannot tell
        (not installed, a missing header, any preprocessor error): the source alone, and why."""
        try:
            with tempfile.TemporaryDirectory(prefix="golden-deps-") as tmp:
                deps = Path(tmp) / "kernel.d"
                self._run(self.command(self.flags, None, deps))
                return self._read(deps), None
        except CompileError as exc:
            lines = str(exc).splitlines()  # a failed run: its command, then its first diagnostic
            return [self.source.resolve()], lines[min(1, len(lines) - 1)]

    def params(self) -> list:
        return list(self._params)

    def command(self, flags, out: Path | None, deps: Path) -> list:
        """The compile command building `out`, or with out=None the preprocessor alone (-M); both
        write to `deps` the make rule of the files they read."""
        pic = ["-Xcompiler", "-fPIC"] if self.cuda else ["-fPIC"]
        build = ["-M"] if out is None else ["-MD", "-o", str(out)]
        return [*self.compiler, "-shared", *pic, *flags, *build, "-MF", str(deps), "-MT", "kernel", str(self.source)]

    def _run(self, cmd):
        """Run a compiler command as compile does; CompileError with its diagnostics if it fails."""
        try:
            proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, check=False, env=c_locale())
        except OSError as exc:
            raise CompileError(f"cannot run {shlex.join(cmd)}: {exc}") from None
        if proc.returncode:
            text = (proc.stderr + proc.stdout).strip()
            cut = f"\n... ({len(text) - DIAGNOSTICS_CHARS} more characters)" if len(text) > DIAGNOSTICS_CHARS else ""
            raise CompileError(f"{shlex.join(cmd)}\n{text[:DIAGNOSTICS_CHARS]}{cut}")

    def _read(self, deps: Path) -> list:
        """The files a dependency rule names, resolved, minus those under the system directories."""
        files = [(self.root / name).resolve() for name in prerequisites(os.fsdecode(deps.read_bytes()))]
        missing = next((f for f in files if not f.is_file()), None)
        if missing:
            raise CompileError(f"the compiler reports reading {missing}, which is not a file")
        system = system_dirs(self.compiler, self.cuda)
        return list(dict.fromkeys(f for f in files if not any(f.is_relative_to(d) for d in system)))

    def compile(self, specs, options, workdir):
        """Build workdir/kernel.so with `options["flags"]` if given, else the kernel's flags.

        The key follows the headers read with the kernel's own flags: if other flags make the
        compiler read a project header that the key does not follow, the build is refused."""
        declared = {p.name: p.dtype for p in self._params}
        for s in specs:
            if s.name in declared and dtype_name(s.dtype) != declared[s.name]:
                raise CompileError(f"kernel {self.name}: parameter {s.name!r} is declared {declared[s.name]}, "
                                   f"spec has {dtype_name(s.dtype)}")
        workdir = Path(workdir)
        flags = options.get("flags", self.flags)
        self._run(self.command(flags, workdir / "kernel.so", workdir / "kernel.d"))
        hashed = set(self.hashed_files()[0])
        unhashed = [f for f in self._read(workdir / "kernel.d") if f not in hashed]
        if unhashed:
            raise CompileError(f"kernel {self.name}: with flags {shlex.join(flags)} the compiler reads "
                               f"{os.path.relpath(unhashed[0], self.root)}, which the cache key does not follow "
                               f"(it follows the headers read with the kernel's own flags, "
                               f"{shlex.join(self.flags)}): declare these flags in @cpp(flags=...)")
        call = {"symbol": self.symbol, "device": "cuda" if self.cuda else "cpu"}
        (workdir / "call.json").write_text(json.dumps(call))
        return CppArtifact(table_of(specs), {"kernel.so": workdir / "kernel.so", "call.json": workdir / "call.json"})


def cpp(source, symbol=None, flags=None, cuda=None, ranks=1):
    """Declare a C++ (or, for `.cu` sources or cuda=True, CUDA) kernel on a typed stub:
    `@cpp("cpp/k.cpp", flags=("-O2",))`. `flags` default to CXX_FLAGS or CUDA_FLAGS; `ranks` is
    the world size of a multi-rank kernel."""
    return lambda fn: CppKernel(fn, source, symbol, flags, cuda, ranks)


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
        fn.argtypes = [SCALAR_CTYPES[r.dtype] if r.by_value else ctypes.c_void_p for r in self.table]
        fn.restype = None
        expected = [(r, (dtype_of(r.dtype), r.shape, self.device, True)) for r in self.table]

        def call(*args):
            if len(args) != len(expected):
                raise TypeError(f"kernel {self.symbol} takes {len(expected)} arguments, got {len(args)}")
            fn(*[_c_arg(row, want, arg) for (row, want), arg in zip(expected, args)])
        return call


def _c_arg(row, want, arg):
    """The ctypes argument for one table row; a tensor that the C code would misread is refused."""
    if row.by_value:
        return c_scalar(arg, row.dtype, row.name)
    if not isinstance(arg, torch.Tensor):
        raise TypeError(f"parameter {row.name!r}: expected a tensor, got {type(arg).__name__}")
    got = (arg.dtype, tuple(arg.shape), arg.device.type, arg.is_contiguous())
    if got != want:
        raise ValueError(f"parameter {row.name!r}: the kernel takes {_describe(*want)}, got {_describe(*got)}")
    return arg.data_ptr()


def _describe(dtype, shape, device, contiguous) -> str:
    layout = "contiguous" if contiguous else "non-contiguous"
    return f"a {layout} {dtype_name(dtype)} tensor of shape {tuple(shape)} on {device}"
