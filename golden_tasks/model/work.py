"""The work a case asks of its kernel, counted: the bytes it must move and the FLOPs it must do.

Bytes, per rank: by default the least traffic the specs imply, every In and InOut
read once and every Out and InOut written once at their dtypes (`read`,
`written`); a case declares its own (Case.bytes) where that misleads, as a
gather that reads only some rows of a cache. FLOPs: counted by running the
golden once under torch.utils.flop_counter (stages.golden: GoldenMeta.flops), or
declared (Case.flops). The plan holds what planning knows (Plan.work); the run
record's row holds the figures (records.CaseRow.work), from which the reports
draw throughput and the fraction of the machine's limit (model.machine).
"""
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Work:
    """A case's work per rank. `read`, `written`: the specs' bytes (each In and InOut read once, each Out and
    InOut written once); `declared_bytes`, `declared_flops`: the case's own figures (Case.bytes, Case.flops),
    which are also its minimum: what the benchmark's floor holds the kernel to (stages.bench). All of them are
    totals over the case's ranks."""
    read: int = 0
    written: int = 0
    declared_bytes: int | None = None
    declared_flops: float | None = None
    dtype: str | None = None  # the floating dtype most of its bytes are in: the one its FLOP rate is taken at

    @property
    def working_set(self) -> int:
        """Bytes of every tensor it reads or writes: where on the machine's bandwidth curve it sits."""
        return self.read + self.written

    @property
    def bytes(self) -> int:
        """The bytes the work moves: the declared figure, else the specs' reads and writes."""
        return self.declared_bytes if self.declared_bytes is not None else self.read + self.written

    def flops(self, counted: float | None) -> float | None:
        """The FLOPs the work does: the declared figure, else what the golden's run counted (None: not
        counted, or 0: no floating-point work torch's counter knows, as a permutation's)."""
        return self.declared_flops if self.declared_flops is not None else (counted or None)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> "Work":
        return cls(**record)
