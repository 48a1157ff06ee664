"""ABI check: the spec list against the kernel's declared parameter table.

Names (both set differences), order (compared, never repaired by name), kind,
and, where the table declares them, dtype and shape (None is a dynamic dim);
scalars must be In. Every mismatch is collected into one message, before any
tensor is allocated. The output is the table stamped with directions: what the
kernel takes (on each rank, for a multi-rank kernel: a stacked tensor's slice),
and the placement of resident tensors across ranks.
"""
from ..model.outputs import AbiMeta, Upstream
from ..model.rows import STACKED, ParamRow, SignatureRow, placement_of, stamped_table
from . import Outputs, StageFailed


def problems(params: list[ParamRow], signature: list[SignatureRow], ranks: int = 1) -> list:
    declared = [p.name for p in params]
    given = [s.name for s in signature]
    found = []
    missing, extra = [n for n in declared if n not in given], [n for n in given if n not in declared]
    # one line: the summary shows the first, and the two halves together say what to rename
    names = [f"kernel parameters with no spec: {', '.join(missing)}"] * bool(missing) + \
        [f"specs that are not kernel parameters: {', '.join(extra)}"] * bool(extra)
    if names:
        found.append("; ".join(names) + (" (a spec is named as its kernel parameter)" if missing and extra else ""))
    if not missing and not extra and declared != given:
        found.append(f"order differs: kernel ({', '.join(declared)}) vs specs ({', '.join(given)})")
    specs = {s.name: s for s in signature}
    for p in params:
        s = specs.get(p.name)
        if s is None:
            continue
        where = f"parameter {p.name!r}"
        if p.kind != s.kind:
            found.append(f"{where}: kernel declares a {p.kind}, spec is a {s.kind}")
        if p.by_value and p.direction != "in":
            found.append(f"{where}: a scalar must be In, kernel declares {p.direction}")
        if p.dtype is not None and p.dtype != s.dtype:
            found.append(f"{where}: kernel expects dtype {p.dtype}, spec has {s.dtype}")
        # shapes shown as lists, as the JSON of a plan and the kernel's declaration write them
        sliced = f", whose slice per rank is {list(s.rank_shape)}" if s.rank_shape != s.shape else ""
        if p.shape is not None:
            if len(p.shape) != len(s.rank_shape):
                found.append(f"{where}: kernel expects rank {len(p.shape)}, spec has shape {list(s.shape)}{sliced}")
            elif any(d is not None and d != g for d, g in zip(p.shape, s.rank_shape)):
                found.append(f"{where}: kernel expects shape {list(p.shape)}, spec has {list(s.shape)}{sliced}")
    return found + placement_problems(signature, ranks)


def placement_problems(signature: list[SignatureRow], ranks: int) -> list:
    """Resident specs that do not fit the world size: a stacked one needs one leading slice per
    rank, a rank-resident one a rank that exists."""
    found = []
    for s in signature:
        if s.resident == STACKED and s.shape[0] != ranks:
            found.append(f"spec {s.name!r}: resident={STACKED!r} needs leading dim {ranks} (one slice per "
                         f"rank of world size {ranks}), spec has shape {list(s.shape)}")
        elif isinstance(s.resident, int) and s.resident >= ranks:
            found.append(f"spec {s.name!r}: resident={s.resident} names a rank outside world size {ranks}")
    return found


def run(case, plan, workdir, upstream: Upstream) -> Outputs:
    found = problems(plan.params, plan.signature, plan.ranks)
    if found:
        raise StageFailed(f"ABI mismatch for {plan.case}:\n  " + "\n  ".join(found))
    return Outputs(meta=AbiMeta(table=stamped_table(plan.params, plan.signature),
                                placement=placement_of(plan.signature)))
