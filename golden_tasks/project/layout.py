"""Where a project keeps its kernel modules, cache and run reports: the `[tool.golden-tasks]` table of
its pyproject.toml, else the defaults (kernels/, cache/, runs/ beside it).

    [tool.golden-tasks]
    kernels = ["src/mykernels"]  # folders of kernel modules (default: ["kernels"])
    cache = ".golden-cache"       # the store (default: cache); $GOLDEN_TASKS_CACHE wins
    runs = "build/runs"           # reports and runtime dirs (default: runs); $GOLDEN_TASKS_RUNS wins
    profile = "small"             # the size profile when no profile=NAME is given
    backend = "eager"             # every case's backend when no backend=NAME is given

    [[tool.golden-tasks.datasets]]   # a problem set whose problems become cases (docs/datasets.md)
    format = "flashinfer-trace"      # flashinfer-trace (FlashInfer-Bench's tree or SOL-ExecBench's) or kernelbench
    path = "data/mlsys"              # the dataset (kernelbench: the folder of problems)
    solutions = "data/kb-solutions"  # kernelbench only: the folder of solutions, matched by file name
    sizes = {batch_size = 16}        # sizes that replace the dataset's: an axis, or a problem's own table
    memory = "256MiB"                # the inputs and outputs of a case are shrunk to fit (default 256MiB)

    [tool.golden-tasks.machine.cpu]  # figures that replace what calibrate measured, per device ("cpu", "cuda")
    gbps = 40.0                      # memory bandwidth at every working-set size
    tflops = {float32 = 1.5, bfloat16 = 3.0}  # matmul rate per dtype

A kernel folder's modules (its *.py files but _private ones) are imported as `<folder name>.<stem>`,
with the folder's parent on sys.path: `kernels/rms_norm.py` is `kernels.rms_norm`, and
`src/mykernels/attn.py` is `mykernels.attn`. Reads no module and imports neither torch nor doit.
"""
import dataclasses
import functools
import re
import sys
from pathlib import Path

from ..model.machine import FLOATING
from ..model.origin import add_project
from ..model.plan import BACKENDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover -- the tomli backport, a dependency below 3.11
    import tomli as tomllib

TABLE = "tool.golden-tasks"
KEYS = ("backend", "cache", "datasets", "kernels", "machine", "profile", "runs")
FLASHINFER_TRACE, KERNELBENCH = "flashinfer-trace", "kernelbench"  # the problem sets a dataset may be
FORMATS = (FLASHINFER_TRACE, KERNELBENCH)  # (planning.datasets has the reader of each)
DATASET_KEYS = ("format", "path", "solutions", "sizes", "memory")
DEFAULT_MEMORY = 256 << 20  # bytes of inputs and outputs a dataset's case may take unless its table says otherwise
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
DEVICES = ("cpu", "cuda")  # the devices [tool.golden-tasks.machine] may declare the figures of


class LayoutError(ValueError):
    """The project's [tool.golden-tasks] table is malformed; the message names the file and key."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A problem set named in [[tool.golden-tasks.datasets]], checked: its format (FORMATS), its folder (a
    KernelBench set's problems) and, for KernelBench, its solutions' folder; `sizes`: axis (or size constant) ->
    value, or a problem's name -> its own such table; `memory`: the bytes a case's inputs and outputs may take."""
    format: str
    path: Path
    solutions: Path = None
    sizes: dict = dataclasses.field(default_factory=dict, hash=False)
    memory: int = DEFAULT_MEMORY

    @property
    def module(self) -> str:
        """What its cases' plans name as their module: no module's import name can look like it."""
        return f"{self.format}:{self.path.name}"


@dataclasses.dataclass(frozen=True)
class KernelModule:
    """One kernel module: its import name, its file, and the folder that goes on sys.path for it; or a dataset
    (`dataset`), whose cases its own reader makes (planning.datasets), its folder as `path`."""
    name: str
    path: Path
    import_root: Path
    dataset: Dataset = None


@dataclasses.dataclass(frozen=True)
class Layout:
    """A project's folders (absolute) and defaults; None where the project sets nothing. `configured`:
    its pyproject.toml has the table (pytest then collects its cases)."""
    root: Path
    kernels: tuple = ()
    cache: Path = None
    runs: Path = None
    profile: str = None
    backend: str = None
    configured: bool = False
    named: tuple = ()  # the kernel folders as the table writes them (empty: the default folder)
    # device -> the figures declared for it ({"gbps": GB/s, "tflops": {dtype: TFLOP/s}}), which the reports use
    # instead of the measured ones (model.machine.Limits.declared); the floor keeps to what was measured
    machine: dict = dataclasses.field(default_factory=dict)
    datasets: tuple = ()  # Dataset per [[tool.golden-tasks.datasets]] table

    def modules(self) -> list:
        """Every kernel module, folder by folder, each folder's in name order; then each dataset."""
        return [*(KernelModule(f"{folder.name}.{path.stem}", path, folder.parent) for folder in self.kernels
                  for path in sorted(folder.glob("*.py")) if not path.name.startswith("_")),
                *(KernelModule(d.module, d.path, d.path.parent, d) for d in self.datasets)]

    def module(self, name: str) -> KernelModule:
        """The kernel module called `name` (KeyError when the layout has none)."""
        found = {m.name: m for m in self.modules()}
        return found[name]

    def importable(self) -> None:
        """Put each kernel folder's parent first on sys.path (once), so its modules import by name in
        this process and in those started after (a forkserver takes sys.path along); the project's
        code is user code there, wherever sys.path finds it (golden_tasks.model.origin); and Triton's
        mode in the environment (toolchain.settle_triton_mode)."""
        from .toolchain import settle_triton_mode  # noqa: PLC0415 -- toolchain imports config, which imports this

        add_project(self.root, *self.kernels)
        settle_triton_mode()  # before a kernel module imports triton, here or in a process started after
        for root in dict.fromkeys(folder.parent for folder in reversed(self.kernels)):
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))

    def no_case(self, case: str) -> str:
        """The message for a case name that no kernel module defines."""
        folders = ", ".join(self.relative(f) for f in self.kernels)
        return f"no case {case!r} in the kernel folders of {self.root} ({folders})"

    def relative(self, path: Path) -> str:
        """`path` as the user knows it: relative to the project root where it lies inside it."""
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)


def _text(table: dict, key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise LayoutError(f"{where}: {key} must be a non-empty string, not {value!r}")
    return value


@functools.cache
def layout(root: Path) -> Layout:
    """The layout of the project at `root`, read once per process from root/pyproject.toml; a kernel
    folder the table names must exist (the default may not: a project with no cases yet)."""
    found = declared(root)
    where = f"{found.root / 'pyproject.toml'} [{TABLE}]"
    for folder, text in zip(found.kernels, found.named):
        if not folder.is_dir():
            raise LayoutError(f"{where}: kernels folder {text!r} does not exist ({folder})")
    for n, dataset in enumerate(found.datasets):
        for folder in filter(None, (dataset.path, dataset.solutions)):
            if not folder.is_dir():
                raise LayoutError(f"{where}: datasets[{n}]: folder {found.relative(folder)!r} does not exist")
    return found


@functools.cache
def declared(root: Path) -> Layout:
    """The layout as root/pyproject.toml declares it, its form checked but not that its folders exist
    (`golden-tasks init` makes them)."""
    root = Path(root).resolve()
    pyproject = root / "pyproject.toml"
    table, document_has = {}, False
    if pyproject.is_file():
        try:
            document = tomllib.loads(pyproject.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise LayoutError(f"{pyproject}: cannot be read: {exc}") from None
        document_has = "golden-tasks" in document.get("tool", {})
        table = document.get("tool", {}).get("golden-tasks", {})
    where = f"{pyproject} [{TABLE}]"
    if not isinstance(table, dict):
        raise LayoutError(f"{where} must be a table")
    if unknown := sorted(set(table) - set(KEYS)):
        raise LayoutError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    folders = table.get("kernels", ["kernels"])
    if not (isinstance(folders, list) and folders and all(isinstance(f, str) and f.strip() for f in folders)):
        raise LayoutError(f"{where}: kernels must be a non-empty list of folders, not {folders!r}")
    kernels = tuple((root / f).resolve() for f in folders)
    names = [k.name for k in kernels]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise LayoutError(f"{where}: two kernel folders are named {twice!r}: their modules would share import names")
    cache, runs = (_text(table, key, where) for key in ("cache", "runs"))
    if (backend := _text(table, "backend", where)) not in (None, *BACKENDS):
        raise LayoutError(f"{where}: backend {backend!r} is not a backend ({', '.join(BACKENDS)})")
    return Layout(root, kernels, cache and (root / cache).resolve(), runs and (root / runs).resolve(),
                  _text(table, "profile", where), backend, configured=document_has,
                  named=tuple(folders) if "kernels" in table else (), machine=_machine(table.get("machine"), where),
                  datasets=_datasets(root, table.get("datasets", []), where))


def _datasets(root: Path, tables, where: str) -> tuple:
    """The [[tool.golden-tasks.datasets]] tables, checked (their folders' existence is `layout`'s to check)."""
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise LayoutError(f"{where}: datasets must be an array of tables ([[tool.golden-tasks.datasets]])")
    found = []
    for n, table in enumerate(tables):
        at = f"{where}: datasets[{n}]"
        if unknown := sorted(set(table) - set(DATASET_KEYS)):
            raise LayoutError(f"{at}: unknown key {unknown[0]!r} (known: {', '.join(DATASET_KEYS)})")
        if (form := table.get("format")) not in FORMATS:
            raise LayoutError(f"{at}: format must be one of {', '.join(FORMATS)}, not {form!r}")
        path, solutions = _text(table, "path", at), _text(table, "solutions", at)
        if path is None:
            raise LayoutError(f"{at}: path (the dataset's folder) is missing")
        if (solutions is None) != (form != KERNELBENCH):
            raise LayoutError(f"{at}: solutions (the folder of solutions) is "
                              + ("missing: a KernelBench set names it" if solutions is None else
                                 f"a KernelBench set's key: a {form} dataset holds its own"))
        found.append(Dataset(form, (root / path).resolve(), solutions and (root / solutions).resolve(),
                             _sizes(table.get("sizes", {}), f"{at}.sizes"), _memory(table.get("memory"), at)))
    modules = [d.module for d in found]
    if twice := next((m for m in modules if modules.count(m) > 1), None):
        raise LayoutError(f"{where}: two datasets are {twice!r}: their folders must be named apart")
    return tuple(found)


def _size(value, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(f"{at} must be an integer >= 1, not {value!r}")
    return value


def _sizes(table, at: str) -> dict:
    """sizes: name -> an integer, or a problem's name -> a table of them."""
    if not isinstance(table, dict):
        raise LayoutError(f"{at} must be a table of sizes, not {table!r}")
    return {name: {axis: _size(v, f"{at}.{name}.{axis}") for axis, v in value.items()} if isinstance(value, dict)
            else _size(value, f"{at}.{name}") for name, value in table.items()}


def _memory(value, at: str) -> int:
    """memory: bytes, as an integer or a text such as "256MiB"."""
    if value is None:
        return DEFAULT_MEMORY
    if isinstance(value, str) and (m := re.fullmatch(r"\s*(\d+)\s*(B|KiB|MiB|GiB)\s*", value)):
        value = int(m[1]) * _UNITS[m[2]]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LayoutError(f"{at}: memory must be a number of bytes >= 1 or a text such as \"256MiB\", not {value!r}")
    return value


def _rate(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise LayoutError(f"{where} must be a number > 0, not {value!r}")
    return float(value)


def _machine(table, where: str) -> dict:
    """The [tool.golden-tasks.machine] table, checked: device -> {"gbps": float, "tflops": {dtype: float}}."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise LayoutError(f"{where}: machine must be a table of devices ({', '.join(DEVICES)})")
    declared = {}
    for device, figures in table.items():
        at = f"{where}: machine.{device}"
        if device not in DEVICES:
            raise LayoutError(f"{at}: {device!r} is not a device ({', '.join(DEVICES)})")
        if not isinstance(figures, dict) or not figures or set(figures) - {"gbps", "tflops"}:
            raise LayoutError(f"{at} must be a table of gbps (a number) and tflops (a table of dtypes), "
                              f"not {figures!r}")
        declared[device] = {}
        if "gbps" in figures:
            declared[device]["gbps"] = _rate(figures["gbps"], f"{at}.gbps")
        if "tflops" in figures:
            rates = figures["tflops"]
            if not isinstance(rates, dict) or not rates:
                raise LayoutError(f"{at}.tflops must be a table of dtypes ({', '.join(FLOATING)}), not {rates!r}")
            for dtype in rates:
                if dtype not in FLOATING:
                    raise LayoutError(f"{at}.tflops: {dtype!r} is not a floating dtype ({', '.join(FLOATING)})")
            declared[device]["tflops"] = {dtype: _rate(r, f"{at}.tflops.{dtype}") for dtype, r in rates.items()}
    return declared
