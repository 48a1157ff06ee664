"""golden-tasks: kernel verification as a content-hashed task graph.

The package is layered (docs/architecture.md): each layer is a subpackage that imports only from the layers
before it in LAYERS (tests/test_layers.py checks the imports); at the top, the entry points users name:
`golden_tasks` itself (the names below), `golden_tasks.compare` (the comparators), `golden_tasks.doit_tasks`
(a dodo.py's import), `golden_tasks.triton` (Triton for kernel modules), `python -m golden_tasks.cli` and
`python -m golden_tasks.html_report`.

Names are imported lazily so that `import golden_tasks` (as the doit parent process does) never imports
torch. Modules live in their layers (LAYERS, docs/architecture.md); paths from before the layers
(`golden_tasks.jit`, ...) are gone, and replay refuses a runtime dir that names one.
"""
import importlib

LAYERS = ("model", "storage", "project", "forms", "planning", "stages", "pipeline", "reports", "frontends")

_EXPORTS = {
    "In": "model.specs", "Out": "model.specs", "InOut": "model.specs", "Scalar": "model.specs",
    "TensorSpec": "model.specs", "ScalarSpec": "model.specs", "STACKED": "model.rows", "SpecError": "model.errors",
    "jit": "forms.jit", "JitKernel": "forms.jit", "cpp": "forms.cpp", "CppKernel": "forms.cpp",
    "triton_kernel": "forms.triton_form", "TritonKernel": "forms.triton_form",
    "KernelForm": "forms.base", "Artifact": "forms.base", "CompileError": "model.errors",
    "Case": "planning.case", "pow2": "planning.sweep",
    "run": "pipeline.runner", "RunResult": "pipeline.runner", "Verdict": "model.verdicts",
    "StageState": "model.verdicts",
    "allclose": "model.compare", "Comparison": "model.compare", "Sides": "model.compare",
    "ratio_allclose": "model.compare", "RatioAllclose": "model.compare", "ratio_reldiff": "model.compare",
    "RatioReldiff": "model.compare", "topk_pair_compare": "model.compare", "TopkPairCompare": "model.compare",
    "error_distribution": "model.compare", "ErrorDistribution": "model.compare",
    "profile": "project.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'golden_tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
