"""A kernel named by import path (`Case(kernel="package.module:function")`), so that trusted code never
imports its module: the trust boundary of docs/threat-model.md.

The case's module (its golden, specs, comparators, policy) is trusted; the kernel's module is not. Only
processes that run the kernel's code import it, confined (golden_tasks.project.sandbox): planning asks a confined
probe for what the plan needs of the kernel (its name, world size, parameter table and fingerprint), and
compile, dispatch and bench load it in their confined children. The trusted stages (inputs, golden,
validate) take those facts from the plan and never import it.

The probe answers in JSON, checked field by field here: nothing of its process's making is unpickled
in the caller.
"""
import dataclasses
import importlib
import json
import traceback

from ..model.errors import SpecError
from ..model.rows import ParamRow, as_json, rows_field, rows_from_json
from .base import KernelForm

PROBE_TIMEOUT_S = 300.0  # importing the kernel's module (and torch's compilers) and fingerprinting it


def _parse(path: str, owner: str) -> tuple:
    module, colon, attribute = path.partition(":")
    if not (colon and module and attribute.isidentifier()
            and all(part.isidentifier() for part in module.split("."))):
        raise SpecError(f"{owner}: kernel={path!r} is not an import path such as 'package.module:function'")
    return module, attribute


def load(path: str, owner: str) -> KernelForm:
    """The kernel form at `path`, imported here (a confined process: the kernel's module runs)."""
    module_name, attribute = _parse(path, owner)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise SpecError(f"{owner}: kernel={path!r}: cannot import {module_name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 -- the module's own code failed: its message and where
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise SpecError(f"{owner}: kernel={path!r}: importing {module_name} raised {type(exc).__name__}: {exc} "
                        f"({where.filename}:{where.lineno})") from None
    form = getattr(module, attribute, None)
    if not isinstance(form, KernelForm):
        raise SpecError(f"{owner}: kernel={path!r} is not a kernel form (a @jit or @cpp function), "
                        f"got {type(form).__name__}")
    return form


@dataclasses.dataclass(frozen=True)
class KernelFacts:
    """What trusted code knows of an untrusted kernel: its world size, parameter table, fingerprint
    (digest and parts) and the files the fingerprint read. A plan records the first two alone: facts
    without a digest stand for a kernel already planned (case.live_case)."""
    ranks: int
    params: list[ParamRow] = rows_field(ParamRow, required=True)
    digest: str = ""
    parts: dict = dataclasses.field(default_factory=dict)
    files: list = dataclasses.field(default_factory=list)
    volatile: list = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(as_json(self))

    @classmethod
    def from_json(cls, text, path: str) -> "KernelFacts":
        """The probe's answer, each field of the type the plan holds, or a SpecError (naming the parameter
        table's malformed row and field, where that is what is wrong)."""
        try:
            facts = cls(**json.loads(text))
            ok = (type(facts.ranks) is int and facts.ranks >= 1 and isinstance(facts.digest, str)
                  and isinstance(facts.parts, dict) and all(isinstance(v, str) for v in facts.parts.values())
                  and all(isinstance(f, str) for f in (*facts.files, *facts.volatile)))
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise SpecError(f"kernel={path!r}: its probe did not answer with its facts")
        try:
            return dataclasses.replace(facts, params=rows_from_json(ParamRow, facts.params, "params"))
        except ValueError as exc:
            raise SpecError(f"kernel={path!r}: its probe answered a malformed parameter table: {exc}") from None


def facts_of(path: str, owner: str) -> str:
    """What planning needs of the kernel at `path`, as KernelFacts' JSON: runs in the confined probe."""
    from ..project.fingerprint import Fingerprinter  # noqa: PLC0415 -- imports torch
    from ..project.fingerprint_parts import parts  # noqa: PLC0415 -- as above

    form = load(path, owner)
    fingerprinter = Fingerprinter()
    digest = fingerprinter(form)
    return KernelFacts(form.ranks, form.params(), digest, parts(form, fingerprinter), sorted(fingerprinter.files),
                       sorted(fingerprinter.volatile)).to_json()


class KernelRef(KernelForm):
    """The kernel at an import path, known to trusted code by `facts` alone: given (from a plan), or
    asked of a confined probe, or, in a confined process, read from the kernel itself."""
    untrusted = True

    def __init__(self, path: str, owner: str, facts: KernelFacts = None):
        _parse(path, owner)
        self.path, self.owner, self._facts = path, owner, facts
        self.name = path.partition(":")[2]

    def facts(self) -> KernelFacts:
        if self._facts is None:
            from . import isolate  # noqa: PLC0415 -- imports torch

            if isolate.confined_here():
                text = facts_of(self.path, self.owner)
            else:
                text = isolate.call(facts_of, (self.path, self.owner), PROBE_TIMEOUT_S,
                                    f"the probe of kernel {self.path!r} ({self.owner})", isolate.confinement(()))
            self._facts = KernelFacts.from_json(text, self.path)
        return self._facts

    @property
    def ranks(self) -> int:
        return self.facts().ranks

    def params(self) -> list:
        return list(self.facts().params)

    def compile(self, specs, options, workdir):
        return load(self.path, self.owner).compile(specs, options, workdir)

    def __fingerprint__(self, fingerprinter) -> dict:
        """The kernel's own fingerprint and its parts, as the probe computed them; the files it read
        are the plan's to watch."""
        facts = self.facts()
        fingerprinter.files.update(facts.files)
        fingerprinter.volatile.extend(facts.volatile)
        return {"import path": self.path, "kernel": facts.digest, **facts.parts}
