"""KernelBench problem sets as cases: a folder of problems and a folder of solutions, matched by file name.
docs/datasets.md.

A problem file defines `class Model(nn.Module)`, `get_inputs()`, `get_init_inputs()` and module-level size
constants (`batch_size = 32768`, `N = 2048 * 2`); its solution, of the same file name, defines `ModelNew` with
Model's __init__ and forward. Each problem with a solution is a case named after the file:
- sizes: the problem's module-level integers, with the dataset's `sizes` in place of those they name (its own
  table for the problem first), then the largest other one that shrinks the case halved until its inputs and
  outputs fit the dataset's `memory` (KernelBench writes sizes for a GPU's memory); forms.solution.load_problem
  runs the file with them held, so what it derives from them follows; Plan.dataset keeps the sizes that ran and,
  where they differ, the file's own;
- specs: an input per value get_inputs() returns, named after Model.forward's parameters, each drawn by
  get_inputs() under the case's seed (a number is a scalar of that value); an output `out` (`out0`, `out1`...
  where forward returns a tuple) of the shape and dtype forward returns;
- golden: Model built from get_init_inputs(), each seeded as KernelBench's eval seeds them (ProblemModel);
- kernel: the solution's ModelNew, built the same way (forms.solution.ModelKernel), untrusted: only a confined
  compile reads its code, so a solution that does not import or has no ModelNew fails its case at compile;
- tolerances: KernelBench's for the output's dtype, as atol and rtol both (torch.allclose's rule).
A problem that cannot be run, or sizes naming what it has not, fail the case they would have made (Unplanned,
naming why); a solution without a problem is an Unplanned naming it.
"""
import collections
import inspect
import math
from pathlib import Path

import torch

from ..forms.solution import KERNELBENCH_SEED, ModelKernel, load_problem, returned_into
from ..model.errors import SpecError
from ..model.hashing import digest_file
from ..model.origin import described
from ..model.rows import ParamRow
from ..model.specs import ScalarSpec, TensorSpec
from ..project.layout import KERNELBENCH
from .case import Case
from .unplanned import Unplanned, task_name

# KernelBench's eval (get_tolerance_for_precision): atol = rtol, by the precision the models run at
TOLERANCES = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
Shaped = collections.namedtuple("Shaped", "shape dtype")  # a tensor, as the specs need it
_SCALARS = ((bool, torch.bool), (int, torch.int64), (float, torch.float32))  # bool first: an int's subclass



def cases(dataset, only: str = None) -> list:
    """A case per problem of the dataset (a project.layout.Dataset) that has a solution, an Unplanned per problem
    that could not be made into one and per solution of no problem; `only`: the case of that name alone (a stage's
    process needs its own, and making each runs its problem)."""
    for folder in (dataset.path, dataset.solutions):
        if not folder.is_dir():
            raise SpecError(f"{folder}: no such folder")
    problems = {p.stem: p for p in sorted(dataset.path.glob("*.py"))}
    solutions = {p.stem: p for p in sorted(dataset.solutions.glob("*.py"))}
    made: list = [Unplanned(task_name(stem), f"solution {path} is of no problem: {dataset.path} has no {path.name}")
            for stem, path in solutions.items() if stem not in problems]
    for stem, path in problems.items():
        if stem in solutions and only in (None, task_name(stem)):
            try:
                made.append(_case(dataset, path, solutions[stem]))
            except SpecError as exc:
                made.append(Unplanned(task_name(stem), f"problem {path}: {exc}"))
    names = [c.name for c in made]
    return [c if names.count(c.name) == 1 else
            Unplanned(c.name, f"{c.name!r}: two files of {dataset.path} make this case's name") for c in made]


def _case(dataset, problem: Path, solution: Path) -> Case:
    stem = problem.stem
    declared = _constants(_loaded(problem, {}))
    pins = _pins(dataset, stem, declared)
    pins, inputs, outputs = _sized(problem, pins, dataset.memory)
    namespace = _loaded(problem, pins)
    ran, names = _constants(namespace), _input_names(namespace["Model"], len(inputs))
    out_names = ["out"] if len(outputs) == 1 else [f"out{i}" for i in range(len(outputs))]
    if set(names) & set(out_names):  # forward's parameter named as an output is: numbered instead
        names = [f"in{i}" for i in range(len(inputs))]
    specs = [_input_spec(name, value, problem, pins, i) for i, (name, value) in enumerate(zip(names, inputs))]
    specs += [TensorSpec(name, shape, dtype) for name, (shape, dtype) in zip(out_names, outputs)]
    params = [ParamRow(s.name, "scalar" if isinstance(s, ScalarSpec) else "tensor",
                       "in" if s.name in names else "out") for s in specs]
    tolerance = max(TOLERANCES.get(dtype, TOLERANCES[torch.float32]) for _, dtype in outputs)
    record = {"format": KERNELBENCH, "dataset": dataset.path.name, "problem": stem, "solution": solution.name,
              "sizes": ran, "declared": {c: v for c, v in declared.items() if ran.get(c) != v}}
    name = task_name(stem)
    return Case(name, specs, kernel=ModelKernel(solution, name, params, problem, pins, len(inputs)),
                golden=ProblemModel(problem, pins, tuple(names), tuple(out_names)), rtol=tolerance, atol=tolerance,
                dataset=record, root=dataset.path)


def _loaded(problem: Path, pins: dict) -> dict:
    """The problem's namespace at `pins` (load_problem), a SpecError naming what it raised."""
    try:
        namespace = load_problem(problem, pins)
    except Exception as exc:  # noqa: BLE001 -- the dataset's code: its error fails its case
        raise SpecError(f"running it raised {described(exc)}") from None
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(namespace.get(name)):
            raise SpecError(f"it defines no {name} (a KernelBench problem defines Model, get_inputs and "
                            "get_init_inputs)")
    return namespace


def _constants(namespace: dict) -> dict:
    """The problem's size constants: its module-level integers."""
    return {k: v for k, v in namespace.items() if type(v) is int and not k.startswith("_")}


def _pins(dataset, stem: str, declared: dict) -> dict:
    """The sizes the dataset gives the problem: the top-level ones it has, then its own table, every key of which
    must be one of its constants."""
    own = dataset.sizes.get(stem, {}) if isinstance(dataset.sizes.get(stem), dict) else {}
    if unknown := sorted(set(own) - set(declared)):
        raise SpecError(f"sizes.{stem}.{unknown[0]}: the problem has no module-level integer {unknown[0]!r} "
                        f"(it has {', '.join(declared) or 'none'})")
    return {**{c: v for c, v in dataset.sizes.items() if not isinstance(v, dict) and c in declared}, **own}


def _sized(problem: Path, pins: dict, memory: int) -> tuple:
    """(the sizes to pin, the inputs, the outputs) at which the case's tensors fit `memory`: `pins`, then the
    largest constant they do not name whose halving shrinks the tensors halved, again until they fit or none
    does."""
    named = set(pins)
    inputs, outputs = _shapes(problem, pins)
    while (size := _bytes(inputs, outputs)) > memory:
        values = _constants(_loaded(problem, pins))
        for constant in sorted((c for c, v in values.items() if c not in named and v > 1), key=lambda c: -values[c]):
            trial = {**pins, constant: (values[constant] + 1) // 2}
            found = _shapes(problem, trial)
            if _bytes(*found) < size:
                pins, (inputs, outputs) = trial, found
                break
        else:
            break
    if outputs is None:  # the model could not run on fake tensors: at these sizes it runs for real
        inputs, outputs = _shapes(problem, pins, fake=False)
    return pins, inputs, outputs


def _shapes(problem: Path, pins: dict, fake: bool = True) -> tuple:
    """(the inputs get_inputs() returns: (shape, dtype) for a tensor, else the value; the outputs Model returns
    on them as (shape, dtype), or None where it cannot say on fake tensors), each seeded as the golden is. `fake`:
    on torch's fake tensors, which allocate nothing (KernelBench's sizes fill a GPU), where the problem allows."""
    namespace = _loaded(problem, pins)
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415 -- torch's own shape propagation

        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                drawn = _drawn(namespace)
                inputs = _described(drawn)
                try:
                    return inputs, _described(_forward(namespace, drawn), outputs=True)
                except Exception:  # noqa: BLE001 -- forward needs real values: measured as its inputs
                    return inputs, None
        except Exception:  # noqa: BLE001 -- inputs drawn from their own values (.item()): drawn for real below
            pass
    try:
        inputs = _drawn(namespace)
        return _described(inputs), _described(_forward(namespace, inputs), outputs=True)
    except SpecError:
        raise
    except Exception as exc:  # noqa: BLE001 -- the dataset's code: its error fails its case
        raise SpecError(f"running Model on get_inputs() raised {described(exc)}") from None


def _drawn(namespace: dict) -> list:
    torch.manual_seed(KERNELBENCH_SEED)
    inputs = namespace["get_inputs"]()
    if not isinstance(inputs, (list, tuple)):
        raise SpecError(f"get_inputs() returned {type(inputs).__name__}, not a list of the inputs")
    return list(inputs)


def _forward(namespace: dict, inputs: list):
    """What Model, built as the golden builds it, returns on `inputs`."""
    with torch.no_grad():
        return model_of(namespace)(*inputs)


def model_of(namespace: dict) -> torch.nn.Module:
    """The problem's Model built from get_init_inputs(), each seeded as KernelBench's eval seeds them."""
    torch.manual_seed(KERNELBENCH_SEED)
    init = namespace["get_init_inputs"]()
    torch.manual_seed(KERNELBENCH_SEED)
    return namespace["Model"](*init)


def _described(values, outputs: bool = False) -> list:
    """Each of `values` (one, or a tuple or list of them) as the specs need it: a tensor's shape and dtype
    (Shaped), anything else as it is; `outputs`: each must be a tensor."""
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    for value in values:
        if outputs and not isinstance(value, torch.Tensor):
            raise SpecError(f"Model.forward returns a {type(value).__name__}, not a tensor or a tuple of them")
    return [Shaped(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v for v in values]


def _bytes(inputs: list, outputs: list | None) -> int:
    """The bytes of the tensors among the inputs and outputs (the inputs' again where the outputs are unknown)."""
    size = sum(math.prod(v.shape) * v.dtype.itemsize for v in inputs if isinstance(v, Shaped))
    return size + (size if outputs is None else sum(math.prod(s) * d.itemsize for s, d in outputs))


def _input_names(model: type[torch.nn.Module], count: int) -> list:
    """Model.forward's parameter names, where they are one per input; else in0, in1, ..."""
    try:
        parameters = list(inspect.signature(model.forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        parameters = []
    names = [p.name for p in parameters]
    plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)
    return names if plain and len(names) == count and all(n.isidentifier() for n in names) else \
        [f"in{i}" for i in range(count)]


def _input_spec(name: str, value, problem: Path, pins: dict, index: int):
    if isinstance(value, Shaped):
        return TensorSpec(name, value.shape, value.dtype, init_value=Drawn(problem, pins, index))
    dtype = next((d for kind, d in _SCALARS if isinstance(value, kind)), None)
    if dtype is None:
        raise SpecError(f"input {index} ({name}) of get_inputs() is a {type(value).__name__}: golden-tasks passes "
                        "tensors and numbers")
    return ScalarSpec(name, dtype, value)


class Drawn:
    """Input `index` of what the problem's get_inputs() returns at `pins` (the pipeline seeds the draw)."""

    def __init__(self, problem: Path, pins: dict, index: int):
        self.problem, self.pins, self.index = Path(problem), dict(pins), index

    def __fingerprint__(self, fingerprinter) -> dict:
        fingerprinter.files.add(str(self.problem))
        return {"problem": digest_file(self.problem), "sizes": self.pins, "index": self.index}

    def __call__(self) -> torch.Tensor:
        return load_problem(self.problem, self.pins)["get_inputs"]()[self.index]


class ProblemModel:
    """The golden of a problem's case: its Model built as KernelBench's eval builds it (model_of) at `pins`,
    called under no_grad on the inputs in forward's order, what it returns copied into the outputs. The model is
    built once per process and kept (not pickled): the golden's timing is forward's."""

    def __init__(self, problem: Path, pins: dict, inputs: tuple, outputs: tuple):
        self.problem, self.pins, self.inputs, self.outputs = Path(problem), dict(pins), inputs, outputs
        self._model: torch.nn.Module | None = None

    def __fingerprint__(self, fingerprinter) -> dict:
        fingerprinter.files.add(str(self.problem))
        return {"problem": digest_file(self.problem), "sizes": self.pins, "arguments": list(self.inputs),
                "results": list(self.outputs)}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_model": None}

    def __call__(self, t: dict) -> None:
        if self._model is None:
            self._model = model_of(load_problem(self.problem, self.pins))
        with torch.no_grad():
            result = self._model(*[t[n] for n in self.inputs])
        returned_into(result, [t[n] for n in self.outputs], f"Model of {self.problem.name}", exact=False)
