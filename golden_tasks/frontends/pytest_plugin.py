"""The pytest plugin (entry point pytest11): in a project whose pyproject.toml has a [tool.golden-tasks]
table, `pytest` collects every kernel case as a test item of its module, `path/to/module.py::CASE`, and every
case of a dataset the table names as an item of the table's file, `pyproject.toml::CASE`.

Control flow: pytest_collect_file sees a kernel module of the project's layout (on pytest's own walk of
the paths it was given) -> KernelModule.collect yields a CaseItem per case that module planned ->
CaseItem.runtest runs the case through the graph (runner.verify: each stage reused from the project's
cache, or computed) -> a FAIL raises CaseFailed, whose message is the stage's report (the mismatch
report of validate), a SKIPPED case skips with its reason. Under pytest-xdist the workers share the
cache, whose per-key lock makes one process compute an entry that two cases share while the other
waits for it. Planning runs once per process, in a subprocess, from the cached plan manifests.
"""
import functools
from pathlib import Path

import pytest

from ..model.verdicts import Verdict
from ..project.config import Project
from ..project.layout import LayoutError


class CaseFailed(Exception):
    """A case did not pass; the message is every failing stage's report."""


@functools.cache
def _library(root: Path):
    from ..planning.library import Library  # noqa: PLC0415 -- only in a project with kernel cases

    return Library(root, lambda name, default: default)


def pytest_configure(config):
    try:
        Project.at(config.rootpath)  # reads the layout: a malformed table is an error before collection
    except LayoutError as exc:  # a usage error: one line, no traceback
        raise pytest.UsageError(str(exc)) from None


def pytest_collect_file(file_path: Path, parent):
    root = parent.config.rootpath
    layout = Project.at(root).layout
    if not layout.configured:
        return None
    if file_path.resolve() == layout.root / "pyproject.toml" and layout.datasets:  # the datasets it names
        return KernelModule.from_parent(parent, path=file_path, modules=tuple(d.module for d in layout.datasets))
    for module in layout.modules() if file_path.suffix == ".py" else ():
        if module.path == file_path.resolve():
            return KernelModule.from_parent(parent, path=file_path, modules=(module.name,))
    return None


class KernelModule(pytest.File):
    """A kernel module, or the pyproject.toml that names datasets: the cases of `modules`, as planned."""

    def __init__(self, *, modules: tuple, **kwargs):
        super().__init__(**kwargs)
        self.modules = modules

    def collect(self):
        for plan in _library(self.config.rootpath).plans.values():
            if plan.module in self.modules:
                yield CaseItem.from_parent(self, name=plan.case)


class CaseItem(pytest.Item):
    """One kernel case, verified through the graph and the project's cache."""

    def runtest(self):
        from ..pipeline import cluster  # noqa: PLC0415
        from ..pipeline.runner import verify  # noqa: PLC0415 -- imports torch

        root = self.config.rootpath
        library = _library(root)
        plan = library.plans[self.name]
        row, _ = verify(plan, library.store, library.project.runs / self.name, producer=cluster.producer(root),
                        declared=library.project.layout.machine)
        if row.status == Verdict.SKIPPED:  # reported at the case's module, not at this line
            raise pytest.skip.Exception(row.skipped, _use_item_location=True)
        if row.status != Verdict.PASS:
            errors = row.errors or {"": f"{self.name} is {row.status}"}
            raise CaseFailed("\n".join(f"{stage}: {message}" if stage else message
                                       for stage, message in errors.items()))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"kernel case {self.name}"
