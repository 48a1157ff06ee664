"""The words a run's reports are made of, as types: a case's Verdict and a stage's StageState.

Both are str enums: a member is its word wherever text is written (JSON, JUnit, HTML, the table) and
equals it, so records written before they were types read the same; a misspelt member is an
AttributeError, and a misspelt word read from a file a ValueError (`Verdict("PAS")`)."""
import enum


class _Word(str, enum.Enum):
    """A member prints, formats and hashes as its value (an Enum's own print as Class.NAME and hash their
    name), so it is found in a dict under its word and the word under it."""
    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # str's, taking the format as str's does
    __hash__ = str.__hash__


class Verdict(_Word):
    """A case's status in a run, worst first (the order of every report's counts).
    A SKIPPED case is not a failure (pytest's rule): a run passes when no case `failed`."""
    FAIL = "FAIL"  # a stage failed, or the case could not be planned
    INCOMPLETE = "INCOMPLETE"  # the run ended before validate and bench had both answered
    SKIPPED = "SKIPPED"  # nothing to verify on this machine (the golden says why)
    PASS = "PASS"

    @property
    def failed(self) -> bool:
        return self in (Verdict.FAIL, Verdict.INCOMPLETE)


class StageState(_Word):
    """How a stage fared for a case in this run."""
    RAN = "ran"
    CACHED = "cached"
    FAILED = "FAILED"
    NOT_RUN = "-"
    SKIPPED = "skipped"  # it ran or was cached, and did no work (its entry says why)

    @property
    def reached(self) -> bool:
        """It has an entry of this run's key: it ran, or was found in the cache."""
        return self in (StageState.RAN, StageState.CACHED)


class Speed(_Word):
    """`golden-tasks compare`'s verdict on a kernel's time in run B against run A (runs_compare.judge)."""
    FASTER = "FASTER"
    SLOWER = "SLOWER"
    SAME = "SAME"
    UNCERTAIN = "UNCERTAIN"  # the noise is too large to tell
