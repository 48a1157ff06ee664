"""Where things live, overridable by environment variables."""
import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

from ..storage.store import Store
from .layout import Layout, layout

CACHE_ENV = "GOLDEN_TASKS_CACHE"
RUNS_ENV = "GOLDEN_TASKS_RUNS"
READONLY_ENV = "GOLDEN_TASKS_CACHE_READONLY"
OVERLAY_ENV = "GOLDEN_TASKS_OVERLAY"
THREADS_ENV = "GOLDEN_TASKS_THREADS"
WORKERS_ENV = "GOLDEN_TASKS_WORKERS"
PROFILE_ENV = "GOLDEN_TASKS_PROFILE"
DEFAULT_PROFILE = "default"
RANKS_ENV = "GOLDEN_TASKS_RANKS"
SANDBOX_ENV = "GOLDEN_TASKS_SANDBOX"
SANDBOX_MODES = ("auto", "required", "off")
HTML_ENV = "GOLDEN_TASKS_HTML"
EXECUTOR_ENV = "GOLDEN_TASKS_EXECUTOR"
EXECUTORS = ("local", "ray")
RAY_ADDRESS_ENV = "RAY_ADDRESS"  # Ray's own
NODE_STORE_ENV = "GOLDEN_TASKS_NODE_STORE"
JOURNAL_ENV = "GOLDEN_TASKS_JOURNAL"  # a doit run's journal file, which its workers append to (doit_session)

# Third-party warnings that say nothing about the user's kernels: torch's own deprecation chatter
# while it exports and unpickles programs. (start of the message, category); the tests filter the
# same (pyproject.toml, [tool.pytest.ini_options] filterwarnings). No message may hold "," or ":",
# the separators of PYTHONWARNINGS.
THIRD_PARTY_WARNINGS = (
    ("`torch.jit.script_method` is deprecated", DeprecationWarning),
    ("`isinstance(treespec", FutureWarning),
)
# Loggers of torch that speak of what does not concern a run, silenced below ERROR: a CUDA build of torch on
# a machine without a GPU logs "No CUDA runtime is found, using CUDA_HOME=..." when cpp_extension loads.
THIRD_PARTY_LOGGERS = ("torch.utils.cpp_extension",)


def quiet_third_party_logs() -> None:
    """THIRD_PARTY_LOGGERS to ERROR in this process (before torch imports them, so their first word too)."""
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def third_party_warnings_hidden():
    """quiet_third_party_warnings for the block only (`golden_tasks.run` in a user's process): the
    warning filters and PYTHONWARNINGS are restored after it."""
    given = os.environ.get("PYTHONWARNINGS")
    levels = {name: logging.getLogger(name).level for name in THIRD_PARTY_LOGGERS}
    with warnings.catch_warnings():
        quiet_third_party_warnings()
        try:
            yield
        finally:
            if given is None:
                os.environ.pop("PYTHONWARNINGS", None)
            else:
                os.environ["PYTHONWARNINGS"] = given
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def environment(values: dict):
    """The environment variables in `values` set for the block (a value of None leaves its variable as it
    is), and restored after it."""
    given = {name: os.environ.get(name) for name, value in values.items() if value is not None}
    os.environ.update({name: value for name, value in values.items() if value is not None})
    try:
        yield
    finally:
        for name, value in given.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def quiet_third_party_warnings() -> None:
    """Hide THIRD_PARTY_WARNINGS here, in the processes forked from here, and (through PYTHONWARNINGS,
    appended to what the user set) in every Python process started from here: the isolation
    forkserver, whose forks are the isolated children, and the planning subprocess. Our own
    warnings, and any other, still show."""
    options = [f"ignore:{message}:{category.__name__}" for message, category in THIRD_PARTY_WARNINGS]
    given = [o for o in os.environ.get("PYTHONWARNINGS", "").split(",") if o]
    os.environ["PYTHONWARNINGS"] = ",".join(given + [o for o in options if o not in given])
    for message, category in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", re.escape(message), category)
    quiet_third_party_logs()


def profile(known=None) -> str:
    """The active size profile: $GOLDEN_TASKS_PROFILE (set by `doit ... profile=NAME`), else "default".

    Kernel modules with sized profiles read it at import, `PROFILES[golden_tasks.profile(PROFILES)]`:
    given the names a module knows (`known`), a name not among them is a ValueError that lists them.
    The name is always checked to be a plain word, since it names the cache directory of the plans
    made under it.
    """
    name = os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE
    if not re.fullmatch(r"\w[\w.-]*", name):
        raise ValueError(f"profile {name!r} is not a name (letters, digits, _ . -)")
    if known is not None and name not in known:
        raise ValueError(f"unknown profile {name!r} (profile=NAME or ${PROFILE_ENV}); this module's profiles: "
                         f"{', '.join(sorted(known))}")
    return name


def ranks() -> int:
    """The world size every multi-rank case runs at in this run: $GOLDEN_TASKS_RANKS (set by
    `doit ... ranks=N`), else None (each case's own). Kernels with one rank are not affected."""
    text = os.environ.get(RANKS_ENV)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"ranks={text!r} is not a world size (an integer >= 1)")
    return int(text)


def planning_context() -> str:
    """The name of what plans depend on besides sources: the profile, and a world size if one is
    set (a case's specs may follow it)."""
    return profile() + (f".ranks{ranks()}" if ranks() else "")


def sandbox() -> str:
    """How kernels run ($GOLDEN_TASKS_SANDBOX, set by `doit ... sandbox=MODE`): "auto" (the default)
    confined (golden_tasks.project.sandbox) where this machine can confine a process and unconfined, said once
    per run, where it cannot; "required" refuses to run a kernel it cannot confine; "off" never confines
    (kernels you trust that must write outside: a trace, a log)."""
    return one_of(os.environ.get(SANDBOX_ENV) or "auto", SANDBOX_MODES, "sandbox")


def one_of(value: str, choices: tuple, given_as: str) -> str:
    """`value` if it is one of `choices`, else a ValueError naming it as `given_as`."""
    if value not in choices:
        raise ValueError(f"{given_as}={value!r} is not one of {', '.join(choices)}")
    return value


def executor() -> str:
    """Where the stages that must run run ($GOLDEN_TASKS_EXECUTOR, set by `doit ... executor=ray`): "local"
    (the default: here, and in doit's workers), or "ray": each as a task on the Ray cluster at $RAY_ADDRESS
    (golden_tasks.pipeline.cluster)."""
    return one_of(os.environ.get(EXECUTOR_ENV) or "local", EXECUTORS, "executor")


def node_store() -> Path:
    """Where a cluster node keeps the objects its tasks received and made: $GOLDEN_TASKS_NODE_STORE, else a
    folder of the temporary folder (one per user, shared by the node's workers)."""
    return Path(os.environ.get(NODE_STORE_ENV) or Path(tempfile.gettempdir()) / f"golden-tasks-node-{os.getuid()}")


def _switch(name: str, default: bool) -> bool:
    """An on/off environment variable: 1, true or yes; 0, false or no; anything else is `default`."""
    value = os.environ.get(name, "").lower()
    return True if value in ("1", "true", "yes") else False if value in ("0", "false", "no") else default


def readonly() -> bool:
    return _switch(READONLY_ENV, default=False)


def draws_html() -> bool:
    """Whether a doit run writes runs/report.html: yes unless $GOLDEN_TASKS_HTML is 0, false or no (the
    page takes seconds to plot whenever a case's figures changed; CI that reads only report.xml skips it)."""
    return _switch(HTML_ENV, default=True)


@dataclasses.dataclass(frozen=True)
class Project:
    """A project checkout as this process sees it: its layout, the folders of its store and its runs, and
    the store there (opened on first use). `Project.at` builds one per root, overrides and environment, once
    per process; every part of a run that needs one of the three asks it."""
    layout: Layout
    cache: Path
    runs: Path

    @property
    def root(self) -> Path:
        return self.layout.root

    @functools.cached_property
    def store(self) -> Store:
        """The store at `cache`. With GOLDEN_TASKS_CACHE_READONLY=1 nothing is written there: results this
        run computes go to a scratch overlay, shared with the processes it starts through GOLDEN_TASKS_OVERLAY
        and removed when the process that made it exits. An overlay is used only for the cache it was made
        for (its file OVERLAID names it): one inherited from an unrelated run, over another cache, would
        serve that run's objects before this cache's own, and hide their damage."""
        if not readonly():
            return Store(self.cache)
        overlay = os.environ.get(OVERLAY_ENV)
        if not overlay or _overlaid(Path(overlay)) != str(self.cache):
            overlay = tempfile.mkdtemp(prefix="golden-tasks-overlay-")
            atexit.register(shutil.rmtree, overlay, True)
            (Path(overlay) / OVERLAID).write_text(str(self.cache))
            os.environ[OVERLAY_ENV] = overlay
        return Store(self.cache, readonly=True, overlay=overlay)

    @classmethod
    def at(cls, root: Path = None, cache: Path = None, runs: Path = None) -> "Project":
        """The project at `root` (default: the current directory), its layout read from root/pyproject.toml
        (a LayoutError names what is wrong there). Its store is `cache` if given, else $GOLDEN_TASKS_CACHE,
        else the layout's `cache`, else root/cache; its runs likewise `runs`, $GOLDEN_TASKS_RUNS, the
        layout's `runs`, root/runs."""
        root = Path(root or Path.cwd()).resolve()
        key = (root, cache and Path(cache).resolve(), runs and Path(runs).resolve(), os.environ.get(CACHE_ENV),
               os.environ.get(RUNS_ENV), readonly())
        if (found := _built.get(key)) is None:
            declared = layout(root)
            found = _built[key] = cls(declared, _folder(key[1], CACHE_ENV, declared.cache, root / "cache"),
                                      _folder(key[2], RUNS_ENV, declared.runs, root / "runs"))
        return found

    @staticmethod
    def answer_folders() -> set:
        """The store and runs folders of every project this process has built, and of the one in the
        current directory, and the overlays of the read-only stores it opened: where the answers are, which
        a kernel must not read."""
        projects = (*_built.values(), Project.at())
        overlays = {p.store.overlay.root for p in projects if "store" in p.__dict__ and p.store.overlay}
        return {folder for project in projects for folder in (project.cache, project.runs)} | overlays


_built = {}  # Project.at's projects, by what they were built from
OVERLAID = "OVERLAID"  # the file in an overlay that names the cache it overlays


def _overlaid(overlay: Path) -> str | None:
    """The cache the overlay at `overlay` was made for, or None."""
    try:
        return (overlay / OVERLAID).read_text()
    except OSError:
        return None


def _folder(given: Path, env: str, declared: Path, default: Path) -> Path:
    """The first of: a folder given to Project.at, $env, the layout's, the default (all resolved)."""
    return given or Path(os.environ.get(env) or declared or default).resolve()


def apply_threads() -> int:
    """Size this process's thread pools: torch's, and OpenMP's for compiled kernels.

    AOTInductor artifacts link the system OpenMP runtime, which torch's
    set_num_threads does not reach; it reads OMP_NUM_THREADS when an artifact
    is first loaded, so set it before that.
    """
    import torch  # noqa: PLC0415 -- only in processes that run stages

    threads = torch_threads()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


def torch_threads() -> int:
    """Threads per worker: $GOLDEN_TASKS_THREADS, else the cores shared among doit's workers."""
    if os.environ.get(THREADS_ENV):
        return max(1, int(os.environ[THREADS_ENV]))
    workers = max(1, int(os.environ.get(WORKERS_ENV) or 1))
    return max(1, (os.cpu_count() or 1) // workers)
