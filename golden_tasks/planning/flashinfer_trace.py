"""FlashInfer-Trace datasets as cases: FlashInfer-Bench's tree (definitions/, solutions/, workloads/) and
SOL-ExecBench's folder per problem (definition.json, workload.jsonl, solution_*.json). docs/datasets.md.

Every (solution, workload) pair of a definition is a case, a point of a sweep named after the solution, so that
`doit verify:<solution>` runs its workloads and the report draws them against the var axes:
- name: `<solution>.<axis>-<value>...` after the workload's var axes (its uuid's first 8 digits where those do
  not tell two workloads apart);
- specs: the definition's inputs and outputs at the workload's axes and the definition's const ones, with the
  dataset's `sizes` in place of those they name, then the largest halved (var axes first) until the case's tensors
  fit the dataset's `memory`; Plan.dataset keeps the sizes that ran and, where they differ, the dataset's own;
- inputs as the workload says: random as the format's evaluator draws them (under the case's seed), a scalar's
  value, a tensor of a safetensors file (its leading part where the sizes shrank), or SOL-ExecBench's custom
  inputs from the reference's own entry point;
- golden: the definition's reference `run` (Reference), called as the format calls it;
- kernel: the solution (forms.solution.SolutionKernel), untrusted: only a confined compile reads its code;
- tolerances: the workload's own (SOL-ExecBench's `correctness`), else the format evaluator's defaults, under its
  rule (compare.MatchedRatio).
A file that cannot be read, or a workload that does not fit its definition, fails the cases it would have made
(Unplanned, naming the file); the others are planned.
"""
import ast
import json
import math
import operator
import random
from pathlib import Path

import torch

from ..forms.solution import SolutionKernel, returned_into
from ..model.compare import MatchedRatio
from ..model.errors import SpecError
from ..model.hashing import digest_bytes, digest_file
from ..model.rows import ParamRow
from ..model.specs import ScalarSpec, TensorSpec
from ..project.layout import FLASHINFER_TRACE
from .case import Case
from .sweep import label, point_name
from .unplanned import Unplanned, task_name

INPUTS = "inputs"  # not a stage: the format's key of a definition's and a workload's inputs
TOLERANCE = 1e-2  # atol and rtol where the workload gives none: FlashInfer-Bench's evaluator's defaults
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32", "int16", "int8",
    "uint8", "bool")}
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(found, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return found


def _read_lines(path: Path) -> list:
    """The JSON objects of a .jsonl file, each with where it is (`file:line`)."""
    found = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                found.append((json.loads(line), f"{path}:{n}"))
            except ValueError as exc:
                raise SpecError(f"{path}:{n}: not a JSON line: {exc}") from None
    return found


class Problem:
    """A definition with its workloads and solutions, as read: (record, where) pairs; `folder`: where the paths
    its workloads name are relative to (the dataset's root, or SOL-ExecBench's problem folder)."""

    def __init__(self, definition: dict, where: Path, folder: Path):
        self.definition, self.where, self.folder = definition, where, folder
        self.workloads, self.solutions = [], []


def problems(root: Path) -> tuple[list, list]:
    """(the problems of the dataset at `root`, Unplanned for each file that could not be read), in the layout the
    folder has: definitions/ (FlashInfer-Bench), else a folder per problem, or the one problem root is."""
    found, failed = {}, []
    if (root / "definitions").is_dir():
        for path in sorted((root / "definitions").rglob("*.json")):
            _add_definition(found, failed, path, root)
        solutions = sorted((root / "solutions").rglob("*.json")) if (root / "solutions").is_dir() else []
        workloads = sorted((root / "workloads").rglob("*.jsonl")) if (root / "workloads").is_dir() else []
        wrapped = True
    else:
        folders = [root] if (root / "definition.json").is_file() else \
            [d for d in sorted(root.iterdir()) if (d / "definition.json").is_file()]
        for folder in folders:
            _add_definition(found, failed, folder / "definition.json", folder)
        solutions = [p for d in folders for p in sorted(d.glob("solution_*.json"))]
        workloads = [d / "workload.jsonl" for d in folders if (d / "workload.jsonl").is_file()]
        wrapped = False
    for path in workloads:
        try:
            for record, where in _read_lines(path):
                # FlashInfer-Bench keeps a workload in a Trace without solution or evaluation; SOL-ExecBench bare
                workload = record.get("workload") if wrapped else record
                name = record.get("definition") if wrapped else _definition_in(path.parent, found)
                if not isinstance(workload, dict) or name not in found:
                    raise SpecError(f"{where}: a workload of no definition in the dataset ({name!r})")
                found[name].workloads.append((workload, where))
        except SpecError as exc:
            failed.append(Unplanned(task_name(path.stem), str(exc)))
    for path in solutions:
        try:
            solution = _read_json(path)
            if solution.get("definition") not in found:
                raise SpecError(f"{path}: solution of no definition in the dataset ({solution.get('definition')!r})")
            found[solution["definition"]].solutions.append((solution, path))
        except SpecError as exc:
            failed.append(Unplanned(task_name(path.stem), str(exc)))
    return list(found.values()), failed


def _definition_in(folder: Path, found: dict) -> str | None:
    return next((name for name, p in found.items() if p.folder == folder), None)


def _add_definition(found: dict, failed: list, path: Path, folder: Path) -> None:
    try:
        definition = _read_json(path)
        for key in ("name", "axes", INPUTS, "outputs", "reference"):
            if key not in definition:
                raise SpecError(f"{path}: the definition has no {key!r}")
        if definition["name"] in found:
            raise SpecError(f"{path}: definition {definition['name']!r} is also {found[definition['name']].where}")
        found[definition["name"]] = Problem(definition, path, folder)
    except SpecError as exc:
        failed.append(Unplanned(task_name(path.parent.name if path.name == "definition.json" else path.stem), str(exc)))



def cases(dataset, only: str = None) -> list:
    """Every (solution, workload) case of the dataset (a project.layout.Dataset), and an Unplanned per file or
    pair that could not be made into one; `only`: the cases of the solution (the sweep) of that name alone."""
    found, failed = problems(dataset.path)
    made = []
    for problem in found:
        for solution, path in problem.solutions:
            if only in (None, _group(solution, path)):
                made += _solution_cases(dataset, problem, solution, path)
    names = [c.name for c in made]
    return failed + [c if names.count(c.name) == 1 else
                     Unplanned(c.name, f"{c.name!r}: two solutions of {dataset.path} make this case's name")
                     for c in made]


def _group(solution: dict, path: Path) -> str:
    """The name of a solution's sweep: the solution's."""
    return task_name(solution.get("name") or path.stem)


def _solution_cases(dataset, problem: Problem, solution: dict, path: Path) -> list:
    definition = problem.definition
    group = _group(solution, path)
    labels = [_var_point(definition, w) for w, _ in problem.workloads]
    made = []
    for (workload, where), point in zip(problem.workloads, labels):
        if labels.count(point) > 1 or not point:
            point = {**point, "workload": task_name(str(workload.get("uuid", "")))[:8]}
        name = point_name(group, point)
        try:
            made.append(_case(dataset, problem, solution, path, workload, where, name, group))
        except SpecError as exc:
            made.append(Unplanned(name, f"workload {workload.get('uuid')!r} ({where}) of solution {group!r}: {exc}",
                                  group))
    return made


def _var_point(definition: dict, workload: dict) -> dict:
    axes = workload.get("axes") if isinstance(workload.get("axes"), dict) else {}
    return {a: label(v) if isinstance(v, int) else task_name(str(v)) for a, v in axes.items()
            if isinstance(definition["axes"].get(a), dict) and definition["axes"][a].get("type") == "var"}


def _case(dataset, problem: Problem, solution: dict, path: Path, workload: dict, where: str, name: str,
          group: str) -> Case:
    definition = problem.definition
    inputs, outputs = list(definition[INPUTS]), list(definition["outputs"])
    given = _axes(definition, workload)
    ran = _sized(definition, given, dataset)
    specs = _specs(problem, workload, ran)
    params = [ParamRow(s.name, "scalar" if isinstance(s, ScalarSpec) else "tensor",
                       "in" if s.name in inputs else "out") for s in specs]
    correctness = workload.get("correctness") if isinstance(workload.get("correctness"), dict) else {}
    atol, rtol = (float(correctness.get(k, TOLERANCE)) for k in ("max_atol", "max_rtol"))
    ratio = 1.0 - float(correctness.get("required_matched_ratio", 1.0))
    spec = solution.get("spec") if isinstance(solution.get("spec"), dict) else {}
    language = (spec.get("languages") or [spec.get("language")])[0]
    record = {"format": FLASHINFER_TRACE, "dataset": dataset.path.name, "definition": definition["name"],
              "op_type": definition.get("op_type"), "solution": solution.get("name"), "language": language,
              "workload": workload, "sizes": ran, "declared": {a: v for a, v in given.items() if ran[a] != v}}
    return Case(name, specs, kernel=SolutionKernel(path, str(solution.get("name")), params, len(inputs)),
                golden=Reference(definition["name"], definition["reference"], tuple(inputs), tuple(outputs)),
                rtol=rtol, atol=atol, compare={o: MatchedRatio(atol=atol, rtol=rtol, max_error_ratio=ratio)
                                               for o in outputs},
                sweep_of=group, point={a: label(ran[a]) for a in _var_point(definition, workload) if a in ran},
                dataset=record, root=problem.folder)


def _axes(definition: dict, workload: dict) -> dict:
    """Each axis's value: a const axis's from the definition, a var axis's from the workload, an expression's
    computed from those (SOL-ExecBench's `expr` axes are computed again once sizes change: _evaluated)."""
    axes = {}
    for axis, declared in definition["axes"].items():
        kind = declared.get("type", "const") if isinstance(declared, dict) else None
        if kind == "const":
            axes[axis] = declared.get("value")
        elif kind == "var":
            axes[axis] = (workload.get("axes") or {}).get(axis)
        elif kind != "expr":
            raise SpecError(f"axis {axis!r} of definition {definition['name']!r} is not const, var or expr")
        if kind != "expr" and (isinstance(axes[axis], bool) or not isinstance(axes[axis], int) or axes[axis] < 0):
            raise SpecError(f"axis {axis!r} has no size (an integer >= 0) in the definition or the workload")
    return _evaluated(definition, axes)


def _evaluated(definition: dict, axes: dict) -> dict:
    found = {a: v for a, v in axes.items() if definition["axes"][a].get("type") != "expr"}
    for axis, declared in definition["axes"].items():
        if declared.get("type") == "expr":
            found[axis] = _expression(str(declared.get("expression")), found, axis)
    return found


def _expression(text: str, axes: dict, axis: str) -> int:
    """An `expr` axis's value: integer arithmetic over the other axes, nothing else evaluated."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in axes:
            return axes[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise SpecError(f"axis {axis!r}: expression {text!r} is not integer arithmetic over the other axes")
    try:
        return int(value(ast.parse(text, mode="eval").body))
    except SyntaxError:
        raise SpecError(f"axis {axis!r}: expression {text!r} does not parse") from None


def _shape(definition: dict, name: str, axes: dict) -> tuple | None:
    """The shape of input or output `name` at `axes` (None: a scalar)."""
    tensor = {**definition[INPUTS], **definition["outputs"]}[name]
    if tensor.get("shape") is None:
        return None
    return tuple(int(d) if isinstance(d, int) or str(d).isdigit() else axes[d] for d in tensor["shape"])


def _bytes(definition: dict, axes: dict) -> int:
    total = 0
    for name, tensor in {**definition[INPUTS], **definition["outputs"]}.items():
        if (shape := _shape(definition, name, axes)) is not None:
            total += math.prod(shape) * DTYPES[tensor["dtype"]].itemsize
    return total


def _sized(definition: dict, given: dict, dataset) -> dict:
    """The axes the case runs at: `given` with the dataset's sizes in place of those they name (its own table for
    this definition first), then the largest axis not so named halved, var axes before const ones, until the
    tensors fit the dataset's memory."""
    own = dataset.sizes.get(definition["name"], {})
    if unknown := sorted(set(own) - set(definition["axes"])):
        raise SpecError(f"sizes.{definition['name']}.{unknown[0]}: definition {definition['name']!r} has no such axis")
    for tensor in {**definition[INPUTS], **definition["outputs"]}.values():
        if tensor.get("dtype") not in DTYPES:
            raise SpecError(f"dtype {tensor.get('dtype')!r} is not one golden-tasks makes tensors of")
    named = {**{a: v for a, v in dataset.sizes.items() if not isinstance(v, dict) and a in given}, **own}
    axes = _evaluated(definition, {**given, **named})
    kinds = {a: d.get("type", "const") for a, d in definition["axes"].items()}
    while _bytes(definition, axes) > dataset.memory:
        free = [a for a in axes if kinds[a] != "expr" and a not in named and axes[a] > 1]
        if not free:
            break
        largest = max(free, key=lambda a: (kinds[a] == "var", axes[a]))
        axes = _evaluated(definition, {**axes, largest: (axes[largest] + 1) // 2})
    return axes


def _specs(problem: Problem, workload: dict, axes: dict) -> list:
    definition = problem.definition
    given = workload.get(INPUTS) if isinstance(workload.get(INPUTS), dict) else {}
    made = []
    for name, tensor in definition[INPUTS].items():
        how, dtype = given.get(name) or {"type": "random"}, DTYPES[tensor["dtype"]]
        shape = _shape(definition, name, axes)
        kind = how.get("type", "random")
        if shape is None:
            value = how.get("value") if kind == "scalar" else _random_scalar(tensor["dtype"], workload, name)
            made.append(ScalarSpec(name, dtype, value))
        elif kind == "random":
            made.append(TensorSpec(name, shape, dtype, init_value=torch.randn if dtype.is_floating_point
                                   and tensor["dtype"] not in _FP8 else Drawn(shape, tensor["dtype"])))
        elif kind == "safetensors":
            made.append(TensorSpec(name, shape, dtype, init_value=Stored(_stored_path(problem, how["path"]),
                                                                         str(how.get("tensor_key", name)), shape)))
        elif kind == "custom":
            entry = definition.get("custom_inputs_entrypoint")
            if not entry:
                raise SpecError(f"input {name!r} is custom, and the definition names no custom_inputs_entrypoint")
            made.append(TensorSpec(name, shape, dtype, init_value=Custom(definition["name"], definition["reference"],
                                                                         entry, axes, name)))
        else:
            raise SpecError(f"input {name!r}: type {kind!r} is not random, scalar, safetensors or custom")
    for name, tensor in definition["outputs"].items():
        shape = _shape(definition, name, axes)
        made.append(TensorSpec(name, () if shape is None else shape, DTYPES[tensor["dtype"]]))
    return made


def _stored_path(problem: Problem, relative: str) -> Path:
    for base in (problem.folder, problem.where.parent):
        if (base / relative).is_file():
            return base / relative
    raise SpecError(f"safetensors file {relative!r} is not in {problem.folder}")


def _random_scalar(dtype: str, workload: dict, name: str):
    """A scalar input the workload leaves random: drawn once, the same for every run of the workload."""
    rng = random.Random(f"{workload.get('uuid')}/{name}")
    return rng.random() if dtype.startswith(("float", "bfloat")) else rng.randrange(0, 2) == 1 if dtype == "bool" \
        else rng.randrange(-128, 128) if dtype == "int8" else rng.randrange(-1024, 1024)


class Drawn:
    """A random tensor as FlashInfer-Bench's evaluator draws a non-float one: fp8 from a clamped normal, bool and
    the integers uniform over its ranges (the pipeline seeds the draw)."""

    def __init__(self, shape: tuple, dtype: str):
        self.shape, self.dtype = tuple(shape), dtype

    def __call__(self) -> torch.Tensor:
        if self.dtype in _FP8:
            return torch.randn(self.shape).clamp_(-2, 2).to(DTYPES[self.dtype])
        low, high = {"bool": (0, 2), "int8": (-128, 128), "uint8": (0, 256)}.get(self.dtype, (-1024, 1024))
        return torch.randint(low, high, self.shape).to(DTYPES[self.dtype])


class Stored:
    """A tensor of a safetensors file (its leading `shape` where the case's sizes are smaller than the file's)."""

    def __init__(self, path: Path, key: str, shape: tuple):
        self.path, self.key, self.shape = Path(path), key, tuple(shape)

    def __fingerprint__(self, fingerprinter) -> dict:
        fingerprinter.files.add(str(self.path))
        return {"safetensors": digest_file(self.path), "key": self.key, "shape": list(self.shape)}

    def __call__(self) -> torch.Tensor:
        from safetensors import safe_open  # noqa: PLC0415 -- a dataset's dependency only

        with safe_open(str(self.path), "pt") as stored:
            if self.key not in stored.keys():
                raise SpecError(f"{self.path}: no tensor {self.key!r}")
            tensor = stored.get_tensor(self.key)
        if tensor.dim() != len(self.shape) or any(t < s for t, s in zip(tensor.shape, self.shape)):
            raise SpecError(f"{self.path}: tensor {self.key!r} has shape {tuple(tensor.shape)}, the definition "
                            f"{self.shape}")
        return tensor[tuple(slice(0, s) for s in self.shape)].clone()


def _namespace(definition: str, source: str) -> dict:
    """The reference's module namespace (its source run)."""
    namespace = {"__name__": f"reference_{task_name(definition)}"}
    exec(compile(source, f"<reference of {definition}>", "exec"), namespace)
    return namespace


class Custom:
    """An input SOL-ExecBench makes with the reference's own entry point (`fn(axes_and_scalars, device) -> dict`)."""

    def __init__(self, definition: str, source: str, entry: str, axes: dict, name: str):
        self.definition, self.source, self.entry, self.axes, self.name = definition, source, entry, dict(axes), name

    def __fingerprint__(self, fingerprinter) -> dict:
        return {"reference": digest_bytes(self.source.encode()), "entry": self.entry, "axes": self.axes,
                "name": self.name}

    def __call__(self) -> torch.Tensor:
        return _namespace(self.definition, self.source)[self.entry](dict(self.axes), "cpu")[self.name]


class Reference:
    """The golden of a definition's cases: its reference `run`, called with the inputs in the definition's order
    (scalars as values), what it returns copied into the outputs. Its source is run once per process and `run`
    kept (not pickled): golden_bench times the calls, not the source's imports."""

    def __init__(self, definition: str, source: str, inputs: tuple, outputs: tuple):
        self.definition, self.source, self.inputs, self.outputs = definition, source, inputs, outputs
        self._run = None

    def __fingerprint__(self, fingerprinter) -> dict:
        return {"reference": digest_bytes(self.source.encode()), INPUTS: list(self.inputs),
                "outputs": list(self.outputs)}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_run": None}

    def __call__(self, t: dict) -> None:
        if self._run is None:
            self._run = _namespace(self.definition, self.source)["run"]
        run = self._run
        with torch.no_grad():
            result = run(*[t[n] for n in self.inputs])
        returned_into(result, [t[n] for n in self.outputs], f"the reference of {self.definition}", exact=False)
