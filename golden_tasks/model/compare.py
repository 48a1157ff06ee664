"""Comparators: does an output match its golden, and if not, exactly where.

A comparator is a callable `(name, actual, expected, policy, outputs) ->
Comparison`: `policy` carries the case's rtol, atol and ignore_nan, and
`outputs` (a `Sides`) holds every actual and golden output of the case, so a
comparator can read a paired output (top-k indices with their scores).
`allclose` is the default; a case may map an output name to any other
comparator. The parameterised ones are frozen dataclasses with plain fields, so
they pickle into policy.pkl and fingerprint by their field values; their
lowercase names are the classes, called with the settings:
`compare={"o": ratio_allclose(max_error_ratio=1e-3)}`.

Integer and bool outputs are judged exactly: the policy's rtol and atol are
float tolerances and do not apply to them, differences are taken in integers
(never through float64, where 2**53 + 1 == 2**53), and reports print their
values exactly. A tolerance for one is opt-in: `Allclose(atol=1)`. An output
whose dtype differs from its golden's fails.
"""
import dataclasses
import functools
import math

import torch

FIRST_MISMATCHES = 5


@dataclasses.dataclass(frozen=True)
class Sides:
    """Every output of a case, by name: the kernel's (`actual`) and the golden's (`expected`)."""
    actual: dict
    expected: dict


@dataclasses.dataclass(frozen=True)
class Policy:
    """How a case's outputs are judged: default float tolerances and per-output comparators."""
    rtol: float
    atol: float
    ignore_nan: bool = False
    compare: dict = dataclasses.field(default_factory=dict)

    def check(self, actual: dict, expected: dict) -> list:
        """One Comparison per expected output, in order."""
        return [self.check_output(name, actual, expected) for name in expected]

    def check_output(self, name: str, actual: dict, expected: dict) -> "Comparison":
        """The Comparison of output `name`, with every output at hand for a paired comparator."""
        return self._one(name, actual[name], expected[name], Sides(actual, expected))

    def _one(self, name, actual, expected, sides) -> "Comparison":
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
    stats: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _coords(flat_index: int, shape) -> tuple:
    coords = []
    for dim in reversed(shape):
        coords.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(coords))


def _num(x, digits: int = 6) -> str:
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


def _settings(comparator, policy: Policy, exact: bool) -> tuple:
    """(rtol, atol, ignore_nan): the comparator's own, or the policy's where it has None or no such field; the
    policy's rtol and atol are float tolerances, so an `exact` (integer or bool) output takes 0 for them instead."""
    fallback = {"rtol": 0.0 if exact else policy.rtol, "atol": 0.0 if exact else policy.atol,
                "ignore_nan": policy.ignore_nan}
    return tuple(fallback[k] if getattr(comparator, k, None) is None else getattr(comparator, k) for k in fallback)


@dataclasses.dataclass(frozen=True)
class _Flat:
    """An output and its golden `_widen`ed and flattened, with the points that are judged (`considered`) and the
    comparator's `_settings` tolerances."""
    shape: tuple
    a: torch.Tensor
    e: torch.Tensor
    considered: torch.Tensor
    rtol: float
    atol: float

    @classmethod
    def of(cls, comparator, policy: Policy, actual: torch.Tensor, expected: torch.Tensor) -> "_Flat":
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
    def maxima(self) -> tuple:
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

    def listing(self, bad, score) -> list:
        """Report lines for the `bad` flat indices: the one with the highest `score`, then the first few."""
        worst = int(bad[score[bad].argmax()])
        return ([f"  worst at {self.describe(worst)}", "  first mismatches:"]
                + [f"    {self.describe(int(i))}" for i in bad[:FIRST_MISMATCHES]])

    def verdict(self, name: str, passed: bool, lines: list, bad, stats: dict, score=None) -> "Comparison":
        """The Comparison with `lines` as its message, to which a failure adds the `listing` of its `bad` points
        ranked by `score` (None: `excess`)."""
        if not passed and bad.numel():
            lines = lines + self.listing(bad, self.excess if score is None else score)
        return Comparison(name, passed, "\n".join(lines), *self.maxima, bad.numel(), self.total, stats)

    def nonfinite(self) -> list:
        """Hard-failure lines for NaN/Inf among the considered points, one per side that has any."""
        lines = []
        for side, t in (("actual", self.a), ("golden", self.e)):
            where = (self.considered & ~torch.isfinite(t)).nonzero().reshape(-1)
            if where.numel():
                first = ", ".join(str(_coords(int(i), self.shape)) for i in where[:FIRST_MISMATCHES])
                lines.append(f"  hard failure: {where.numel()} NaN/Inf in the {side}, first at {first}")
        return lines


def _judged(comparator, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy) -> _Flat:
    """The `_Flat` pair of two `_comparable` tensors; raises `_Unjudgeable` when ignore_nan leaves nothing of a
    non-empty golden."""
    pair = _Flat.of(comparator, policy, actual, expected)
    if pair.e.numel() and not bool(pair.considered.any()):
        raise _Unjudgeable(f"output {name!r}: golden is NaN everywhere; nothing to compare", pair.e.numel())
    return pair


def _pair(comparator, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy) -> _Flat:
    """`_judged` of a pair that is first checked `_comparable`."""
    _comparable(name, actual, expected)
    return _judged(comparator, name, actual, expected, policy)


class _Comparator:
    """The comparators' base (it adds no fields: they pickle and fingerprint by their own). Their checks that an
    output can be judged at all raise `_Unjudgeable`; `__call__` runs the subclass's `_judge` and makes that the
    failing Comparison, so no `_judge` tests for an early verdict after each check."""

    def __call__(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
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
    rtol: float = None
    atol: float = None
    ignore_nan: bool = None

    def _judge(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
        pair = _pair(self, name, actual, expected, policy)
        a, e, rtol, atol = pair.a, pair.e, pair.rtol, pair.atol
        # an infinite golden matches only the same infinity (its tolerance would be infinite)
        ok = ((pair.gap <= pair.bound) & torch.isfinite(e)) | (torch.isinf(e) & (a == e)) | ~pair.considered
        bad = (~ok).nonzero().reshape(-1)
        line = (f"output {name!r}: {bad.numel()}/{pair.total} elements mismatched (rtol={rtol:g}, atol={atol:g})"
                if bad.numel() else f"output {name!r}: {pair.total} elements within rtol={rtol:g} atol={atol:g}")
        return pair.verdict(name, not bad.numel(), [line], bad, {})


allclose = Allclose()


def _leading(name, shape, rows, axis) -> tuple:
    """(axis, rows) with the axis made non-negative; raises `_Unjudgeable` when either is out of range."""
    if not -len(shape) <= axis < len(shape):
        raise _Unjudgeable(f"output {name!r}: valid_axis={axis} is not an axis of shape {shape}")
    axis %= len(shape)
    if not 0 <= rows <= shape[axis]:
        raise _Unjudgeable(f"output {name!r}: valid_rows={rows} outside 0..{shape[axis]} "
                           f"(axis {axis} of shape {shape})")
    return axis, rows


def _tail_line(actual, axis, rows):
    """None when the actual is exactly 0 at every index >= rows along axis, else the failure line."""
    tail = actual.detach().narrow(axis, rows, actual.shape[axis] - rows)
    where = (tail != 0).nonzero()  # NaN != 0: a NaN in the tail counts
    if not len(where):
        return None
    where[:, axis] += rows  # tail coordinates -> full-tensor coordinates
    first = tuple(where[0].tolist())
    return (f"  {len(where)}/{tail.numel()} elements of the tail (index >= {rows} along axis {axis}) are not 0, "
            f"first at {first}: {_num(actual[first].item())}")


@dataclasses.dataclass(frozen=True)
class RatioAllclose(_Comparator):
    """Allclose that tolerates a fraction of bad points: passes when bad/considered <= max_error_ratio.

    A point is bad when |actual - expected| > atol + rtol * |expected|. Only the
    leading `valid_rows` indices along `valid_axis` are compared (None: the
    whole tensor; 0: nothing, which passes with "0 rows compared" unless the
    zero-tail check fails). `zero_tail` also requires the actual to be exactly 0
    at every index >= valid_rows along valid_axis (no tail when valid_rows is
    None). Hard failures, whatever the ratio: NaN/Inf among the compared points
    on either side. `ignore_nan` drops the points where the golden is NaN and
    fails when that leaves nothing of a non-empty region. rtol, atol and
    ignore_nan left as None take the case's policy, rtol and atol as in
    `Allclose` (an integer or bool output takes 0: exact).
    stats: error_ratio, bad, considered, max_abs, max_rel.
    """
    atol: float = None
    rtol: float = None
    max_error_ratio: float = 0.005
    valid_rows: int = None
    valid_axis: int = 0
    zero_tail: bool = False
    ignore_nan: bool = None

    def _judge(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
        if self.valid_rows is None:
            return self._ratio(name, _pair(self, name, actual, expected, policy))
        _comparable(name, actual, expected)  # first: a shape that differs is named as such, not as a bad axis
        axis, rows = _leading(name, tuple(expected.shape), self.valid_rows, self.valid_axis)
        try:  # the leading slice's coordinates are the full tensor's
            result = self._ratio(name, _judged(self, name, *(t.narrow(axis, 0, rows) for t in (actual, expected)),
                                               policy))
        except _Unjudgeable as why:  # a golden NaN everywhere in the slice: the tail is still checked
            result = why.verdict(name)
        if rows == 0:
            result = dataclasses.replace(result, message=f"output {name!r}: 0 rows compared "
                                                         f"(valid_rows=0 along axis {axis})")
        tail = _tail_line(actual, axis, rows) if self.zero_tail else None
        if tail:
            result = dataclasses.replace(result, passed=False, message=f"{result.message}\n{tail}")
        return result

    def _ratio(self, name, pair: _Flat) -> Comparison:
        """The verdict on the pair that is compared (all of it, or the leading rows)."""
        bad = (pair.considered & ~(pair.gap <= pair.bound)).nonzero().reshape(-1)  # a NaN difference is bad too
        total = pair.total
        ratio = bad.numel() / total if total else 0.0
        within = ratio <= self.max_error_ratio
        hard = pair.nonfinite()
        lines = [f"output {name!r}: {bad.numel()}/{total} elements ({ratio:.3%}) outside atol={pair.atol:g} "
                 f"rtol={pair.rtol:g}, {'within' if within else 'above'} max_error_ratio "
                 f"{self.max_error_ratio * 100:g}%", *hard]
        max_abs, max_rel = pair.maxima
        stats = {"error_ratio": ratio, "bad": bad.numel(), "considered": total, "max_abs": max_abs, "max_rel": max_rel}
        return pair.verdict(name, within and not hard, lines, bad, stats)


ratio_allclose = RatioAllclose


@dataclasses.dataclass(frozen=True)
class RatioReldiff(_Comparator):
    """Bounds the relative difference rd = |actual - expected| / max(|expected|, floor).

    Below `floor` the golden's magnitude stops shrinking the denominator, so rd
    there is the absolute difference scaled by 1/floor. Fails when the fraction
    of points with rd > diff_thd exceeds pct_thd, when any rd exceeds
    max_diff_hd (a hard cap, reported with its worst point), or on NaN/Inf
    among the compared points on either side; the policy's ignore_nan drops the
    points where the golden is NaN. stats: pct_over (a fraction, like pct_thd),
    max_reldiff.
    """
    diff_thd: float = 0.005
    pct_thd: float = 0.005
    max_diff_hd: float = 0.1
    floor: float = 1e-3

    def _judge(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
        pair = _pair(self, name, actual, expected, policy)  # no ignore_nan field: the policy's
        considered = pair.considered
        rd = pair.gap.double() / pair.e.double().abs().clamp_min(self.floor)  # the exact gap, then the ratio
        over = (considered & ~(rd <= self.diff_thd)).nonzero().reshape(-1)  # a NaN rd is over too
        total = pair.total
        pct = over.numel() / total if total else 0.0
        within = pct <= self.pct_thd
        lines = [f"output {name!r}: {over.numel()}/{total} elements ({pct:.3%}) with relative difference above "
                 f"{self.diff_thd:g} (floor {self.floor:g}), {'within' if within else 'above'} "
                 f"pct_thd {self.pct_thd * 100:g}%"]
        finite = considered & torch.isfinite(rd)
        max_rd = float(rd[finite].max()) if bool(finite.any()) else 0.0
        if max_rd > self.max_diff_hd:
            worst = int(torch.where(finite, rd, -1.0).argmax())
            lines.append(f"  hard failure: relative difference {max_rd:.3g} above max_diff_hd {self.max_diff_hd:g} "
                         f"at {pair.describe(worst)}")
        lines += pair.nonfinite()
        return pair.verdict(name, within and len(lines) == 1, lines, over, {"pct_over": pct, "max_reldiff": max_rd},
                            rd.nan_to_num(nan=float("inf")))


ratio_reldiff = RatioReldiff


def _duplicate_lines(idx) -> list:
    """A hard-failure line when some row (last axis) of `idx` holds a non-negative index twice."""
    ordered = idx.sort(dim=-1).values
    twice = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    rows = twice.any(-1).nonzero()
    if not len(rows):
        return []
    first = tuple(rows[0].tolist())
    index = _num(ordered[first][1:][twice[first]][0].item())
    return [f"  hard failure: {len(rows)} rows of the actual hold an index twice, first row {first} (index {index})"]


@dataclasses.dataclass(frozen=True)
class TopkPairCompare(_Comparator):
    """Top-k indices (last axis: the k positions, padded with -1) judged with their values output `vals_name`.

    A position passes when the indices are equal, or when they differ only by a
    tie, two values within atol + rtol * |golden value|: the actual's index sits
    elsewhere in the golden's row with a value tied to this position's golden
    value (tied elements in another order), or it is absent from the golden's
    row and both this position's values tie with the golden's last selected
    value (another element of the boundary score was picked). Hard failures:
    padding on one side only (never a tie), an actual row holding a
    non-negative index twice, `vals_name` missing from either side's outputs,
    any of the four shapes differing, the two sides' dtypes differing (indices
    or values). Indices compare exactly, and integer values tie only within
    the exact integer bound of `_bound` (rtol = atol = 0: equal). The values
    themselves are judged by their own output's comparator. stats: ties
    (accepted), differ (rejected).
    """
    vals_name: str
    rtol: float = 0.0
    atol: float = 0.0

    def _judge(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
        if self.vals_name not in outputs.actual or self.vals_name not in outputs.expected:
            raise _Unjudgeable(f"output {name!r}: value output {self.vals_name!r} is missing "
                               f"(actual outputs: {', '.join(outputs.actual)}; "
                               f"golden outputs: {', '.join(outputs.expected)})")
        a_val, e_val = outputs.actual[self.vals_name], outputs.expected[self.vals_name]
        shapes = [tuple(t.shape) for t in (actual, expected, a_val, e_val)]
        if len(set(shapes)) > 1 or not shapes[0]:
            raise _Unjudgeable(f"output {name!r}: needs one shape with a last axis of k positions; actual "
                               f"{shapes[0]}, golden {shapes[1]}, {self.vals_name!r} actual {shapes[2]}, "
                               f"golden {shapes[3]}")
        _comparable(name, actual, expected)
        _comparable(self.vals_name, a_val, e_val)
        a_idx, e_idx, a_val, e_val = (_widen(t) for t in (actual, expected, a_val, e_val))

        def tied(x, y):
            return _gap(x, y) <= _bound(y, self.rtol, self.atol)

        differ = a_idx != e_idx
        padding = (a_idx == -1) != (e_idx == -1)
        # where the actual's index sits in the golden's row, if anywhere
        match = e_idx.unsqueeze(-2) == a_idx.unsqueeze(-1)
        found = match.any(-1)
        golden_there = e_val.gather(-1, match.int().argmax(-1))
        top = math.inf if e_val.is_floating_point() else _INT64_MAX  # a padded slot is never the boundary
        boundary = torch.where(e_idx >= 0, e_val, top).amin(-1, keepdim=True).expand_as(e_val)
        tie = torch.where(found, tied(golden_there, e_val), tied(a_val, e_val) & tied(e_val, boundary))
        wrong = differ & (padding | ~tie)
        n, m, ties = a_idx.numel(), int(wrong.sum()), int((differ & ~wrong).sum())
        stats = {"ties": ties, "differ": m}
        tolerance = f"(rtol={self.rtol:g}, atol={self.atol:g})"
        hard = _duplicate_lines(a_idx)
        if not m and not hard:
            return Comparison(name, True, f"output {name!r}: {n} selections match the golden, {ties} of them as ties "
                                          f"in {self.vals_name!r} {tolerance}", total=n, stats=stats)
        lines = [f"output {name!r}: {m}/{n} selections differ from the golden and are not ties in "
                 f"{self.vals_name!r} {tolerance}", *hard]
        for at in wrong.nonzero()[:FIRST_MISMATCHES].tolist():
            at = tuple(at)
            lines.append(f"    {at}: actual index {_num(a_idx[at].item())}, expected index {_num(e_idx[at].item())}, "
                         f"actual value {_num(a_val[at].item())}, expected value {_num(e_val[at].item())}"
                         + (" (padding on one side only)" if padding[at] else ""))
        return Comparison(name, False, "\n".join(lines), mismatches=m, total=n, stats=stats)


topk_pair_compare = TopkPairCompare


def _quotient(num: float, den: float) -> float:
    """num / den, with 0/0 = 0 and x/0 = inf."""
    return num / den if den else (math.inf if num else 0.0)


def _percentile(ordered, p: float) -> float:
    """The p-th percentile of an ascending 1-D tensor, interpolating linearly (numpy's default)."""
    if not ordered.numel():
        return 0.0
    pos = p / 100 * (ordered.numel() - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


@dataclasses.dataclass(frozen=True)
class ErrorDistribution(_Comparator):
    """Measures how the error is spread; judges only through `judge`, another comparator.

    Over the points finite on both sides (the policy's ignore_nan drops
    golden-NaN points; other NaN/Inf points are counted as excluded): rel_l2 =
    ||a - e|| / ||e||, cosine similarity (1 when both sides are all 0), the
    fraction of points whose relative error |a - e| / |e| exceeds each
    threshold, and the given percentiles of |a - e|. With a judge, the verdict
    and message are the judge's with the distribution appended and stats
    merged; without one it passes with a message starting "measured only (no
    verdict):". A shape or dtype mismatch always fails. The figures are
    float64, from the difference taken exactly first (integers: `_gap`).
    stats: rel_l2, cosine, finite, excluded, rel_err_over_<t>, abs_err_p<p>.
    """
    judge: object = None
    thresholds: tuple = (1e-3, 1e-2, 1e-1)
    percentiles: tuple = (50, 90, 99, 99.9)

    def __post_init__(self):
        if not all(0 <= p <= 100 for p in self.percentiles):
            raise ValueError(f"percentiles must lie in 0..100, got {self.percentiles}")

    def _judge(self, name, actual, expected, policy: Policy, outputs: Sides) -> Comparison:
        _comparable(name, actual, expected)
        pair = _Flat.of(self, policy, actual, expected)  # not `_judged`: a golden NaN everywhere is measured too
        stats, line = self._measure(pair)
        if self.judge is None:
            return Comparison(name, True, f"measured only (no verdict): output {name!r}: {line}", *pair.maxima,
                              total=stats["finite"], stats=stats)
        verdict = self.judge(name, actual, expected, policy, outputs)
        return dataclasses.replace(verdict, message=f"{verdict.message}\n  distribution: {line}",
                                   stats={**stats, **verdict.stats})

    def _measure(self, pair: _Flat) -> tuple:
        """(stats, one-line summary) of the error distribution."""
        finite = pair.considered & torch.isfinite(pair.a) & torch.isfinite(pair.e)
        a, e, diff = (t[finite].double() for t in (pair.a, pair.e, pair.gap))
        a_norm, e_norm = float(a.norm()), float(e.norm())
        cosine = (1.0 if a_norm == e_norm == 0 else
                  max(-1.0, min(1.0, _quotient(float(a @ e), a_norm * e_norm))))  # rounding can pass 1
        rel = diff / e.abs().clamp_min(_TINY)
        over = {t: float((rel > t).double().mean()) if rel.numel() else 0.0 for t in self.thresholds}
        ordered = diff.sort().values
        pcts = {p: _percentile(ordered, p) for p in self.percentiles}
        stats = {"rel_l2": _quotient(float(diff.norm()), e_norm), "cosine": cosine, "finite": a.numel(),
                 "excluded": int((pair.considered & ~finite).sum()),
                 **{f"rel_err_over_{t:g}": f for t, f in over.items()},
                 **{f"abs_err_p{p:g}": v for p, v in pcts.items()}}
        excluded = f", {stats['excluded']} NaN/Inf excluded" if stats["excluded"] else ""
        line = (f"rel-L2 {stats['rel_l2']:.3g}, cosine {cosine:.6f}; rel err "
                + ", ".join(f"> {t:g}: {100 * f:.3g}%" for t, f in over.items()) + "; abs err "
                + " ".join(f"p{p:g} {v:.3g}" for p, v in pcts.items()) + f"; {a.numel()} finite points{excluded}")
        return stats, line


error_distribution = ErrorDistribution


def error_map(policy: Policy, name: str, actual: torch.Tensor, expected: torch.Tensor) -> tuple:
    """(gap, bound): float64 tensors of the output's shape, |actual - expected| and the tolerance that output's
    comparator in `policy` allows at each point; a point mismatches where not gap <= bound (a NaN gap included).

    The comparator's own settings are used (rtol, atol, ignore_nan, valid_rows; an ErrorDistribution's judge), so
    the map agrees point by point with the verdicts of Allclose and RatioAllclose (gap 0 and bound inf where nothing
    is judged: a golden NaN under ignore_nan, rows past valid_rows) and of RatioReldiff (bound diff_thd * max(|golden|,
    floor)). An infinite golden is matched by the same infinity only (gap 0, else bound 0), as in Allclose. Raises
    ValueError with a one-line reason for a pair that cannot be compared and for a comparator without a bound per
    element (TopkPairCompare, an ErrorDistribution that only measures, a user's own function).
    """
    comparator = policy.compare.get(name, allclose)
    while isinstance(comparator, ErrorDistribution) and comparator.judge is not None:
        comparator = comparator.judge
    if not isinstance(comparator, (Allclose, RatioAllclose, RatioReldiff)):
        kind = comparator.__name__ if isinstance(comparator, type) else type(comparator).__name__
        raise ValueError(f"output {name!r}: its comparator {kind} has no tolerance per element")
    try:
        _comparable(name, actual, expected)
        judged = torch.ones(expected.shape, dtype=torch.bool)
        if isinstance(comparator, RatioAllclose) and comparator.valid_rows is not None:
            axis, rows = _leading(name, tuple(expected.shape), comparator.valid_rows, comparator.valid_axis)
            judged.narrow(axis, rows, expected.shape[axis] - rows).fill_(False)
    except _Unjudgeable as why:
        raise ValueError(str(why)) from None
    pair = _Flat.of(comparator, policy, actual, expected)
    if isinstance(comparator, RatioReldiff):
        bound = comparator.diff_thd * pair.e.double().abs().clamp_min(comparator.floor)
    else:
        bound = pair.bound.double()
    judged = pair.considered & judged.reshape(-1)
    gap = torch.where((pair.a == pair.e) | ~judged, 0.0, pair.gap.double())
    bound = torch.where(torch.isfinite(pair.e.double()), bound, 0.0)
    bound = torch.where(judged, bound, math.inf)
    return gap.reshape(expected.shape), bound.reshape(expected.shape)
