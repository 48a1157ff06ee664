"""Where things live, overridable by environment variables, and the run's context (RunContext)."""
import atexit
import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import tempfile
import typing
import warnings
from collections.abc import Callable
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
BASELINES_ENV = "GOLDEN_TASKS_BASELINES"
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


def _profile_name(text: str, given_as: str) -> str:
    if not re.fullmatch(r"\w[\w.-]*", text):
        raise ValueError(f"{given_as} {text!r} is not a name (letters, digits, _ . -)")
    return text


def _world_size(text: str, given_as: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{given_as}={text!r} is not a world size (an integer >= 1)")
    return int(text)


def _count(text: str, given_as: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{given_as}={text!r} is not a count (an integer >= 1)")
    return max(1, int(text))


def one_of(value: str, choices: tuple, given_as: str) -> str:
    """`value` if it is one of `choices`, else a ValueError naming it as `given_as`."""
    if value not in choices:
        raise ValueError(f"{given_as}={value!r} is not one of {', '.join(choices)}")
    return value


# RunContext's fields: (the environment variable a process finds it in, how its text is read and checked)
_CONTEXT = {
    "profile": (PROFILE_ENV, _profile_name),
    "ranks": (RANKS_ENV, _world_size),
    "sandbox": (SANDBOX_ENV, lambda text, given_as: one_of(text, SANDBOX_MODES, given_as)),
    "executor": (EXECUTOR_ENV, lambda text, given_as: one_of(text, EXECUTORS, given_as)),
    "ray_address": (RAY_ADDRESS_ENV, lambda text, given_as: text),
    "baselines": (BASELINES_ENV, lambda text, given_as: one_of(text, ("0", "1"), given_as)),
    "workers": (WORKERS_ENV, _count),
    "threads": (THREADS_ENV, _count),
    "journal": (JOURNAL_ENV, lambda text, given_as: text),
}


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every process of one run agrees on: the size profile and world size its cases are planned under
    (a case's specs may follow both), how kernels are confined (sandbox), where the stages that must run run
    (executor, ray_address), how many of doit's workers share the cores (workers) or how many CPUs a stage was
    given (threads: a cluster task's), and the journal doit's workers append their outcomes to.

    It is built where a run starts, over the environment the run was started in: by the doit parent and the
    console script from their NAME=VALUE variables (planning.library.run_variables), by golden_tasks.run from its
    arguments, by a launched rank from torchrun's world size, by a cluster task from the context its driver
    sent it (pipeline.cluster.run_on_node). `enter` is the one place its settings are written to the
    environment: that is how they reach what only an environment reaches, the processes a run starts later (the
    planning subprocess, isolated children, doit's forked workers) and the user's kernel modules, which read the
    profile and world size as they import (golden_tasks.profile()). golden-tasks reads it with `current()`."""
    profile: str = DEFAULT_PROFILE
    ranks: int | None = None  # None: each case's own world size
    sandbox: str = "auto"
    executor: str = "local"
    ray_address: str | None = None
    baselines: str = "1"  # "0": the cases' baselines are left out (Case.baselines: planning.library)
    workers: int = 1
    threads: int | None = None  # None: the cores shared among the workers
    journal: str | None = None

    # the fields a run's NAME=VALUE variables set (doit's, the console script's)
    VARIABLES: typing.ClassVar[tuple] = ("profile", "ranks", "sandbox", "executor", "ray_address", "baselines")

    def given(self, get: Callable, default_profile: str | None = None, what: str = "doit variable") -> "RunContext":
        """This context with a run's variables over it (`get(name, default)` reads one: doit's get_var), each
        checked (a ValueError names it, as a `what`); `default_profile` (the project layout's) where neither
        they nor the environment name one."""
        values = {name: read(text, f"{what} {name}") for name in self.VARIABLES
                  if (text := get(name, None)) is not None for read in [_CONTEXT[name][1]]}
        if default_profile and "profile" not in values and not os.environ.get(PROFILE_ENV):
            values["profile"] = _profile_name(default_profile, "the project's profile")
        return dataclasses.replace(self, **values)

    def environment(self) -> dict:
        """Its settings as the environment variables a process started in it reads (None: unset)."""
        return {env: None if (value := getattr(self, name)) is None else str(value)
                for name, (env, _) in _CONTEXT.items()}

    def process_environment(self) -> dict:
        """The environment of a process started in this context: this process's, with its settings."""
        given = {**os.environ, **self.environment()}
        return {name: value for name, value in given.items() if value is not None}

    def threads_per_worker(self) -> int:
        """The threads a stage's thread pools get: `threads` if given, else the cores shared among the workers."""
        return self.threads or max(1, (os.cpu_count() or 1) // self.workers)


def current() -> RunContext:
    """The context of the run this process belongs to, entered here or in the process that started this one; a
    ValueError names a variable whose value is wrong. Asked for every key (toolchain): read once per value."""
    return _context_of(tuple(os.environ.get(env) for env, _ in _CONTEXT.values()))


@functools.cache
def _context_of(texts: tuple) -> RunContext:
    return RunContext(**{name: read(text, name) for (name, (_, read)), text in zip(_CONTEXT.items(), texts) if text})


def enter(context: RunContext) -> None:
    """Make `context` this process's, and that of every process it starts from now on."""
    _set_environment(context.environment())


@contextlib.contextmanager
def entered(context: RunContext):
    """`context` this process's for the block only (golden_tasks.run, in the caller's process)."""
    given = {env: os.environ.get(env) for env, _ in _CONTEXT.values()}
    enter(context)
    try:
        yield context
    finally:
        _set_environment(given)


def _set_environment(values: dict) -> None:
    """Set each variable of `values`, unsetting those whose value is None."""
    for env, value in values.items():
        if value is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = value


def profile(known=None) -> str:
    """The active size profile (RunContext.profile: `doit ... profile=NAME`, $GOLDEN_TASKS_PROFILE, the
    project's, else "default").

    Kernel modules with sized profiles read it at import, `PROFILES[golden_tasks.profile(PROFILES)]`:
    given the names a module knows (`known`), a name not among them is a ValueError that lists them.
    The name is always a plain word, since it names the cache directory of the plans made under it.
    """
    name = current().profile
    if known is not None and name not in known:
        raise ValueError(f"unknown profile {name!r} (profile=NAME or ${PROFILE_ENV}); this module's profiles: "
                         f"{', '.join(sorted(known))}")
    return name


def planning_context() -> str:
    """The name of what plans depend on besides sources: the profile, and a world size if one is
    set (a case's specs may follow it)."""
    context = current()
    return context.profile + (f".ranks{context.ranks}" if context.ranks else "")


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
    def at(cls, root: Path | str | None = None, cache: Path | str | None = None,
           runs: Path | str | None = None) -> "Project":
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
    """Size this process's thread pools, torch's and OpenMP's for compiled kernels, to the run's threads per
    worker (RunContext.threads_per_worker).

    AOTInductor artifacts link the system OpenMP runtime, which torch's
    set_num_threads does not reach; it reads OMP_NUM_THREADS when an artifact
    is first loaded, so set it before that.
    """
    import torch  # noqa: PLC0415 -- only in processes that run stages

    threads = current().threads_per_worker()
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads
