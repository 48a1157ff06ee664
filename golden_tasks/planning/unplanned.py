"""What a dataset's reader makes besides cases: a name a task may take (task_name), and a case it could not make
(Unplanned: a file it cannot read, a workload that does not fit its definition), which planning fails alone,
naming why (planning.discover makes it a FailedPlan)."""
import dataclasses
import re


def task_name(name: str) -> str:
    """`name` as a case's, hence a doit task's, name may hold it: letters, digits, '_', '.' and '-'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name)) or "_"


@dataclasses.dataclass(frozen=True)
class Unplanned:
    """The case `name` (a point of sweep `sweep_of`, where it is one) and why it could not be made."""
    name: str
    error: str
    sweep_of: str = None
