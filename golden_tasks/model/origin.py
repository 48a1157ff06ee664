"""Whose code a file is: the user's (fingerprinted by content) or a library's (keyed by its version).

Decided by what the user edits, not by where this interpreter keeps its own packages. A path is
classified by the folders it lies in (as written and with symlinks resolved), in this order:

1. library: the standard library, every site directory the interpreter uses (its own, a base
   install's under `--system-site-packages`, the user site) and every `sys.path` entry that holds
   an installed distribution (`*.dist-info`: a site tree on PYTHONPATH or linked by a .pth file);
2. user: the project (its root and kernel folders, see `add_project`) and the source folder of
   every editable install (PEP 610 `direct_url.json`), this project's or another the user edits;
3. library: the other folders .pth files add to `sys.path` (a linked package tree);
4. user: anything else (a script's folder, a plain source tree on PYTHONPATH).

So a virtual environment inside the project stays library code (1 before 2), and an editable
install's source stays user code though a .pth file puts it on `sys.path` (2 before 3). A wrong
"library" would key user code by a version number (an edit missed); a wrong "user" would walk
into a library's internals. golden_tasks itself is never user code: the pipeline's version keys it.

Reads files and distribution metadata, imports nothing heavy: the doit parent uses `library_dirs`.
"""
import contextlib
import functools
import json
import os
import site
import sys
import sysconfig
import traceback
from collections.abc import Iterable, Iterator
from urllib.parse import unquote, urlparse

from .errors import VerificationFailure

# The project's folders, for this process and (through the environment) the processes it starts.
PROJECT_ENV = "GOLDEN_TASKS_PROJECT"
_project = tuple(p for p in os.environ.get(PROJECT_ENV, "").split(os.pathsep) if p)


def add_project(*folders: str | os.PathLike[str]) -> None:
    """Count `folders` (a project's root, its kernel folders) as user code here and in the
    processes started after."""
    global _project
    _project = tuple(dict.fromkeys([*_project, *(os.path.abspath(f) for f in folders)]))
    os.environ[PROJECT_ENV] = os.pathsep.join(_project)


def _forms(folders: Iterable[str]) -> tuple[str, ...]:
    """Each folder as written (absolute) and with symlinks resolved."""
    return tuple(dict.fromkeys(f for p in folders if p for f in (os.path.abspath(p), os.path.realpath(p))))


def _interpreter_sites() -> list[str]:
    sites = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    sites += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    user_site = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    return [*sites, *([user_site] if user_site else [])]


def _pth_folders(sites: list[str]) -> list[str]:
    """The folders the .pth files of the site directories add to sys.path (import lines run code
    and add nothing by themselves)."""
    found = []
    for folder in sites:
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if line and not line.startswith(("#", "import ", "import\t")):
                    path = os.path.join(folder, line)
                    if os.path.isdir(path):
                        found.append(path)
    return found


def _holds_distribution(folder: str) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(e.name.endswith(".dist-info") and e.is_dir() for e in entries)
    except OSError:
        return False


@functools.cache
def _library_tiers(path_entries: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site folders, linked folders) for this sys.path: tiers 1 and 3 of the module docstring."""
    sites = _interpreter_sites()
    linked = _pth_folders(sites)
    trees = [p for p in path_entries if p and os.path.isabs(p) and _holds_distribution(p)]
    return _forms([*sites, *trees]), _forms(linked)


@functools.cache
def _editable_sources() -> tuple[str, ...]:
    """The source folders of the editable installs this interpreter sees."""
    import importlib.metadata  # noqa: PLC0415 -- only where code is classified, not in every doit run

    found = []
    for dist in importlib.metadata.distributions():
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
        except (OSError, ValueError):
            continue
        if not isinstance(direct, dict) or not isinstance(direct.get("dir_info"), dict):
            continue  # another kind of direct URL (an archive, a VCS checkout), or a malformed file
        url = direct.get("url")
        if direct["dir_info"].get("editable") and isinstance(url, str) and url.startswith("file:"):
            found.append(unquote(urlparse(url).path))
    return _forms(found)


@functools.cache
def _user_folders(project: tuple[str, ...]) -> tuple[str, ...]:
    """Tier 2 of the module docstring: the project's folders and the editable installs' sources."""
    return _forms(project) + _editable_sources()


def user_folders() -> tuple[str, ...]:
    """The folders of user code here: the project's (as registered) and the editable installs' sources."""
    return _user_folders(_project)


def library_dirs() -> tuple[str, ...]:
    """Every folder whose packages are library code (tiers 1 and 3 of the module docstring, less the
    user's): a package installed, upgraded or removed there changes that folder."""
    sites, linked = _library_tiers(tuple(sys.path))
    return tuple(dict.fromkeys([*sites, *(f for f in linked if not is_user_file(f))]))


def _under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f if f.endswith(os.sep) else f + os.sep) for f in folders)


@functools.lru_cache(maxsize=65536)
def _classify(path: str, path_entries: tuple[str, ...], project: tuple[str, ...]) -> bool:
    sites, linked = _library_tiers(path_entries)
    if _under(os.path.abspath(path), sites):  # most files read are a library's: no symlink to resolve
        return False
    forms = _forms([path])
    if any(_under(p, sites) for p in forms):
        return False
    if any(_under(p, _user_folders(project)) for p in forms):
        return True
    return not any(_under(p, linked) for p in forms)


def is_user_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file (or folder) at `path` is user code or data, by the order of the module docstring."""
    return _classify(os.fspath(path), tuple(sys.path), _project)


def is_user_source(name: str, file: str | None) -> bool:
    """Whether module `name`, loaded (or to be loaded) from `file`, is code the user edits: neither
    golden_tasks nor a library's (nor a builtin)."""
    if not isinstance(name, str) or not name or name == "golden_tasks" or name.startswith("golden_tasks."):
        return False
    if file is None or not os.path.isabs(file):  # builtins and oddities such as torch._classes
        return name == "__main__"
    return is_user_file(file)


def is_user_module(name: str) -> bool:
    """`is_user_source` of a loaded module."""
    return is_user_source(name, getattr(sys.modules.get(name), "__file__", None))


_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # golden_tasks' own files: never the user's frame


def described(exc: BaseException) -> str:
    """An exception of user code (a kernel module, a golden, a spec's init) as a report says it: one line,
    `TYPE: MESSAGE (at FILE:LINE)`, where the line is the innermost frame of user code (else the innermost
    frame), then the full traceback on the lines below, for the log. golden_tasks' own verdict on what
    the user gave it (a VerificationFailure, whose message names what is wrong) is its message, at the
    user's line if one raised it, without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    users = [f for f in frames if not f.filename.startswith(_OWN) and is_user_file(f.filename)]
    ours = isinstance(exc, VerificationFailure)
    where = (users if ours else users or frames)[-1:]
    at = "".join(f" (at {shown(f.filename)}:{f.lineno})" for f in where)
    if ours:
        return f"{type(exc).__name__}: {exc}{at}"
    message = next(iter(str(exc).splitlines()), "")
    return f"{type(exc).__name__}: {message}{at}\n" + "".join(traceback.format_exception(exc)).rstrip()


def shown(path: str, start: str | None = None) -> str:
    """A path relative to `start` (default: the working directory) when inside it."""
    relative = os.path.relpath(path, start)
    return path if relative.startswith("..") else relative


def dumps_by_value(obj: object) -> bytes:
    """cloudpickle `obj` with every loaded user module's code by value.

    By reference, a function pickles to the same bytes after its module is
    edited and runs whatever the module holds when loaded; by value, the bytes
    carry the code they were made from (artifacts, saved policies).
    """
    import cloudpickle  # noqa: PLC0415

    with by_value():
        data: bytes = cloudpickle.dumps(obj)  # cloudpickle ships no type information
    return data


@contextlib.contextmanager
def by_value() -> Iterator[None]:
    """While the block runs, cloudpickle pickles every loaded user module's code by value (dumps_by_value)."""
    import cloudpickle  # noqa: PLC0415

    registered = cloudpickle.list_registry_pickle_by_value()  # a block inside another: the outer one's stay
    # by the module's own name: multiprocessing also lists the main module as __mp_main__
    modules = {m.__name__: m for n, m in list(sys.modules.items())
               if n != "__main__" and is_user_module(n) and m.__name__ not in registered}.values()
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
