"""How an output is judged: the verdict (Comparison) and what a comparator is given (Policy: the case's
tolerances and comparators; Sides: every output), the elementwise machinery the comparators share, and the
default comparator, Allclose. golden_tasks.model.compare holds the others (its docstring says what a
comparator is).
"""
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

FIRST_MISMATCHES = 5

# a comparator: (the output's name, the kernel's tensor, the golden's, the case's Policy, every output) -> verdict
Comparator = Callable[[str, torch.Tensor, torch.Tensor, "Policy", "Sides"], "Comparison"]


@dataclasses.dataclass(frozen=True)
class Sides:
    """Every output of a case, by name: the kernel's (`actual`) and the golden's (`expected`)."""
    actual: dict[str, torch.Tensor]
    expected: dict[str, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a case's outputs are judged: default float tolerances and per-output comparators."""
    rtol: float
    atol: float
    ignore_nan: bool = False
    compare: dict[str, "Comparator"] = dataclasses.field(default_factory=dict)

    def check(self, actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list["Comparison"]:
        """One Comparison per expected output, in order."""
        return [self.check_output(name, actual, expected) for name in expected]

    def check_output(self, name: str, actual: dict[str, torch.Tensor],
                     expected: dict[str, torch.Tensor]) -> "Comparison":
        """The Comparison of output `name`, with every output at hand for a paired comparator."""
        return self._one(name, actual[name], expected[name], Sides(actual, expected))

    def _one(self, name: str, actual: torch.Tensor, expected: torch.Tensor, sides: Sides) -> "Comparison":
        comparator = self.compare.get(name, allclose)
        if isinstance(comparator, type):  # `ratio_allclose` without its settings would construct, not compare
            return Comparison(name, False, f"output {name!r}: compare maps it to the class {comparator.__name__}, "
                                           f"not a comparator; call it: {comparator.__name__}(...)")
        return comparator(name, actual, expected, self, sides)


@dataclasses.dataclass
class Comparison:
    """The verdict on one output, with figures for the report; `stats` holds a
    comparator's own measured figures (JSON-able numbers)."""
    name: str
    passed: bool
    message: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatches: int = 0
    total: int = 0
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _coords(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for dim in reversed(shape):
        coords.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(coords))


def _num(x: object, digits: int = 6) -> str:
    """A value for a report: an integer exactly (2**53 + 1 stays itself), a float to `digits` significant digits."""
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _exact(t: torch.Tensor) -> bool:
    """Whether t is an integer or bool tensor: indices, counts, flags, not measurements, so exact by default."""
    return not t.is_floating_point()


def _widen(t: torch.Tensor) -> torch.Tensor:
    """t as float64, or an integer/bool t as int64: every value kept exactly (bool as 0/1)."""
    t = t.detach()
    return t.double() if t.is_floating_point() else t.long()


_INT64_MAX = torch.iinfo(torch.int64).max
_TINY = torch.finfo(torch.float64).tiny
_INT_BOUND_CAP = 2.0 ** 62  # an integer bound stays below a saturated gap (2**63 - 1): that one always fails


def _gap(a: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """|a - e| of two `_widen`ed tensors without rounding the values: float64 for floats; for int64, exact up to
    2**63 - 1 and saturating there (a - e itself can overflow int64)."""
    if a.is_floating_point():
        return (a - e).abs()
    hi, lo = torch.maximum(a, e), torch.minimum(a, e)
    # where hi - lo would pass 2**63 - 1, raise lo to hi - (2**63 - 1); clamping hi at -1 keeps that in range
    return hi - torch.maximum(lo, hi.clamp(min=-1) - _INT64_MAX)


def _bound(e: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """The tolerance atol + rtol * |e| of a `_widen`ed golden, for `_gap(a, e) <= bound`.

    The tolerances are floats, so the bound is evaluated in float64; for an
    integer golden it is then floored to an int64 (capped at 2**62), which makes
    the comparison with the integer gap exact.
    """
    bound = float(atol) + float(rtol) * e.double().abs()  # float(): an int atol past 2**63 is fine too
    return bound if e.is_floating_point() else bound.clamp(max=_INT_BOUND_CAP).floor().long()


class _Unjudgeable(Exception):
    """An output that cannot be judged at all; `verdict` is the failing Comparison (see `_Comparator`)."""

    def __init__(self, message: str, total: int = 0):
        super().__init__(message)
        self.total = total

    def verdict(self, name: str) -> "Comparison":
        return Comparison(name, False, str(self), total=self.total)


def _comparable(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Raises `_Unjudgeable` when the pair cannot be compared: shapes or dtypes differ, or a dtype the comparators
    cannot read."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise _Unjudgeable(f"output {name!r}: shape {tuple(actual.shape)} != golden shape {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise _Unjudgeable(f"output {name!r}: dtype {actual.dtype} != golden dtype {expected.dtype}")
    # torch has no uint64 arithmetic, and double() would drop a complex output's imaginary part
    if expected.dtype == torch.uint64 or expected.is_complex():
        raise _Unjudgeable(f"output {name!r}: dtype {expected.dtype} is not supported by the comparators")


def _settings(comparator: object, policy: Policy, exact: bool) -> tuple[Any, ...]:
    """(rtol, atol, ignore_nan): the comparator's own, or the policy's where it has None or no such field; the
    policy's rtol and atol are float tolerances, so an `exact` (integer or bool) output takes 0 for them instead."""
    fallback = {"rtol": 0.0 if exact else policy.rtol, "atol": 0.0 if exact else policy.atol,
                "ignore_nan": policy.ignore_nan}
    return tuple(fallback[k] if getattr(comparator, k, None) is None else getattr(comparator, k) for k in fallback)


@dataclasses.dataclass(frozen=True)
class _Flat:
    """An output and its golden `_widen`ed and flattened, with the points that are judged (`considered`) and the
    comparator's `_settings` tolerances."""
    shape: tuple[int, ...]
    a: torch.Tensor
    e: torch.Tensor
    considered: torch.Tensor
    rtol: float
    atol: float

    @classmethod
    def of(cls, comparator: object, policy: Policy, actual: torch.Tensor, expected: torch.Tensor) -> "_Flat":
        """The pair, judging every point, or with the comparator's ignore_nan those where the golden is not NaN."""
        rtol, atol, ignore_nan = _settings(comparator, policy, _exact(expected))
        a, e = _widen(actual).reshape(-1), _widen(expected).reshape(-1)
        considered = ~torch.isnan(e) if ignore_nan else torch.ones_like(e, dtype=torch.bool)
        return cls(tuple(expected.shape), a, e, considered, rtol, atol)

    @functools.cached_property
    def gap(self) -> torch.Tensor:
        return _gap(self.a, self.e)

    @functools.cached_property
    def bound(self) -> torch.Tensor:
        return _bound(self.e, self.rtol, self.atol)

    @property
    def excess(self) -> torch.Tensor:
        """How far each point is past its bound; NaN/Inf differences rank worst."""
        over = self.gap - self.bound
        return torch.where(torch.isfinite(self.gap), over, math.inf) if over.is_floating_point() else over

    @property
    def total(self) -> int:
        return int(self.considered.sum())

    @functools.cached_property
    def maxima(self) -> tuple[float, float]:
        """(max abs err, max rel err) over the considered points where the difference is finite."""
        finite = self.considered & torch.isfinite(self.gap)
        if not bool(finite.any()):
            return 0.0, 0.0
        gap = self.gap[finite].double()
        return float(gap.max()), float((gap / self.e[finite].double().abs().clamp_min(_TINY)).max())

    def describe(self, i: int) -> str:
        """Point i: coordinates, values and errors (integers exact: Python ints)."""
        a, e = self.a[i].item(), self.e[i].item()
        abs_err = abs(a - e)
        rel = abs_err / abs(e) if e != 0 else math.inf if abs_err else 0.0
        return (f"{_coords(i, self.shape)}: actual {_num(a)}, expected {_num(e)}, abs err {_num(abs_err, 3)}, "
                f"rel err {rel:.3g}")

    def listing(self, bad: torch.Tensor, score: torch.Tensor) -> list[str]:
        """Report lines for the `bad` flat indices: the one with the highest `score`, then the first few."""
        worst = int(bad[score[bad].argmax()])
        return ([f"  worst at {self.describe(worst)}", "  first mismatches:"]
                + [f"    {self.describe(int(i))}" for i in bad[:FIRST_MISMATCHES]])

    def verdict(self, name: str, passed: bool, lines: list[str], bad: torch.Tensor, stats: dict[str, Any],
                score: torch.Tensor | None = None) -> "Comparison":
        """The Comparison with `lines` as its message, to which a failure adds the `listing` of its `bad` points
        ranked by `score` (None: `excess`)."""
        if not passed and bad.numel():
            lines = lines + self.listing(bad, self.excess if score is None else score)
        return Comparison(name, passed, "\n".join(lines), *self.maxima, bad.numel(), self.total, stats)

    def nonfinite(self) -> list[str]:
        """Hard-failure lines for NaN/Inf among the considered points, one per side that has any."""
        lines = []
        for side, t in (("actual", self.a), ("golden", self.e)):  # not a stage: the expected side
            where = (self.considered & ~torch.isfinite(t)).nonzero().reshape(-1)
            if where.numel():
                first = ", ".join(str(_coords(int(i), self.shape)) for i in where[:FIRST_MISMATCHES])
                lines.append(f"  hard failure: {where.numel()} NaN/Inf in the {side}, first at {first}")
        return lines


def _judged(comparator: object, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy) -> _Flat:
    """The `_Flat` pair of two `_comparable` tensors; raises `_Unjudgeable` when ignore_nan leaves nothing of a
    non-empty golden."""
    pair = _Flat.of(comparator, policy, actual, expected)
    if pair.e.numel() and not bool(pair.considered.any()):
        raise _Unjudgeable(f"output {name!r}: golden is NaN everywhere; nothing to compare", pair.e.numel())
    return pair


def _pair(comparator: object, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy) -> _Flat:
    """`_judged` of a pair that is first checked `_comparable`."""
    _comparable(name, actual, expected)
    return _judged(comparator, name, actual, expected, policy)


class _Comparator:
    _judge: "Comparator"  # each subclass's own check (compare.py)

    """The comparators' base (it adds no fields: they pickle and fingerprint by their own). Their checks that an
    output can be judged at all raise `_Unjudgeable`; `__call__` runs the subclass's `_judge` and makes that the
    failing Comparison, so no `_judge` tests for an early verdict after each check."""

    def __call__(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
                 outputs: Sides) -> Comparison:
        try:
            return self._judge(name, actual, expected, policy, outputs)
        except _Unjudgeable as why:
            return why.verdict(name)


@dataclasses.dataclass(frozen=True)
class Allclose(_Comparator):
    """|actual - expected| <= atol + rtol * |expected| everywhere; NaN fails unless ignored.

    Arguments left as None take the case's policy, except that an integer or
    bool output takes rtol = atol = 0 (the policy's are float tolerances): it
    must equal its golden exactly unless this comparator sets a tolerance,
    which then bounds the exact integer difference (see `_bound`).
    """
    rtol: float | None = None
    atol: float | None = None
    ignore_nan: bool | None = None

    def _judge(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
               outputs: Sides) -> Comparison:
        pair = _pair(self, name, actual, expected, policy)
        a, e, rtol, atol = pair.a, pair.e, pair.rtol, pair.atol
        # an infinite golden matches only the same infinity (its tolerance would be infinite)
        ok = ((pair.gap <= pair.bound) & torch.isfinite(e)) | (torch.isinf(e) & (a == e)) | ~pair.considered
        bad = (~ok).nonzero().reshape(-1)
        line = (f"output {name!r}: {bad.numel()}/{pair.total} elements mismatched (rtol={rtol:g}, atol={atol:g})"
                if bad.numel() else f"output {name!r}: {pair.total} elements within rtol={rtol:g} atol={atol:g}")
        return pair.verdict(name, not bad.numel(), [line], bad, {})


allclose = Allclose()
