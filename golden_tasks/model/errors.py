"""Failures with a verdict: reported as one clear message, without a traceback."""


class VerificationFailure(Exception):
    """Base of the expected failures; the message names the offending thing."""


class SpecError(VerificationFailure, ValueError):
    """A spec or case that cannot be used."""


class CompileError(VerificationFailure):
    """The kernel cannot be compiled for these specs."""


class StageFailed(VerificationFailure):
    """A stage ran and its verdict is FAIL; the message is the report. `max_abs`: the largest absolute
    error of a validation that failed (the figure the summary shows), else None."""

    def __init__(self, message: str, max_abs: float = None):
        super().__init__(message)
        self.max_abs = max_abs


class StalePlan(SpecError):
    """The case's source no longer matches the plan the task graph was made from."""
