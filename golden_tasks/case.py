"""A kernel case: kernel, specs, golden and validation policy, and its plan.

The plan is the JSON-able description of a case that the task graph keys on:
fingerprints of the kernel, golden and policy, the spec descriptors, the
declared parameter table. It is computed where the case's module is imported
(a discovery subprocess, a worker, or `golden_tasks.run`) and handed to the
doit parent, which never imports kernel modules.
"""
import dataclasses
import importlib

from .data import describe
from .fingerprint import Fingerprinter, parts
from .forms import KernelForm
from .errors import SpecError
from .specs import signature_of


@dataclasses.dataclass
class Case:
    """One verification case.

    `specs` is a list or a zero-argument callable returning one (a callable
    keeps a bad spec from breaking the module's other cases). `kernel` and
    `golden` default to the module's `<module>` and `golden_<module>`.
    `compare` maps an output name to a comparator `(name, actual, expected,
    policy, outputs) -> Comparison` (see compare.py). `inputs_from` / `golden_from` take the inputs /
    golden outputs from a data directory instead of generating them.
    """
    name: str
    specs: object
    kernel: KernelForm = None
    golden: object = None
    rtol: float = 1e-5
    atol: float = 1e-8
    compare: dict = dataclasses.field(default_factory=dict)
    ignore_nan: bool = False
    seed: int = 0
    backend: str = None
    options: dict = dataclasses.field(default_factory=dict)
    warmup: int = 5
    rounds: int = 100
    timeout: float = 60.0  # seconds a kernel call may take before it counts as hung
    inputs_from: str = None  # a directory with in/<name>.pt for every scalar, In and InOut (see data.py)
    golden_from: str = None  # a directory with out/<name>.pt for every Out and InOut

    def resolved(self, module=None) -> "Case":
        """A copy with defaults filled in from `module` and `specs` evaluated."""
        short = module.__name__.rsplit(".", 1)[-1] if module else None
        kernel = self.kernel if self.kernel is not None else getattr(module, short, None)
        golden = self.golden if self.golden is not None else getattr(module, f"golden_{short}", None)
        if not isinstance(kernel, KernelForm):
            raise SpecError(f"case {self.name!r}: no kernel (expected a @jit or @cpp function "
                            f"{short!r} in the module or kernel=...)")
        specs = list(self.specs() if callable(self.specs) else self.specs)
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"case {self.name!r}: duplicate spec names {', '.join(dupes)}")
        if self.warmup < 0 or self.rounds < 1:
            raise SpecError(f"case {self.name!r}: warmup must be >= 0 and rounds >= 1")
        if not self.timeout > 0:
            raise SpecError(f"case {self.name!r}: timeout must be > 0 seconds, got {self.timeout!r}")
        return dataclasses.replace(self, kernel=kernel, golden=golden, specs=specs)


# Plan fields that come from the module's source; the others (backend, options,
# bench, timeout) may also be overridden from the command line.
SOURCE_FIELDS = ("params", "signature", "specs", "seed", "kernel", "golden", "policy", "data_in", "data_out")


def plan_of(case: Case, module: str = None) -> tuple[dict, set]:
    """The plan of a resolved case, and the user source files its fingerprints read."""
    fp = Fingerprinter()
    data, data_files = describe(case, case.kernel.params())
    specs = []
    for s in case.specs:
        desc = signature_of(s)
        if s.kind == "tensor":
            desc["init"] = fp(s.init_value)
        specs.append(desc)
    plan = {
        "case": case.name,
        "module": module,
        "params": case.kernel.params(),
        "signature": [signature_of(s) for s in case.specs],
        "specs": specs,
        "seed": case.seed,
        "kernel": fp(case.kernel),
        "backend": case.backend,
        "options": case.options,
        "golden": fp(case.golden) if case.golden is not None else None,
        "policy": fp({"rtol": case.rtol, "atol": case.atol, "ignore_nan": case.ignore_nan,
                      "compare": case.compare}),
        "bench": {"warmup": case.warmup, "rounds": case.rounds},
        "timeout": case.timeout,  # in no key: it decides only whether a call is a hang
        **data,
        # not in any key: lets `golden-tasks explain` name the function or constant that changed
        "parts": {"kernel": parts(case.kernel), "golden": parts(case.golden) if case.golden is not None else {}},
    }
    return plan, fp.files | data_files


def module_cases(module) -> list:
    cases = getattr(module, "CASES", None)
    if not isinstance(cases, (list, tuple)) or not all(isinstance(c, Case) for c in cases):
        raise SpecError(f"{module.__file__}: expected a module-level CASES list of golden_tasks.Case")
    return list(cases)


def live_case(plan: dict) -> Case:
    """Import the plan's module and return its case, checked against the plan.

    A module edited after planning would make the cached keys lie; refuse it.
    """
    module = importlib.import_module(plan["module"])
    for case in module_cases(module):
        if case.name == plan["case"]:
            resolved = case.resolved(module)
            current, _ = plan_of(resolved, plan["module"])
            changed = [k for k in SOURCE_FIELDS if current[k] != plan[k]]
            if changed:
                raise SpecError(f"case {plan['case']!r}: {module.__file__} changed since the task graph "
                                f"was planned ({', '.join(changed)}); run doit again")
            return resolved
    raise SpecError(f"case {plan['case']!r} is no longer defined in {module.__file__}")
