"""Failures with a verdict: reported as one clear message, without a traceback."""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .outputs import Worst


class VerificationFailure(Exception):
    """Base of the expected failures; the message names the offending thing."""


class SpecError(VerificationFailure, ValueError):
    """A spec or case that cannot be used."""


class CompileError(VerificationFailure):
    """The kernel cannot be compiled for these specs."""


class StageFailed(VerificationFailure):
    """A stage ran and its verdict is FAIL; the message is the report. `worst`: what a validation that failed
    found at worst (outputs.Worst: the figures the summary shows), else None."""

    def __init__(self, message: str, worst: "Worst | None" = None) -> None:
        super().__init__(message)
        self.worst = worst


class StalePlan(SpecError):
    """The case's source no longer matches the plan the task graph was made from."""
