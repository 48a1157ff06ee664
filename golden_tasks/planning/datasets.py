"""The cases of a kernel module or of a dataset ([[tool.golden-tasks.datasets]], project.layout.Dataset): the one
place that knows which reader makes a dataset's cases (flashinfer_trace, kernelbench). Planning and live_case ask
it, so a dataset's cases are planned, re-planned and found again as a module's are."""
import importlib

from ..project import config
from ..project.layout import KERNELBENCH
from .case import module_cases


def cases_of(module: str, dataset=None, only: str = None) -> tuple:
    """(the module, or None for a dataset; its cases: Case, or for a dataset also Unplanned) of kernel module or
    dataset `module` (a plan's `module`), `dataset` its Dataset where the caller has it (else the project's);
    `only`: a dataset's case or sweep of that name alone, where the caller needs no other (the whole module's
    cases are a kernel module's)."""
    if dataset is None and ":" not in module:
        imported = importlib.import_module(module)
        return imported, module_cases(imported)
    if dataset is None:
        dataset = next((d for d in config.Project.at().layout.datasets if d.module == module), None)
        if dataset is None:
            raise LookupError(f"dataset {module!r} is no longer in the project's [[tool.golden-tasks.datasets]]")
    if dataset.format == KERNELBENCH:
        from . import kernelbench  # noqa: PLC0415

        return None, kernelbench.cases(dataset, only)
    from . import flashinfer_trace  # noqa: PLC0415

    return None, flashinfer_trace.cases(dataset, only)
