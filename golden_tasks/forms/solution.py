"""Kernels that a problem set's solution file holds: untrusted code that only a confined process loads.

A FlashInfer-Trace solution (`SolutionKernel`) is a JSON file with its sources inline, a language and an entry
point (`main.py::run`); a KernelBench solution (`ModelKernel`) is a Python file defining `ModelNew`. Trusted code
knows either by its file's digest and by the parameter table its problem declares, so planning, the inputs, the
golden and validation never import it; compile does, in its confined child (stage_table: compile is confined), and
builds an artifact of a form this package already has: the eager one for Python and PyTorch, the Triton one for
Triton. What the form cannot build (another language) compiles to an artifact that says why, and the case is
SKIPPED with that reason (dispatch, bench).
"""
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import torch

from ..model.errors import CompileError
from ..model.hashing import digest_file
from ..model.origin import add_project, described
from ..model.specs import table_of
from .base import Artifact, KernelForm
from .jit import EagerArtifact

EAGER_LANGUAGES = ("python", "pytorch")  # run as they are: the eager form's artifact
TRITON_LANGUAGES = ("triton",)
EXTENSION_LANGUAGES = ("cpp", "cuda")  # built as torch extensions, where their binding is torch's
EXTENSION_SOURCES = (".cpp", ".cc", ".cxx", ".c", ".cu")  # what of their sources the compiler is given


def _identifier(text: str) -> str:
    """`text` with every character that cannot be in a Python identifier made '_' (a module's name)."""
    return "".join(c if c.isalnum() else "_" for c in text)


def import_file(folder: Path, relative: str, owner: str):
    """The module at `folder`/`relative` (a .py file), imported under its dotted path with `folder` first on
    sys.path, and counted as user code (its functions pickle by value into the artifact); a CompileError names
    `owner` and what its import raised."""
    add_project(folder)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    name = relative.removesuffix(".py").replace("/", ".")
    for loaded in [n for n in sys.modules if n == name or n.startswith(f"{name}.")]:
        del sys.modules[loaded]  # a module of that name that this process had: not the solution's
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001 -- untrusted code: whatever it raises fails its case
        raise CompileError(f"{owner}: importing {relative} raised {described(exc)}") from None


def returned_into(result, outputs: list, owner: str, exact: bool = True) -> None:
    """Copy what a solution returned (one value, or a tuple with one per output) into its Out tensors, checking
    the count, shape and (`exact`: a reference's is converted) dtype as the format's evaluator does."""
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(values) != len(outputs):
        raise RuntimeError(f"{owner} returned {len(values)} value(s); its definition has {len(outputs)} output(s)")
    for value, out in zip(values, outputs):
        value = torch.as_tensor(value, dtype=out.dtype) if not isinstance(value, torch.Tensor) else value
        if tuple(value.shape) != tuple(out.shape):
            raise RuntimeError(f"{owner} returned shape {tuple(value.shape)} where the output has {tuple(out.shape)}")
        if exact and value.dtype != out.dtype:
            raise RuntimeError(f"{owner} returned dtype {value.dtype} where the output is {out.dtype}")
        out.copy_(value)


def _calling(run, inputs: int, destination_passing: bool, owner: str):
    """A kernel taking every parameter (inputs, then outputs) that calls the solution's `run` as its style says:
    with its outputs to write (destination passing), or with its inputs alone, its results copied into them."""
    def solution(*args):
        if destination_passing:
            run(*args)
        else:
            returned_into(run(*args[:inputs]), list(args[inputs:]), owner)
    return solution


class UnbuiltArtifact(Artifact):
    """What compile makes of a solution it cannot build here: why.txt says why, and the case is SKIPPED."""
    backend = "unbuilt"

    def unavailable(self):
        return self.files["why.txt"].read_text()

    def load(self):
        raise CompileError(self.unavailable())


def unbuilt(specs: list, workdir: Path, why: str) -> UnbuiltArtifact:
    (Path(workdir) / "why.txt").write_text(why)
    return UnbuiltArtifact(table_of(specs), {"why.txt": Path(workdir) / "why.txt"})


class UntrustedFile(KernelForm):
    """A kernel in a solution file: known to trusted code by the file's digest and the table `params` declared
    by its problem; only compile, in a confined child, reads the file as code (`build`)."""
    untrusted = True

    def __init__(self, path: Path, name: str, params: list):
        self.path, self.name, self._params = Path(path), name, list(params)

    def params(self) -> list:
        return list(self._params)

    def __fingerprint__(self, fingerprinter) -> dict:
        """The solution file's content: what compile builds from (its problem's part is the case's)."""
        fingerprinter.files.add(str(self.path))
        return {"solution": digest_file(self.path), "form": type(self).__name__}

    def compile(self, specs, options, workdir):
        artifact = self.build(specs, Path(workdir))
        if self.builds_once:  # one build serves every call: its table says so, and load_checked accepts any
            artifact.table = [row.open() for row in artifact.table]
        return artifact

    def build(self, specs: list, workdir: Path) -> Artifact:
        raise NotImplementedError


class ExtensionArtifact(Artifact):
    """A C++ or CUDA solution built as a torch extension (torch.utils.cpp_extension.load, as FlashInfer-Bench's
    torch builder builds it): extension.so, the module, and extension.json: its module name, entry symbol,
    device, and how it is called (the number of inputs, destination passing)."""
    backend = "torch-extension"

    def __init__(self, table, files):
        super().__init__(table, files)
        self.about = json.loads(self.files["extension.json"].read_text())
        self.device = self.about["device"]

    @classmethod
    def of_solution(cls, solution: dict, folder: Path, owner: str, inputs: int, destination_passing: bool,
                    specs: list, workdir: Path):
        """The extension built from a solution's sources in `folder` (its confined compile child)."""
        from torch.utils.cpp_extension import load  # noqa: PLC0415 -- the C++ toolchain's, only where it builds

        language, spec = solution["language"], solution["spec"]
        file, _, symbol = spec["entry_point"].partition("::")
        sources = [str(p) for p in sorted(folder.rglob("*")) if p.suffix in EXTENSION_SOURCES]
        if Path(file).suffix not in EXTENSION_SOURCES:
            raise CompileError(f"{owner}: its entry point {spec['entry_point']!r} is not in a C++ or CUDA source")
        name = f"solution_{_identifier(solution['name'])}"
        build = workdir / "build"
        build.mkdir()
        try:
            module = load(name=name, sources=sources, extra_include_paths=[str(folder)], build_directory=str(build),
                          with_cuda=language == "cuda", verbose=False)
        except Exception as exc:  # noqa: BLE001 -- the compiler's verdict on untrusted sources fails the case
            raise CompileError(f"{owner}: building it as a torch extension failed: {described(exc)}") from None
        if not callable(getattr(module, symbol, None)):
            raise CompileError(f"{owner}: its extension exports no function {symbol!r}")
        about = {"module": name, "symbol": symbol, "device": "cuda" if language == "cuda" else "cpu",
                 "input_count": inputs, "destination_passing": destination_passing,
                 "owner": owner}
        (workdir / "extension.json").write_text(json.dumps(about, sort_keys=True))
        return cls(table_of(specs), {"extension.so": Path(module.__file__),
                                     "extension.json": workdir / "extension.json"})

    def unavailable(self):
        if self.device == "cuda" and not torch.cuda.is_available():
            return "a CUDA solution, and no CUDA device here"
        return None

    def load(self):
        about = self.about
        with tempfile.TemporaryDirectory(prefix="golden-tasks-extension-") as folder:
            # the loader finds PyInit_<module> by the file's name; the store names its objects by digest
            linked = Path(folder) / f"{about['module']}.so"
            linked.symlink_to(self.files["extension.so"].resolve())
            spec = importlib.util.spec_from_file_location(about["module"], linked)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        return _calling(getattr(module, about["symbol"]), about["input_count"], about["destination_passing"],
                        about["owner"])


class SolutionKernel(UntrustedFile):
    """A FlashInfer-Trace solution (its JSON file): `inputs` of its parameters are the definition's inputs, the
    rest its outputs. Its language decides the artifact: Python and PyTorch eager, Triton through the Triton
    form (interpreted without a GPU, and SKIPPED where the interpreter would compute it wrong), C++ and CUDA
    bound by torch as a torch extension (a CUDA one SKIPPED without a GPU), anything else SKIPPED naming the
    language or the binding. Each language's build is the same for every workload (a solution is called with the
    workload's tensors and scalars, as the format's evaluator calls it): one build serves them all."""
    builds_once = True

    def __init__(self, path: Path, name: str, params: list, inputs: int):
        super().__init__(path, name, params)
        self.inputs = inputs

    def build(self, specs, workdir):
        owner = f"solution {self.name!r}"
        solution = json.loads(self.path.read_text())
        spec = solution["spec"]
        languages = spec.get("languages") or [spec.get("language")]  # SOL-ExecBench's list, FlashInfer-Bench's one
        language = str(languages[0]).lower()
        built = (*EAGER_LANGUAGES, *TRITON_LANGUAGES, *EXTENSION_LANGUAGES)
        if language not in built:
            return unbuilt(specs, workdir, f"{owner} is written in {language}, which golden-tasks does not build "
                                           f"(it builds {', '.join(built)})")
        binding = spec.get("binding") or "tvm-ffi"  # the format's default for C++ and CUDA
        if language in EXTENSION_LANGUAGES and binding != "torch":
            return unbuilt(specs, workdir, f"{owner} is {language} bound by {binding}: golden-tasks builds C++ and "
                                           "CUDA solutions bound by torch (a torch extension)")
        destination_passing = spec.get("destination_passing_style", True)  # the format's default
        folder = workdir / "sources"
        for source in solution["sources"]:
            relative = Path(source["path"])
            if relative.is_absolute() or ".." in relative.parts:
                raise CompileError(f"{owner}: source path {source['path']!r} leaves the solution's folder")
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(source["content"])
        if language in EXTENSION_LANGUAGES:
            return ExtensionArtifact.of_solution({**solution, "language": language}, folder, owner, self.inputs,
                                                 destination_passing, specs, workdir)
        file, _, function = spec["entry_point"].partition("::")
        run = getattr(import_file(folder, file, owner), function, None)
        if not callable(run):
            raise CompileError(f"{owner}: its entry point {spec['entry_point']!r} names no function")
        kernel = _calling(run, self.inputs, destination_passing, owner)
        if language in TRITON_LANGUAGES:
            from .triton_form import TritonKernel  # noqa: PLC0415 -- imports triton's helpers

            return TritonKernel(kernel, self._params).compile(specs, {}, workdir)
        return EagerArtifact.build(kernel, specs, {}, workdir)


KERNELBENCH_SEED = 42  # KernelBench's eval seeds the init inputs and each model's construction with it


class _Pinned(dict):
    """A module namespace in which an assignment to a pinned name keeps the pinned value, so that what the
    module derives from a size constant (`M = N // 2`, `shape = (N, N)`) follows the size it is given."""

    def __init__(self, pinned: dict):
        super().__init__()
        self.pinned = dict(pinned)

    def __setitem__(self, name, value):
        super().__setitem__(name, self.pinned.get(name, value))


def load_problem(path: Path, sizes: dict) -> dict:
    """The namespace of KernelBench problem file `path` (trusted: the dataset's reference), run afresh with each
    module-level name in `sizes` held at its value there; its get_inputs and get_init_inputs read them when
    called. What the file raises propagates."""
    path, namespace = Path(path), _Pinned(sizes)
    namespace.update({"__name__": f"kernelbench_{_identifier(path.stem)}",
                      "__file__": str(path), "__builtins__": __builtins__})
    # a dict subclass as the globals: module-level stores go through __setitem__, reads are a dict's
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


class ModelKernel(UntrustedFile):
    """A KernelBench solution: a .py file defining `ModelNew`, with Model's __init__ and forward, of problem
    file `problem` run at `sizes` (load_problem). Compile imports it (confined), builds ModelNew from the
    problem's get_init_inputs() seeded as the golden builds Model, and makes an eager artifact that calls it on
    the first `inputs` parameters under no_grad, its result copied into the rest (the outputs)."""

    def __init__(self, path: Path, name: str, params: list, problem: Path, sizes: dict, inputs: int):
        super().__init__(path, name, params)
        self.problem, self.sizes, self.inputs = Path(problem), dict(sizes), inputs

    def __fingerprint__(self, fingerprinter) -> dict:
        """The solution file's content, and the problem's and sizes that build reads for ModelNew's init."""
        fingerprinter.files.add(str(self.problem))
        return {**super().__fingerprint__(fingerprinter), "problem": digest_file(self.problem), "sizes": self.sizes}

    def build(self, specs, workdir):
        owner = f"solution {self.name!r}"
        problem = load_problem(self.problem, self.sizes)
        model_new = getattr(import_file(self.path.parent, self.path.name, owner), "ModelNew", None)
        if not isinstance(model_new, type):
            raise CompileError(f"{owner}: {self.path.name} defines no class ModelNew")
        torch.manual_seed(KERNELBENCH_SEED)
        init = problem["get_init_inputs"]()
        torch.manual_seed(KERNELBENCH_SEED)
        try:
            model = model_new(*init)
        except BaseException as exc:  # noqa: BLE001 -- untrusted code: whatever it raises fails its case
            raise CompileError(f"{owner}: ModelNew(*get_init_inputs()) raised {described(exc)}") from None
        inputs = self.inputs

        def kernel(*args):
            with torch.no_grad():
                result = model(*args[:inputs])
            returned_into(result, list(args[inputs:]), f"{owner}'s ModelNew")
        return EagerArtifact.build(kernel, specs, {}, workdir)
