"""golden-tasks: kernel verification as a content-hashed task graph.

Names are imported lazily so that `import golden_tasks` (as the doit parent
process does) never imports torch.
"""
import importlib
import sys
import types

_EXPORTS = {
    "In": "specs", "Out": "specs", "InOut": "specs", "Scalar": "specs",
    "TensorSpec": "specs", "ScalarSpec": "specs", "STACKED": "specs", "SpecError": "errors",
    "jit": "jit", "JitKernel": "jit", "cpp": "cpp", "CppKernel": "cpp",
    "KernelForm": "forms", "Artifact": "forms", "CompileError": "errors",
    "Case": "case",
    "run": "runner", "RunResult": "runner", "Verdict": "verdicts", "StageState": "verdicts",
    "allclose": "compare", "Comparison": "compare", "Sides": "compare",
    "ratio_allclose": "compare", "RatioAllclose": "compare", "ratio_reldiff": "compare", "RatioReldiff": "compare",
    "topk_pair_compare": "compare", "TopkPairCompare": "compare",
    "error_distribution": "compare", "ErrorDistribution": "compare",
    "profile": "config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'golden_tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing a submodule binds it as a package attribute, but `jit` and `cpp` name both a
    submodule and its decorator: the decorator wins, whichever is imported first."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
