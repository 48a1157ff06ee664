"""Comparators: does an output match its golden, and if not, exactly where.

A comparator is a callable `(name, actual, expected, policy) -> Comparison`,
where `policy` carries the case's rtol, atol and ignore_nan. `allclose` is the
default; a case may map an output name to any other comparator.
"""
import dataclasses

import torch

FIRST_MISMATCHES = 5


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a case's outputs are judged: default tolerances and per-output comparators."""
    rtol: float
    atol: float
    ignore_nan: bool = False
    compare: dict = dataclasses.field(default_factory=dict)

    def check(self, actual: dict, expected: dict) -> list:
        """One Comparison per expected output, in order."""
        return [self.compare.get(name, allclose)(name, actual[name], want, self) for name, want in expected.items()]


@dataclasses.dataclass
class Comparison:
    """The verdict on one output, with figures for the report."""
    name: str
    passed: bool
    message: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0
    total: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _coords(flat_index: int, shape) -> tuple:
    coords = []
    for dim in reversed(shape):
        coords.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(coords))


def _describe(i, shape, a, e) -> str:
    abs_err = abs(a - e)
    rel = abs_err / abs(e) if e != 0 else float("inf") if abs_err else 0.0
    return f"{_coords(i, shape)}: actual {a:.6g}, expected {e:.6g}, abs err {abs_err:.3g}, rel err {rel:.3g}"


@dataclasses.dataclass(frozen=True)
class Allclose:
    """|actual - expected| <= atol + rtol * |expected| everywhere; NaN fails unless ignored.

    Arguments left as None take the case's policy.
    """
    rtol: float = None
    atol: float = None
    ignore_nan: bool = None

    def __call__(self, name, actual, expected, policy: Policy) -> Comparison:
        rtol = policy.rtol if self.rtol is None else self.rtol
        atol = policy.atol if self.atol is None else self.atol
        ignore_nan = policy.ignore_nan if self.ignore_nan is None else self.ignore_nan
        if tuple(actual.shape) != tuple(expected.shape):
            return Comparison(name, False, f"output {name!r}: shape {tuple(actual.shape)} "
                                           f"!= golden shape {tuple(expected.shape)}")
        shape = tuple(expected.shape)
        a = actual.detach().double().reshape(-1)
        e = expected.detach().double().reshape(-1)
        considered = ~torch.isnan(e) if ignore_nan else torch.ones_like(e, dtype=torch.bool)
        if ignore_nan and not bool(considered.any()) and e.numel():
            return Comparison(name, False, f"output {name!r}: golden is NaN everywhere; nothing to compare",
                              total=e.numel())
        diff = (a - e).abs()
        # an infinite golden matches only the same infinity (its tolerance would be infinite)
        ok = ((diff <= atol + rtol * e.abs()) & torch.isfinite(e)) | (torch.isinf(e) & (a == e)) | ~considered
        finite = considered & torch.isfinite(diff)
        max_abs = float(diff[finite].max()) if bool(finite.any()) else 0.0
        rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
        max_rel = float(rel[finite].max()) if bool(finite.any()) else 0.0
        bad = (~ok).nonzero().reshape(-1)
        total = int(considered.sum())
        if bad.numel() == 0:
            return Comparison(name, True, f"output {name!r}: {total} elements within rtol={rtol:g} atol={atol:g}",
                              max_abs, max_rel, 0, total)
        # worst: NaN/Inf first, else the largest excess over the tolerance
        excess = torch.where(torch.isfinite(diff), diff - (atol + rtol * e.abs()), torch.tensor(float("inf")))
        worst = int(bad[excess[bad].argmax()])
        lines = [f"output {name!r}: {bad.numel()}/{total} elements mismatched (rtol={rtol:g}, atol={atol:g})",
                 f"  worst at {_describe(worst, shape, float(a[worst]), float(e[worst]))}",
                 "  first mismatches:"]
        lines += [f"    {_describe(int(i), shape, float(a[i]), float(e[i]))}" for i in bad[:FIRST_MISMATCHES]]
        return Comparison(name, False, "\n".join(lines), max_abs, max_rel, bad.numel(), total)


allclose = Allclose()
