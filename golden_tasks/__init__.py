"""golden-tasks: kernel verification as a content-hashed task graph.

The package is layered (docs/architecture.md): each layer is a subpackage that imports only from the layers
before it in LAYERS (tests/test_layers.py checks the imports); at the top, the entry points users name:
`golden_tasks` itself (the names below), `golden_tasks.compare` (the comparators), `golden_tasks.doit_tasks`
(a dodo.py's import), `golden_tasks.triton` (Triton for kernel modules), `python -m golden_tasks.cli` and
`python -m golden_tasks.html_report`.

Names are imported lazily so that `import golden_tasks` (as the doit parent process does) never imports
torch. A module's import path from before the layers (`golden_tasks.specs`, `golden_tasks.jit`, ...)
still imports it (MOVED): user code, and the manifests and pickles of runtime dirs written then, name them.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import types

LAYERS = ("model", "storage", "project", "forms", "planning", "stages", "pipeline", "reports", "frontends")

_EXPORTS = {
    "In": "model.specs", "Out": "model.specs", "InOut": "model.specs", "Scalar": "model.specs",
    "TensorSpec": "model.specs", "ScalarSpec": "model.specs", "STACKED": "model.specs", "SpecError": "model.errors",
    "jit": "forms.jit", "JitKernel": "forms.jit", "cpp": "forms.cpp", "CppKernel": "forms.cpp",
    "triton_kernel": "forms.triton_form", "TritonKernel": "forms.triton_form",
    "KernelForm": "forms.base", "Artifact": "forms.base", "CompileError": "model.errors",
    "Case": "planning.case",
    "run": "pipeline.runner", "RunResult": "pipeline.runner", "Verdict": "model.verdicts",
    "StageState": "model.verdicts",
    "allclose": "model.compare", "Comparison": "model.compare", "Sides": "model.compare",
    "ratio_allclose": "model.compare", "RatioAllclose": "model.compare", "ratio_reldiff": "model.compare",
    "RatioReldiff": "model.compare", "topk_pair_compare": "model.compare", "TopkPairCompare": "model.compare",
    "error_distribution": "model.compare", "ErrorDistribution": "model.compare",
    "profile": "project.config",
}

__all__ = sorted(_EXPORTS)

# golden_tasks.<name> before the layers -> where the module is now
MOVED = {name: f"{layer}.{name}" for layer, names in {
    "model": ("errors", "hashing", "verdicts", "plan", "outputs", "records", "origin", "specs"),
    "storage": ("store", "tensors"),
    "project": ("layout", "config", "observe", "fingerprint", "toolchain", "sandbox", "reaper"),
    "forms": ("jit", "cpp", "isolate", "untrusted", "ranks"),
    "planning": ("case", "data", "discover", "library"),
    "pipeline": ("graph", "runtime", "replay", "runner", "launched", "_forkserver"),
    "reports": ("report", "junit", "runs_compare"),
    "frontends": ("doit_session", "doit_checks", "doit_reporter", "pytest_plugin", "watch", "scaffold"),
}.items() for name in names}


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'golden_tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing a submodule binds it as a package attribute, but `jit` and `cpp` name both a
    (moved) module and its decorator: the decorator wins, whichever is imported first."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name, "").rpartition(".")[2] == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`golden_tasks.<old name>` is the module it names now (the same object: its classes and functions
    pickle and unpickle as before)."""

    def find_spec(self, name, path=None, target=None):
        old = name.removeprefix(f"{__name__}.")
        return importlib.util.spec_from_loader(name, self) if name != old and old in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{MOVED[spec.name.removeprefix(f'{__name__}.')]}")
        spec.loader_state = module.__spec__  # the import system sets the module's __spec__ to the alias's
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


sys.modules[__name__].__class__ = _Package
sys.meta_path.append(_MovedModules())
