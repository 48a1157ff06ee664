"""A kernel case: kernel, specs, golden and validation policy, and its plan (golden_tasks.model.plan):
fingerprints of the kernel, golden and policy, the spec descriptors, the declared parameter
table, computed where the case's module is imported.
"""
import dataclasses
import functools
import glob
import inspect
import math
import os
import re
from pathlib import Path

from ..forms.base import KernelForm, world_size
from ..forms.untrusted import KernelFacts, KernelRef
from ..model.compare import Policy
from ..model.errors import SpecError, StalePlan
from ..model.hashing import canonical_json, digest_file
from ..model.origin import described
from ..model.plan import SOURCE_FIELDS, BenchSettings, Plan
from ..model.rows import compiled_for, placement_of
from ..model.specs import Spec, declared_params
from ..model.work import Work
from ..project import config
from ..project.fingerprint import Fingerprinter
from ..project.fingerprint_parts import changed_parts, parts
from ..project.observe import listed
from .data import describe
from .sweep import label, point_name, points


@dataclasses.dataclass
class Case(BenchSettings):
    """One verification case, timed as its BenchSettings say (warmup, rounds, min_rounds, max_rounds,
    rse, budget, flush: keyword arguments, with BenchSettings' defaults).

    `specs` is a list or a callable returning one (a callable keeps a bad spec
    from breaking the module's other cases); a callable with a `ranks`
    parameter is called with the world size, so that a multi-rank case's
    stacked specs follow it. `ranks` is the world size of a multi-rank kernel
    (default: the kernel's); `doit ... ranks=N` sets it for every multi-rank case. `kernel` and
    `golden` default to the module's `<module>` and `golden_<module>`.
    `compare` maps an output name to a comparator `(name, actual, expected,
    policy, outputs) -> Comparison` (see compare.py). `inputs_from` / `golden_from` take the inputs /
    golden outputs from a data directory instead of generating them.

    `file_deps` (paths or glob patterns, relative to the case module's directory) and `env_deps`
    (environment variable names) declare what the kernel, golden or comparators read at call
    time: their contents enter the keys of every stage that runs user code, which fingerprints
    cannot see. Reads at import time are noticed without declaring them.
    """
    name: str
    specs: object
    kernel: KernelForm | str = None  # a form, or the import path of one in an untrusted module (untrusted.py)
    golden: object = None
    rtol: float = 1e-5
    atol: float = 1e-8
    compare: dict = dataclasses.field(default_factory=dict)
    ignore_nan: bool = False
    seed: int = 0
    backend: str = None
    options: dict = dataclasses.field(default_factory=dict)
    timeout: float = 60.0  # seconds a kernel call may take before it counts as hung
    ranks: int = None  # the world size of a multi-rank kernel (default: the kernel's own)
    inputs_from: str = None  # a directory with in/<name>.pt for every scalar, In and InOut (see data.py)
    golden_from: str = None  # a directory with out/<name>.pt for every Out and InOut
    file_deps: tuple = ()
    env_deps: tuple = ()
    # custom resources of a Ray cluster's nodes (name -> amount) that the stages running the kernel or the
    # golden ask for: {"H100": 1} times the case on the hardware it is meant for (docs/cluster.md)
    resources: dict = dataclasses.field(default_factory=dict)
    # the work, where the specs' sum of reads and writes misleads and the golden's FLOPs are not what the kernel
    # must do (docs/performance.md): a number, or a function of the specs (name -> spec) returning one; each is
    # also the least the kernel must do, which its timing is held to (the benchmark's floor)
    bytes: object = None
    flops: object = None
    # implementations to compare the kernel with, by name (docs/performance.md): each a function with the kernel's
    # parameters (run eagerly: the same op in plain torch, say) or a kernel form (jit(fn): compiled by
    # AOTInductor). Each is verified and timed as a case of its own, `<name>@<baseline>`, sharing every stage that
    # does not run it; the table's speedup is over the first that passes
    baselines: dict = dataclasses.field(default_factory=dict)
    baseline_of: str = None  # set by with_baselines, never by hand: the case this one is a baseline of
    # the axes the case is verified across, by name: lists of values (a range, pow2(16, 256), dtypes); each
    # point is a case of its own, `<name>.<axis>-<value>...`, whose specs are `specs` called with the point's
    # values by keyword (planning/sweep.py)
    sweep: dict = dataclasses.field(default_factory=dict)
    sweep_of: str = None  # set by points, never by hand: the sweep this case is a point of
    point: dict = dataclasses.field(default_factory=dict)  # set by points: its value on each axis, as named
    dataset: dict = dataclasses.field(default_factory=dict)  # set by a dataset's reader: Plan.dataset
    root: Path = None  # where relative file_deps are found: the module's directory (run(): the cwd)

    def points(self) -> list["Case"]:
        """The case itself, or for a sweep a case per point (unresolved), in order; a bad sweep is a SpecError
        naming the case and the axis."""
        if not self.sweep:
            return [self]
        return [dataclasses.replace(self, name=point_name(self.name, values), sweep={}, sweep_of=self.name,
                                    specs=functools.partial(self.specs, **values),
                                    point={axis: label(value) for axis, value in values.items()})
                for values in points(self.name, self.sweep, self.specs)]

    def resolved(self, module=None, kernel_facts: KernelFacts = None) -> "Case":
        """A copy with defaults filled in from `module`, `specs` evaluated, and everything checked. A
        kernel named by import path becomes a KernelRef, knowing `kernel_facts` when given (untrusted.py)."""
        short = module.__name__.rsplit(".", 1)[-1] if module else None
        kernel = self.kernel if self.kernel is not None else getattr(module, short, None)
        if isinstance(kernel, str):
            kernel = KernelRef(kernel, f"case {self.name!r}", kernel_facts)
        golden = self.golden if self.golden is not None else getattr(module, f"golden_{short}", None)
        if not isinstance(kernel, KernelForm):
            raise SpecError(f"case {self.name!r}: no kernel (expected a @jit, @cpp or @triton_kernel function "
                            f"{short!r} in the module or kernel=...)")
        if not any(p.is_output for p in kernel.params()):
            raise SpecError(f"case {self.name!r}: kernel {kernel.name} has no Out or InOut parameter, "
                            "so there is nothing to verify")
        if self.sweep:
            raise SpecError(f"case {self.name!r}: a sweep is resolved point by point (Case.points)")
        if self.ranks is not None:
            world_size(self.ranks, f"case {self.name!r}")
        ranks = self.ranks or kernel.ranks
        if ranks > 1 and (run_ranks := config.current().ranks):
            ranks = run_ranks
        specs = self._specs(ranks)
        names = [s.name for s in specs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"case {self.name!r}: duplicate spec names {', '.join(dupes)}")
        if problem := self.bench_problem():
            raise SpecError(f"case {self.name!r}: {problem}")
        if not self.timeout > 0:
            raise SpecError(f"case {self.name!r}: timeout must be > 0 seconds, got {self.timeout!r}")
        for field in ("file_deps", "env_deps"):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise SpecError(f"case {self.name!r}: {field} must be a list of strings, got {value!r}")
        if not (isinstance(self.resources, dict) and all(
                isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                for k, v in self.resources.items())):
            raise SpecError(f"case {self.name!r}: resources must map resource names to amounts > 0, "
                            f"got {self.resources!r}")
        work = {field: self._declared(field, specs) for field in ("bytes", "flops")}
        root = self.root or (Path(module.__file__).parent if module else Path.cwd())
        return dataclasses.replace(self, kernel=kernel, golden=golden, specs=specs, ranks=ranks, **work,
                                   baselines=self._baseline_forms(kernel, ranks),
                                   root=Path(root).resolve(),
                                   compare=dict(self.compare or {}), options=dict(self.options or {}),
                                   file_deps=tuple(self.file_deps), env_deps=tuple(self.env_deps))

    def _declared(self, field: str, specs: list) -> float | None:
        """The case's `bytes` or `flops`: its number, or what its function of the specs returns; a SpecError
        naming the case and the field for anything but a finite number >= 0."""
        value = getattr(self, field)
        if callable(value):
            try:
                value = value({s.name: s for s in specs})
            except Exception as exc:  # noqa: BLE001 -- the user's function: its failure is the case's
                raise SpecError(f"case {self.name!r}: {field}= raised {described(exc)}") from None
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value < math.inf):
            raise SpecError(f"case {self.name!r}: {field}= must be a number >= 0 (or a function of the specs "
                            f"returning one), got {_short_repr(value)}")
        return value

    def _baseline_forms(self, kernel: KernelForm, ranks: int) -> dict:
        """The case's baselines as forms declaring the kernel's parameter table (so that their plans share its
        stages' keys): a function is run eagerly, a @jit form compiled as it says; a SpecError names the case
        and the baseline whose name or parameters are wrong."""
        from ..forms.jit import JitKernel  # noqa: PLC0415 -- imports torch: planning only

        if not isinstance(self.baselines, dict):
            raise SpecError(f"case {self.name!r}: baselines must map names to functions or kernel forms, "
                            f"got {_short_repr(self.baselines)}")
        table = kernel.params()
        forms = {}
        for name, given in self.baselines.items():
            owner = f"case {self.name!r}: baseline {name!r}"
            if not isinstance(name, str) or not BASELINE_NAME.fullmatch(name):
                raise SpecError(f"case {self.name!r}: baseline name {name!r} is not a name (letters, digits, "
                                "'_', '.' and '-')")
            if isinstance(given, JitKernel):
                form, declared = JitKernel(given.fn, given.backend, given.options, ranks, table), given.params()
            elif isinstance(given, KernelForm):
                form, declared = given, given.params()
            elif callable(given):
                form, declared = JitKernel(given, "eager", None, ranks, table), _unannotated(given, table, owner)
            else:
                raise SpecError(f"{owner}: expected a function with the kernel's parameters or a kernel form, "
                                f"got {_short_repr(given)}")
            exact = not isinstance(form, JitKernel)  # another form's table is its own: it must be the kernel's
            if [_param(p, exact) for p in declared] != [_param(p, exact) for p in table]:
                raise SpecError(f"{owner}: its parameters ({_params_text(declared)}) are not the kernel's "
                                f"({_params_text(table)})")
            forms[name] = form
        return forms

    def with_baselines(self) -> list:
        """A resolved case, then a case per baseline (Case.baselines), named `<case>@<baseline>`: the same specs,
        golden, policy, seed and work, the baseline as its kernel, compiled as its form says."""
        return [self, *(dataclasses.replace(self, name=f"{self.name}@{name}", kernel=form, baselines={},
                                            baseline_of=self.name, backend=None, options={})
                        for name, form in self.baselines.items())]

    def work(self) -> Work:
        """The work of a resolved case, totalled over its ranks (model.work)."""
        directions = {p.name: p.direction for p in self.kernel.params()}
        moved = {d: self.ranks * sum(s.rank_bytes for s in self.specs if directions.get(s.name) in (d, "inout"))
                 for d in ("in", "out")}
        floating = {}
        for s in self.specs:
            if s.dtype.is_floating_point and not s.by_value:
                floating[s.dtype] = floating.get(s.dtype, 0) + s.rank_bytes
        dtype = str(max(floating, key=floating.__getitem__)).removeprefix("torch.") if floating else None
        return Work(read=moved["in"], written=moved["out"], declared_bytes=self.bytes, declared_flops=self.flops,
                    dtype=dtype)

    def policy(self) -> Policy:
        """How its outputs are validated (the validate stage's view of a case)."""
        return Policy(self.rtol, self.atol, self.ignore_nan, self.compare)

    def placement(self) -> dict:
        """Where each resident tensor of a resolved case lives across ranks (name -> TensorSpec.resident),
        as AbiMeta.placement records it; the validate stage names a stacked output's wrong ranks by it."""
        return placement_of([s.signature for s in self.specs])

    def _specs(self, ranks: int) -> list:
        """The spec list, from `specs` or by calling it (with `ranks` if it takes them); anything
        else is a SpecError naming the case."""
        try:
            if not callable(self.specs):
                specs = self.specs
            elif "ranks" in inspect.signature(self.specs).parameters:
                specs = self.specs(ranks=ranks)
            else:
                specs = self.specs()
        except SpecError as exc:
            raise SpecError(f"case {self.name!r}: {exc}") from None
        if not isinstance(specs, (list, tuple)) or not all(isinstance(s, Spec) for s in specs):
            raise SpecError(f"case {self.name!r}: specs must be a list of TensorSpec and ScalarSpec "
                            f"(or a function returning one), got {_short_repr(specs)}")
        return list(specs)


BASELINE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _param(row, exact: bool) -> tuple:
    """What of a parameter row a baseline must agree on: its name, kind and direction (`exact`: all of it)."""
    return (row.name, row.kind, row.direction) + ((row.dtype, row.shape) if exact else ())


def _params_text(rows: list) -> str:
    return ", ".join(f"{r.name}: {r.direction}" for r in rows)


def _unannotated(fn, table: list, owner: str) -> list:
    """The parameter table of a baseline function: the one its annotations declare, or, with none, the kernel's
    (`table`) under its own parameter names."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise SpecError(f"{owner}: its signature cannot be read") from None
    if any(p.annotation is not p.empty for p in parameters):
        try:
            return declared_params(fn)
        except TypeError as exc:
            raise SpecError(f"{owner}: {exc}") from None
    if len(parameters) != len(table):
        raise SpecError(f"{owner}: it takes {len(parameters)} parameters, the kernel {len(table)} "
                        f"({_params_text(table)})")
    return [dataclasses.replace(row, name=p.name) for row, p in zip(table, parameters)]


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def declared_reads(case: Case) -> tuple[dict, set]:
    """({"files": {path: digest}, "env": {name: value or None}}, files read) for a resolved case's
    file_deps and env_deps. Patterns are expanded (sorted; one matching nothing is recorded as
    such); a plain path that does not exist is a SpecError naming the case."""
    files, read = {}, set()
    for pattern in case.file_deps:
        full = case.root / pattern
        if any(c in pattern for c in "*?["):
            matches = [Path(p) for p in sorted(glob.glob(str(full), recursive=True)) if os.path.isfile(p)]
        elif listed(full):
            matches = [full]
        else:
            raise SpecError(f"case {case.name!r}: file_deps names {pattern!r}, which is not a file ({full})")
        files[pattern] = {os.path.relpath(p, case.root): digest_file(p) for p in matches}
        read |= {str(p) for p in matches}
    return {"files": files, "env": {name: os.environ.get(name) for name in case.env_deps}}, read


def plan_of(case: Case, module: str = None, profile: str = None) -> tuple[Plan, set]:
    """The plan of a resolved case, and the user source files its fingerprints read."""
    fp = Fingerprinter()
    params, signature = case.kernel.params(), [s.signature for s in case.specs]
    data, data_files = describe(case, params)
    external, external_files = declared_reads(case)
    plan = Plan(
        case=case.name, module=module, profile=profile, timeout=case.timeout, params=params,
        signature=signature, specs=[s.input_recipe(fp) for s in case.specs], seed=case.seed,
        kernel=fp(case.kernel), backend=case.backend, options=case.options,
        compiled_for=compiled_for(params, signature, case.kernel.builds_once),
        ranks=case.ranks, resources=dict(case.resources),
        golden=fp(case.golden) if case.golden is not None else None,
        policy=fp({"rtol": case.rtol, "atol": case.atol, "ignore_nan": case.ignore_nan, "compare": case.compare}),
        bench=case.bench_settings(), work=case.work().to_json(), **data, external=external,
        parts={"kernel": parts(case.kernel, fp),
               "golden": parts(case.golden, fp) if case.golden is not None else {}},  # not a stage: the function
        volatile=sorted(set(fp.volatile)), golden_protected=case.kernel.untrusted,
        baseline_of=case.baseline_of, baselines=[c.name for c in case.with_baselines()[1:]],
        sweep_of=case.sweep_of, point=case.point, dataset=case.dataset)
    return plan, fp.files | data_files | external_files


def plans_of(case: Case, module: str = None, profile: str = None) -> tuple[list, set]:
    """The plans of a resolved case and of its baselines (Case.with_baselines), and the user source files their
    fingerprints read. They share what cannot be fingerprinted (Plan.volatile): a stage a baseline shares with
    its case must have the same key in both plans, the nonce that one of them may hold included (Library)."""
    made = [plan_of(each, module, profile) for each in case.with_baselines()]
    volatile = sorted({reason for plan, _ in made for reason in plan.volatile})
    return [dataclasses.replace(plan, volatile=volatile) for plan, _ in made], set().union(*(r for _, r in made))


def module_cases(module) -> list:
    cases = getattr(module, "CASES", None)
    if not isinstance(cases, (list, tuple)) or not all(isinstance(c, Case) for c in cases):
        raise SpecError(f"{module.__file__}: expected a module-level CASES list of golden_tasks.Case")
    return list(cases)


def live_case(plan: Plan) -> Case:
    """Import the plan's module and return its case, checked against the plan.

    A module edited after planning would make the cached keys lie; refuse it
    (StalePlan: the caller forgets the plan, so that the next run re-plans). A kernel named by import
    path is imported only in a confined process; elsewhere it is what the plan recorded of it.
    """
    from ..forms import isolate  # noqa: PLC0415 -- imports torch, as this module does
    from .datasets import cases_of  # noqa: PLC0415 -- it imports this module

    wanted = plan.baseline_of or plan.case
    module, declared_cases = cases_of(plan.module, only=plan.sweep_of or wanted)
    for case in (point for declared in declared_cases if isinstance(declared, Case)
                 and declared.name in (plan.sweep_of, wanted) for point in declared.points()):
        if case.name == wanted:
            recorded = isinstance(case.kernel, str) and not isolate.confined_here()
            resolved = next((c for c in case.resolved(module, KernelFacts(plan.ranks, plan.params) if recorded
                                                      else None).with_baselines() if c.name == plan.case), None)
            if resolved is None:
                break
            current, _ = plan_of(resolved, plan.module)
            # compared as JSON text: the plan came back from JSON (tuples read back as lists)
            changed = [k for k in SOURCE_FIELDS if not (recorded and not plan.baseline_of and k in ("kernel", "params"))
                       and canonical_json(current.field_json(k)) != canonical_json(plan.field_json(k))]
            if changed:
                named = []
                for k in changed:  # the function's parts that changed, where it has them
                    inner = changed_parts(plan.parts.get(k, {}), current.parts.get(k, {}))
                    named.append(f"{k}: {', '.join(inner)}" if inner else k)
                raise StalePlan(f"case {plan.case!r}: its source changed since the task graph was planned "
                                f"({'; '.join(named)}); it is planned again on the next run: run doit again")
            return resolved
    raise SpecError(f"case {plan.case!r} is no longer defined in {module.__file__ if module else plan.module}")
