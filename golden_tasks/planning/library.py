"""A project's kernel library as planned for one run: its plans with the run's variables
applied (doit's `NAME=VALUE` arguments, or the console script's), and its store.

Used by the doit adapter and the `golden-tasks` console script alike; imports
neither doit nor torch.
"""
import dataclasses
import difflib
from collections.abc import Callable
from pathlib import Path

from ..model.plan import VARIABLES, FailedPlan, Plan
from ..project import config
from .discover import load_plans


def run_variables(root: Path, get: Callable, workers: int | None = None) -> dict:
    """The run's variables that override plan fields (name -> text), each checked: a bad value
    is a ValueError naming it, whether or not any case exists. `get(name, default)` reads one.
    The run's context (config.RunContext: profile=NAME, ranks=N, sandbox=, executor=, ray_address=, and
    `workers`, doit's -n) is entered here, where a run starts. The project's layout gives the profile and
    backend a run does not (below $GOLDEN_TASKS_PROFILE too)."""
    project = config.Project.at(root).layout
    context = config.current().given(get, project.profile)
    config.enter(dataclasses.replace(context, workers=workers) if workers else context)
    values = {name: value for name in VARIABLES if (value := get(name, None)) is not None}
    if project.backend and "backend" not in values:
        values["backend"] = project.backend
    Plan().overridden(values)
    return values


def unknown_variables(names, own=()) -> str:
    """Why some of the NAME=VALUE `names` are read by no one ("" if all are known: ours, or `own`, a
    dodo.py's own), with the nearest known name: doit would ignore them, so a misspelt `timout=5` would
    change nothing in silence."""
    known = {*VARIABLES, *config.RunContext.VARIABLES, *own}
    unknown = [name for name in names if name not in known]
    hints = [name + (f" (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, n=1,
                                                                                            cutoff=0.6)) else "")
             for name in unknown]
    return f"unknown doit variable{'s' * (len(unknown) > 1)} {', '.join(hints)}" if unknown else ""


# The variables a baseline's plan keeps its own value of: it is compiled as its form says (Case.baselines).
AS_DECLARED = ("backend", "options")


def planned_library(root: Path, store, values: dict) -> dict:
    """case -> Plan or FailedPlan, with the variables applied and duplicate case names made failures. A baseline's
    plan follows its case's (discover lists it after it): it shares its nonce, so that the stages it shares have
    the same keys in both, and fails where its case does."""
    plans: dict = {}
    timed = config.current().baselines == "1"  # baselines=0: the kernels alone
    for plan in load_plans(root, store):
        if plan.baseline_of and not timed:
            continue
        if plan.baselines and not timed:
            plan = dataclasses.replace(plan, baselines=[])
        if plan.case in plans:
            plan = FailedPlan(plan.case, plan.module, f"case {plan.case!r} is defined in both {plan.module} "
                                                      f"and {plans[plan.case].module}", plan.profile)
        if not plan.error and plan.baseline_of:
            if (case := plans.get(plan.baseline_of)) is None or case.error:
                plan = FailedPlan(plan.case, plan.module, f"its case {plan.baseline_of!r} could not be planned",
                                  plan.profile)
            else:
                own = {name: value for name, value in values.items() if name not in AS_DECLARED}
                plan = plan.overridden(own).in_run_of(case)
        elif not plan.error:
            plan = plan.overridden(values).for_this_run()
        plans[plan.case] = plan
    for name, plan in plans.items():  # verify:<sweep> verifies its points: no case may have a sweep's name
        if plan.sweep_of in plans and not plans[plan.sweep_of].sweep_of:  # then verify:<that name> is the case's
            plans[name] = FailedPlan(name, plan.module, f"its sweep's name {plan.sweep_of!r} is also a case's, "
                                     f"in {plans[plan.sweep_of].module}", plan.profile)
    return plans


class Library:
    """The planned kernel library of one project checkout, with its store."""

    def __init__(self, root: Path, get: Callable, workers: int | None = None):
        self.root, self.project = root, config.Project.at(root)
        self.project.layout.importable()  # the kernel modules import by name here and in every process started after
        values = run_variables(root, get, workers)
        self.store = self.project.store
        self.plans = planned_library(root, self.store, values)

    def ok(self) -> list:
        return [p for p in self.plans.values() if not p.error]

    def kernels(self) -> list:
        """Every plan but the baselines' (a baseline has no runtime dir and no replay), failed ones included."""
        return [p for p in self.plans.values() if not p.baseline_of]

    def sweeps(self) -> dict[str, list[str]]:
        """Each sweep's name -> its points' cases (their baselines left out), in order (Case.sweep)."""
        found: dict[str, list[str]] = {}
        for plan in self.plans.values():
            if plan.sweep_of and not plan.baseline_of:
                found.setdefault(plan.sweep_of, []).append(plan.case)
        return found

    def unplanned(self) -> list:
        """The failed plans of kernel modules that could not be imported or planned at all (named by the
        module's stem: their cases are not known)."""
        return [p for p in self.plans.values() if p.error and p.module and p.case == p.module.rpartition(".")[2]]
