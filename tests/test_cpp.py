"""The C++/CUDA kernel form: typed markers, scalar ABI, compiling, calling, fingerprints, the pipeline."""
import ctypes
import importlib
import inspect
import shutil
import sys
import textwrap

import pytest
import torch

import golden_tasks
from golden_tasks import CompileError, In, Out, Scalar, ScalarSpec, SpecError, TensorSpec, cpp
from golden_tasks.forms.base import Artifact
from golden_tasks.forms.cpp import (
    CppArtifact,
    c_scalar,
    prerequisites,
)
from golden_tasks.model.errors import StageFailed
from golden_tasks.model.rows import ParamRow
from golden_tasks.project.fingerprint import Fingerprinter
from golden_tasks.project.fingerprint_parts import parts
from golden_tasks.stages import abi

pytestmark = pytest.mark.usefixtures("calibrated")  # golden_tasks.run measures no machine

F32, I64 = torch.float32, torch.int64
HALF_MAX, BF16_MAX = torch.finfo(torch.float16).max, torch.finfo(torch.bfloat16).max

AXPY = """\
#include <cstdint>
#include "common/scale.h"

extern "C" void axpy(const float* x, float* y, float alpha, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += scale(alpha) * x[i];
}
"""
SCALE_H = "#pragma once\nstatic inline float scale(float a) { return a; }\n"
MODULE = """\
import torch
from golden_tasks import In, InOut, Scalar, cpp

@cpp("axpy.cpp")
def axpy(x: In[torch.float32], y: InOut[torch.float32], alpha: Scalar[torch.float32], n: Scalar[torch.int64]): ...
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A kernel module `cppmod{N}` with axpy.cpp and common/scale.h beside it, imported fresh."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "common").mkdir()
    counter = iter(range(1000))

    def _load(source=AXPY, header=SCALE_H, module=MODULE):
        (tmp_path / "axpy.cpp").write_text(source)
        (tmp_path / "common" / "scale.h").write_text(header)
        name = f"cppmod{next(counter)}"
        (tmp_path / f"{name}.py").write_text(module)
        importlib.invalidate_caches()
        return importlib.import_module(name)
    yield _load
    for name in [n for n in sys.modules if n.startswith("cppmod")]:
        del sys.modules[name]


def axpy_specs(n=10):
    return [TensorSpec("x", (n,), F32, init_value=torch.randn), TensorSpec("y", (n,), F32, init_value=torch.randn),
            ScalarSpec("alpha", F32, 0.5), ScalarSpec("n", I64, n)]


def stamped(kernel, specs):
    return [s.stamped(p.direction) for s, p in zip(specs, kernel.params())]


@pytest.mark.parametrize(("value", "dtype", "ctype", "expected"), [
    (-128, "int8", ctypes.c_int8, -128), (127, "int8", ctypes.c_int8, 127),
    (-2**31, "int32", ctypes.c_int32, -2**31), (2**31 - 1, "int32", ctypes.c_int32, 2**31 - 1),
    (-2**63, "int64", ctypes.c_int64, -2**63), (2**63 - 1, "int64", ctypes.c_int64, 2**63 - 1),
    (0, "uint8", ctypes.c_uint8, 0), (255, "uint8", ctypes.c_uint8, 255),
    (True, "bool", ctypes.c_bool, True), (False, "bool", ctypes.c_bool, False),
    (-1.5, "float32", ctypes.c_float, -1.5), (3, "float32", ctypes.c_float, 3.0),
    (-1.5, "float16", ctypes.c_uint16, 0xBE00), (1.0, "float16", ctypes.c_uint16, 0x3C00),
    (HALF_MAX, "float16", ctypes.c_uint16, 0x7BFF), (-HALF_MAX, "float16", ctypes.c_uint16, 0xFBFF),
    (2**-24, "float16", ctypes.c_uint16, 0x0001), (-0.0, "float16", ctypes.c_uint16, 0x8000),
    (float("-inf"), "float16", ctypes.c_uint16, 0xFC00),
    (-1.5, "bfloat16", ctypes.c_uint16, 0xBFC0), (1.0, "bfloat16", ctypes.c_uint16, 0x3F80),
    (BF16_MAX, "bfloat16", ctypes.c_uint16, 0x7F7F), (-BF16_MAX, "bfloat16", ctypes.c_uint16, 0xFF7F),
    (1 / 3, "bfloat16", ctypes.c_uint16, 0x3EAB),  # rounded to nearest (0x3EAAAAAB), not truncated
])
def test_scalar_encoding(value, dtype, ctype, expected):
    arg = c_scalar(value, dtype)
    assert type(arg) is ctype
    assert arg.value == expected


@pytest.mark.parametrize(("value", "dtype"), [(128, "int8"), (-129, "int8"), (-1, "uint8"), (256, "uint8"),
                                              (2**31, "int32"), (2**63, "int64"), (1.5, "int32"), (1, "bool"),
                                              (1e39, "float32"), (70000.0, "float16"), (1e39, "bfloat16")])
def test_scalar_out_of_range_or_wrong_type_is_refused(value, dtype):
    with pytest.raises(SpecError, match="scalar 'eps'"):
        c_scalar(value, dtype, "eps")


def test_typed_markers():
    assert In[F32].dtype == "float32" and repr(Out[torch.bfloat16]) == "Out[bfloat16]"
    assert In.dtype is None and repr(In) == "In"  # typing makes a copy
    assert Scalar[I64] == Scalar[torch.int64] != Scalar
    with pytest.raises(TypeError, match="takes a torch.dtype"):
        In["float32"]
    with pytest.raises(TypeError, match=r"Scalar\[\.\.\.\] takes one of int8"):
        Scalar[torch.complex64]


def test_decorator_is_not_shadowed_by_its_submodule():
    assert inspect.isfunction(golden_tasks.cpp) and golden_tasks.cpp is cpp


@pytest.mark.parametrize("annotation", ["n: Scalar", "n"])
def test_untyped_parameter_is_rejected(annotation):
    namespace = {"cpp": cpp, "In": In, "Scalar": Scalar, "torch": torch}
    with pytest.raises(TypeError, match="kernel k: parameter 'n' needs a typed annotation such as In"):
        exec(f"@cpp('k.cpp')\ndef k(x: In[torch.float32], {annotation}): ...", namespace)


def test_declared_dtypes_are_checked_by_abi_and_compile(project, tmp_path):
    kernel = project().axpy
    assert kernel.params()[0] == ParamRow("x", "tensor", "in", "float32")
    specs = axpy_specs()
    specs[0] = TensorSpec("x", (10,), torch.float64)
    assert abi.problems(kernel.params(), [s.signature for s in specs]) == ["parameter 'x': kernel expects dtype float32, spec has float64"]
    with pytest.raises(CompileError, match="parameter 'x' is declared float32, spec has float64"):
        kernel.compile(stamped(kernel, specs), {}, tmp_path)


def test_compiler_error_is_the_command_and_its_diagnostics(project, tmp_path):
    kernel = project(source='extern "C" void axpy() {\n  int x = 1;\n  x += 1\n}\n').axpy
    with pytest.raises(CompileError) as info:
        kernel.compile(stamped(kernel, axpy_specs()), {}, tmp_path)
    message = str(info.value)
    assert message.splitlines()[0].endswith(f"-shared -fPIC -O3 -march=native -fopenmp -MD -o {tmp_path}/kernel.so "
                                            f"-MF {tmp_path}/kernel.d -MT kernel {tmp_path}/axpy.cpp")
    assert "axpy.cpp:3:9: error: expected ';' before '}' token" in message and "Traceback" not in message


def test_compile_restore_and_call(project, tmp_path):
    kernel = project().axpy
    (tmp_path / "build").mkdir()
    built = kernel.compile(stamped(kernel, axpy_specs()), {}, tmp_path / "build")
    assert built.backend == "cpp" and built.device == "cpu" and built.symbol == "axpy"
    assert built.table == [
        ParamRow("x", "tensor", "in", "float32", (10,)), ParamRow("y", "tensor", "inout", "float32", (10,)),
        ParamRow("alpha", "scalar", "in", "float32", (), 0.5), ParamRow("n", "scalar", "in", "int64", (), 10)]
    objects = {}  # store objects: named by digest, no suffix
    for name, path in built.files.items():
        objects[name] = tmp_path / f"object-{name.split('.')[-1]}"
        shutil.copy(path, objects[name])
    call = Artifact.restore("cpp", built.table, objects, "golden_tasks.forms.cpp").load()
    x, y = torch.randn(10), torch.randn(10)
    expected = y + 0.5 * x
    call(x, y, 0.5, 10)
    torch.testing.assert_close(y, expected)
    with pytest.raises(ValueError, match=r"parameter 'x': the kernel takes a contiguous float32 tensor of shape "
                                         r"\(10,\) on cpu, got a contiguous float64 tensor of shape \(10,\) on cpu"):
        call(x.double(), y, 0.5, 10)
    with pytest.raises(ValueError, match="parameter 'y': .* got a non-contiguous float32 tensor of shape"):
        call(x, torch.randn(20)[::2], 0.5, 10)
    with pytest.raises(ValueError, match="parameter 'x': .* got a contiguous float32 tensor of shape \\(11,\\)"):
        call(torch.randn(11), y, 0.5, 10)
    with pytest.raises(SpecError, match="scalar 'n'"):
        call(x, y, 0.5, 2**63)


def test_every_scalar_type_crosses_the_abi(tmp_path, monkeypatch):
    """Register classes differ (float in an XMM register, halves as uint16_t bits): each value arrives intact."""
    (tmp_path / "echo.cpp").write_text(textwrap.dedent("""\
        #include <cstdint>
        extern "C" void echo(int8_t a, int32_t b, int64_t c, uint8_t d, bool e, float f, uint16_t g, uint16_t h,
                             double* out) {
            out[0] = a; out[1] = b; out[2] = c; out[3] = d; out[4] = e; out[5] = f; out[6] = g; out[7] = h;
        }
        """))
    (tmp_path / "echomod.py").write_text(textwrap.dedent("""\
        import torch
        from golden_tasks import Out, Scalar, cpp

        @cpp("echo.cpp", flags=("-O1",))
        def echo(a: Scalar[torch.int8], b: Scalar[torch.int32], c: Scalar[torch.int64], d: Scalar[torch.uint8],
                 e: Scalar[torch.bool], f: Scalar[torch.float32], g: Scalar[torch.float16],
                 h: Scalar[torch.bfloat16], out: Out[torch.float64]): ...
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "echomod", raising=False)
    kernel = importlib.import_module("echomod").echo
    values = [-7, -100000, -2**40, 200, True, -2.25, -1.5, -1.5]
    specs = [ScalarSpec(n, getattr(torch, t), v) for n, t, v in
             zip("abcdefgh", ("int8", "int32", "int64", "uint8", "bool", "float32", "float16", "bfloat16"), values)]
    specs.append(TensorSpec("out", (8,), torch.float64))
    out = torch.zeros(8, dtype=torch.float64)
    kernel.compile(stamped(kernel, specs), {}, tmp_path).load()(*values, out)
    assert out.tolist() == [-7, -100000, -2**40, 200, 1, -2.25, 0xBE00, 0xBFC0]


def test_fingerprint_follows_the_source_and_its_headers(project, tmp_path):
    def fingerprinted(**edits):
        fp = Fingerprinter()
        return fp(project(**edits).axpy), fp.files
    base, files = fingerprinted()
    assert files == {str(tmp_path / "axpy.cpp"), str(tmp_path / "common" / "scale.h")}
    assert fingerprinted()[0] == base
    assert fingerprinted(source=AXPY.replace("+=", "-="))[0] != base
    assert fingerprinted(header=SCALE_H.replace("return a;", "return 2 * a;"))[0] != base
    assert fingerprinted(module=MODULE.replace('"axpy.cpp"', '"axpy.cpp", flags=("-O1",)'))[0] != base
    assert fingerprinted(module=MODULE.replace("n: Scalar[torch.int64]", "n: Scalar[torch.int32]"))[0] != base
    assert set(parts(project().axpy)) == {"file axpy.cpp", "file common/scale.h", "flags", "symbol", "params",
                                           "cuda", "compiler"}


# A header reached by each way the preprocessor finds one, and how the source reaches it.
HEADERS = {"-include": "pre/pre.h", "-isystem": "sys/s.h", "-iquote": "quote/q.h", "-I": "inc/i.h",
           "#include MACRO": "computed.h", "a header's #include, a name with a space": "inc/nested header.h"}
SEARCHED = '#include <vector>\n#include <omp.h>\n#include "q.h"\n#include <s.h>\n#include <i.h>\n' \
           '#define HEADER "computed.h"\n#include HEADER\n' + AXPY
SEARCH_FLAGS = '("-O1", "-fopenmp", "-include", "pre/pre.h", "-isystem", "sys", "-iquote", "quote", "-Iinc")'


@pytest.fixture
def searching(project, tmp_path):
    """axpy including a header through each of HEADERS, compiled with SEARCH_FLAGS; unrelated.h beside it."""
    for name in [*HEADERS.values(), "unrelated.h"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(f"#pragma once\n// {name}\n")  # GCC skips a #pragma once file that equals one read
    (tmp_path / "inc" / "i.h").write_text('#pragma once\n#include "nested header.h"\n')
    return project(source=SEARCHED, module=MODULE.replace('"axpy.cpp"', f'"axpy.cpp", flags={SEARCH_FLAGS}')).axpy


def test_fingerprint_hashes_what_the_compiler_reads_and_no_system_header(searching, tmp_path):
    fp = Fingerprinter()
    base = fp(searching)
    expected = {"axpy.cpp", "common/scale.h", *HEADERS.values()}
    assert fp.files == {str(tmp_path / f) for f in expected} and not fp.volatile
    # <vector>, <omp.h> and the implicit <stdc-predef.h> are the toolchain's: not in the token
    assert {k for k in parts(searching) if k.startswith("file ")} == {f"file {f}" for f in expected}
    (tmp_path / "unrelated.h").write_text("#error not included\n")
    assert Fingerprinter()(searching) == base


@pytest.mark.parametrize("reached_by", HEADERS)
def test_editing_a_header_changes_the_fingerprint(searching, tmp_path, reached_by):
    base = Fingerprinter()(searching)
    with (tmp_path / HEADERS[reached_by]).open("a") as f:
        f.write("static const int edited = 1;\n")
    assert Fingerprinter()(searching) != base


def test_dependency_rules_are_parsed_as_make_reads_them():
    rule = "kernel : a.cpp x\\ y.h h\\#a$$b.h \\\n  two\\\\\\ slashes.h ends\\\\ next.h\tc\\d.h\n"
    assert prerequisites(rule) == ["a.cpp", "x y.h", "h#a$b.h", "two\\ slashes.h", "ends\\", "next.h", "c\\d.h"]


@pytest.mark.e2e
@pytest.mark.parametrize("broken", ["compiler", "header"])
def test_unknown_headers_make_a_volatile_fingerprint_and_a_compile_error(project, tmp_path, monkeypatch, broken):
    if broken == "compiler":
        monkeypatch.setenv("CXX", "no-such-compiler-gt")
        kernel, message = project().axpy, "cannot run no-such-compiler-gt -shared"
    else:
        kernel = project(source=AXPY.replace("common/scale.h", "common/nowhere.h")).axpy
        message = "fatal error: common/nowhere.h: No such file or directory"
    fp = Fingerprinter()
    fp(kernel)
    assert fp.files == {str(tmp_path / "axpy.cpp")}
    assert len(fp.volatile) == 1 and fp.volatile[0].startswith("kernel axpy: cannot tell which headers it reads: ")
    assert message in fp.volatile[0]
    result = golden_tasks.run(fn=kernel, specs=axpy_specs, golden=golden_axpy)
    assert not result.passed and result.stages["compile"] == "FAILED"
    assert message in result.error and "Traceback" not in result.error


def test_flags_override_reaching_an_unhashed_header_is_refused(project, tmp_path):
    (tmp_path / "alt").mkdir()
    (tmp_path / "alt" / "scale.h").write_text(SCALE_H.replace("return a;", "return 2 * a;"))
    kernel = project(source=AXPY.replace('"common/scale.h"', "<scale.h>"),
                     module=MODULE.replace('"axpy.cpp"', '"axpy.cpp", flags=("-O1", "-Icommon")')).axpy
    specs = stamped(kernel, axpy_specs())
    kernel.compile(specs, {"flags": ["-O2", "-Icommon"]}, tmp_path)  # other flags, the same headers
    with pytest.raises(CompileError, match=r"^kernel axpy: with flags -O1 -Ialt the compiler reads alt/scale\.h, "
                                           r"which the cache key does not follow .*in @cpp\(flags=\.\.\.\)$"):
        kernel.compile(specs, {"flags": ["-O1", "-Ialt"]}, tmp_path)


def test_missing_source_fails_the_plan(project, tmp_path):
    kernel = project(module=MODULE.replace('"axpy.cpp"', '"nowhere.cpp"')).axpy
    with pytest.raises(FileNotFoundError, match="kernel axpy: source .*nowhere.cpp not found"):
        Fingerprinter()(kernel)


def golden_axpy(t):
    t["y"].add_(t["alpha"] * t["x"])


@pytest.mark.e2e
def test_run_end_to_end_and_per_case_flags(project):
    kernel = project().axpy
    result = golden_tasks.run(fn=kernel, specs=axpy_specs, golden=golden_axpy, rtol=1e-6, atol=1e-6, rounds=3)
    assert result.passed, result.error
    again = golden_tasks.run(fn=kernel, specs=axpy_specs, golden=golden_axpy, rtol=1e-6, atol=1e-6, rounds=3)
    assert again.stages["compile"] == "cached"
    bad = golden_tasks.run(fn=kernel, specs=axpy_specs, golden=golden_axpy, options={"flags": ["-fno-such-flag"]})
    assert not bad.passed and bad.stages["compile"] == "FAILED"
    assert "-fno-such-flag" in bad.error and "Traceback" not in bad.error


@pytest.mark.e2e
def test_a_wrong_kernel_fails_validation(project):
    kernel = project(source=AXPY.replace("i < n", "i < n - 1")).axpy
    result = golden_tasks.run(fn=kernel, specs=axpy_specs, golden=golden_axpy, rtol=1e-6, atol=1e-6, rounds=3)
    assert not result.passed and "output 'y'" in result.error


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_source_compiles_with_nvcc(tmp_path, monkeypatch):
    (tmp_path / "scale.cu").write_text(textwrap.dedent("""\
        #include <cstdint>
        __global__ void scale_kernel(const float* x, float* out, float a, int64_t n) {
            int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
            if (i < n) out[i] = a * x[i];
        }
        extern "C" void scale(const float* x, float* out, float a, int64_t n) {
            scale_kernel<<<(n + 255) / 256, 256>>>(x, out, a, n);
        }
        """))
    (tmp_path / "cudamod.py").write_text(textwrap.dedent("""\
        import torch
        from golden_tasks import In, Out, Scalar, cpp

        @cpp("scale.cu")
        def scale(x: In[torch.float32], out: Out[torch.float32], a: Scalar[torch.float32], n: Scalar[torch.int64]): ...
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cudamod", raising=False)
    kernel = importlib.import_module("cudamod").scale
    assert kernel.cuda and kernel.flags == ("-O3",)
    assert [k for k in parts(kernel) if k.startswith("file ")] == ["file scale.cu"]  # not <cuda_runtime.h>
    specs = [TensorSpec("x", (300,), F32), TensorSpec("out", (300,), F32), ScalarSpec("a", F32, 2.0),
             ScalarSpec("n", I64, 300)]
    artifact = kernel.compile(stamped(kernel, specs), {}, tmp_path)
    assert isinstance(artifact, CppArtifact) and artifact.device == "cuda" and artifact.symbol == "scale"
    assert [(r.name, r.kind, r.direction, r.dtype) for r in artifact.table] == [
        ("x", "tensor", "in", "float32"), ("out", "tensor", "out", "float32"),
        ("a", "scalar", "in", "float32"), ("n", "scalar", "in", "int64")]
    assert hasattr(ctypes.CDLL(str(artifact.files["kernel.so"])), "scale")  # exported unmangled
    if not torch.cuda.is_available():
        with pytest.raises(StageFailed, match="CUDA kernel and CUDA is not available"):
            artifact.load()
