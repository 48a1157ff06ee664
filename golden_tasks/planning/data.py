"""Bring your own data: a case's inputs and/or golden outputs from a directory.

    <inputs_from>/in/<name>.pt    every scalar, In and InOut parameter
    <golden_from>/out/<name>.pt   every Out and InOut parameter (the expected final values)

Each file holds one tensor saved with `torch.save` (a scalar may be a Python
number). A runtime dir (runs/<case>, see runtime.py) is a data directory too:
its data/in/ and data/golden/ files are read with the dtypes and shapes of its
manifest, so data saved by one run can feed another case. The files are read,
never written; their content digests enter the keys of the stages that read
them, so changing a file re-runs exactly what depends on it.
"""
from pathlib import Path

import torch

from ..model.errors import SpecError
from ..model.hashing import digest_file
from ..model.records import BadRecord, Manifest
from ..model.rows import ParamRow
from ..project.observe import listed
from ..storage.tensors import map_raw

RUNTIME_FOLDERS = {"in": "data/in", "out": "data/golden"}


def _manifest(root: Path):
    """The tensors table of a runtime dir, or None for a plain data directory."""
    try:
        return Manifest.read(root).tensors
    except BadRecord:
        return None


def path_of(root, folder: str, name: str) -> Path:
    root = Path(root).resolve()
    if _manifest(root) is not None:
        return root / RUNTIME_FOLDERS[folder] / f"{name}.bin"
    return root / folder / f"{name}.pt"


def read(root, folder: str, name: str) -> torch.Tensor:
    """The named tensor of a data directory's `in` or `out` folder."""
    path, tensors = path_of(root, folder, name), _manifest(Path(root).resolve())
    if tensors is None:
        value = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return value if isinstance(value, torch.Tensor) else torch.tensor(value)
    return map_raw(path, tensors[f"{RUNTIME_FOLDERS[folder]}/{name}.bin"])


def required(params: list[ParamRow]) -> dict:
    """folder -> parameter names that must have a file there, per the parameter's kind and direction."""
    need = {"in": [], "out": []}
    for p in params:
        if p.by_value or p.is_input:
            need["in"].append(p.name)
        if not p.by_value and p.is_output:
            need["out"].append(p.name)
    return need


def describe(case, params: list[ParamRow]) -> tuple[dict, set]:
    """({"data_in": {name: digest}, "data_out": {...}}, files read) for a resolved case.

    Raises SpecError listing every missing file, and naming each file whose
    shape or dtype disagrees with its spec (or whose scalar value differs).
    """
    specs = {s.name: s for s in case.specs}
    need = required(params)
    found, files, problems = {"data_in": {}, "data_out": {}}, set(), []
    for folder, root in (("in", case.inputs_from), ("out", case.golden_from)):
        if root is None:
            continue
        paths = {name: path_of(root, folder, name) for name in need[folder]}
        missing = [str(p) for p in paths.values() if not listed(p)]
        if missing:
            problems.append(f"missing data files for case {case.name!r}:\n    " + "\n    ".join(missing))
            continue
        for name, path in paths.items():
            problem = specs[name].mismatch(read(root, folder, name))
            if problem:
                problems.append(f"{path}: {problem}")
            found[f"data_{folder}"][name] = digest_file(path)
            files.add(str(path))
    if problems:
        raise SpecError("\n  ".join(problems))
    return found, files
