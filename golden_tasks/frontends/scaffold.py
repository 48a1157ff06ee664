"""`golden-tasks init`: what a project needs to run `doit verify`, written without overwriting anything.

It writes the doit entry point (dodo.py), the kernel folder with an example case and, in its subpackage
`untrusted`, the example's kernel (named by import path), and, for a kernel
folder other than the project's, the [tool.golden-tasks] table naming it (appended to pyproject.toml,
or a new one); it makes the other kernel folders a table already names; and it adds what the tool
writes in the project (the cache, the runs dir, doit's state file) to .gitignore, the lines it lacks.
Every file is checked first: if one it would write exists, nothing is written.
"""
import dataclasses
from pathlib import Path

from ..project.layout import declared

DODO = '''"""doit entry point of golden-tasks: `doit verify`, `doit verify:<case>`, `doit -n 4 verify`, `doit list`."""
from pathlib import Path

from golden_tasks.doit_tasks import DOIT_CONFIG, tasks_for  # noqa: F401

globals().update(tasks_for(Path(__file__).parent))
'''

# The case (trusted: specs, golden, tolerances) names its kernel by import path, so that the kernel's
# module never runs where the golden does (docs/threat-model.md).
EXAMPLE = '''"""An example case: the specs of a kernel's arguments, and the golden it is checked against. The kernel
lives in a module of its own, named by import path: golden-tasks imports it only in confined processes, never
beside this golden."""
import torch

from golden_tasks import Case, TensorSpec


def golden(t):
    t["out"].copy_(2.0 * t["x"] + t["y"])


SPECS = [TensorSpec("x", (256, 128), torch.float32, torch.randn),
         TensorSpec("y", (256, 128), torch.float32, torch.randn),
         TensorSpec("out", (256, 128), torch.float32)]

CASES = [Case("scale_add", SPECS, kernel="{package}.untrusted.scale_add:scale_add", golden=golden,
              rtol=1e-6, atol=1e-6)]
'''

UNTRUSTED = '''"""The kernels under test. Only golden-tasks' confined processes import these modules: the cases name
them by import path and never import them."""
'''

KERNEL = '''"""An example kernel: out = 2 x + y."""
import torch

from golden_tasks import In, Out, jit


@jit
def scale_add(x: In, y: In, out: Out):
    torch.add(x * 2.0, y, out=out)
'''


class InitRefused(Exception):
    """init would overwrite a file, or contradict the project's layout; the message says which."""


@dataclasses.dataclass(frozen=True)
class Scaffold:
    """The files init writes (path -> text), the table it appends to pyproject.toml (or "") and the
    kernel folders it makes."""
    files: dict
    table: str = ""
    folders: tuple = ()
    ignored: tuple = ()  # the .gitignore lines to add


def scaffold(root: Path, kernels: str = None) -> Scaffold:
    """What init writes in the project at `root`, its kernels in `kernels` (default: the layout's first
    kernel folder). Raises InitRefused when a file exists or the layout already names other folders."""
    root = Path(root).resolve()
    project = declared(root)  # a table written before init may name folders that do not exist yet
    folder = (root / kernels).resolve() if kernels else project.kernels[0]
    table = ""
    if folder not in project.kernels:
        pyproject = root / "pyproject.toml"
        if pyproject.exists() and "[tool.golden-tasks]" in pyproject.read_text():
            raise InitRefused(f"{pyproject} already has a [tool.golden-tasks] table, whose kernel folders do not "
                              f"include {kernels!r}: add it to its kernels list, or run init without --kernels")
        table = f'\n[tool.golden-tasks]\nkernels = ["{Path(kernels).as_posix()}"]\n'
    files = {root / "dodo.py": DODO, folder / "example.py": EXAMPLE.replace("{package}", folder.name),
             folder / "untrusted" / "__init__.py": UNTRUSTED, folder / "untrusted" / "scale_add.py": KERNEL}
    if not (folder / "__init__.py").exists():  # a regular package: its modules cannot clash with another's
        files[folder / "__init__.py"] = ""
    existing = [path for path in files if path.exists()]
    if existing:
        raise InitRefused("init writes nothing over existing files: " + ", ".join(map(str, existing)))
    named = project.kernels if project.named else ()  # without a table, the default folder is not one to make
    return Scaffold(files, table, tuple(f for f in named if f != folder and not f.is_dir()),
                    _unignored(root, project))


def _unignored(root: Path, project) -> tuple:
    """The .gitignore lines for what the tool writes inside the project that .gitignore lacks: the cache
    and the runs dir (the layout's, or cache/ and runs/) and doit's state (.doit.db*)."""
    written = [folder for folder in (project.cache or root / "cache", project.runs or root / "runs")
               if folder.is_relative_to(root)]
    wanted = [f"/{folder.relative_to(root).as_posix()}/" for folder in written] + ["/.doit.db*"]
    gitignore = root / ".gitignore"
    present = set(gitignore.read_text().splitlines()) if gitignore.exists() else set()
    return tuple(line for line in wanted if line not in present)


def init(root: Path, kernels: str = None) -> list:
    """Write the scaffold; the paths written (pyproject.toml last, when its table was added)."""
    plan = scaffold(root, kernels)
    for folder in plan.folders:
        folder.mkdir(parents=True)
    for path, text in plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    written = list(plan.files)
    if plan.ignored:
        written.append(_append(Path(root).resolve() / ".gitignore", "\n".join(plan.ignored) + "\n"))
    if plan.table:
        written.append(_append(Path(root).resolve() / "pyproject.toml", plan.table))
    return written


def _append(path: Path, text: str) -> Path:
    """Append `text` (which starts with a blank line or not) to the file at `path`, made if missing."""
    old = path.read_text() if path.exists() else ""
    separator = "\n" if old and not old.endswith("\n") else ""
    path.write_text(old + separator + (text if old else text.lstrip()))
    return path
