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
import math
from typing import Any

import torch

from .comparison import (
    _INT64_MAX,
    _TINY,
    FIRST_MISMATCHES,
    Allclose,
    Comparator,
    Comparison,
    Policy,
    Sides,
    _bound,
    _comparable,
    _Comparator,
    _Flat,
    _gap,
    _judged,
    _num,
    _pair,
    _Unjudgeable,
    _widen,
    allclose,
)

# the comparators a case names, and what they are given and return (comparison's, named here too)
__all__ = ["Sides", "Policy", "Comparison", "FIRST_MISMATCHES", "Allclose", "allclose", "RatioAllclose",
           "ratio_allclose", "MatchedRatio", "matched_ratio", "RatioReldiff", "ratio_reldiff", "TopkPairCompare",
           "topk_pair_compare", "ErrorDistribution", "error_distribution", "error_map"]


def _leading(name: str, shape: tuple[int, ...], rows: int, axis: int) -> tuple[int, int]:
    """(axis, rows) with the axis made non-negative; raises `_Unjudgeable` when either is out of range."""
    if not -len(shape) <= axis < len(shape):
        raise _Unjudgeable(f"output {name!r}: valid_axis={axis} is not an axis of shape {shape}")
    axis %= len(shape)
    if not 0 <= rows <= shape[axis]:
        raise _Unjudgeable(f"output {name!r}: valid_rows={rows} outside 0..{shape[axis]} "
                           f"(axis {axis} of shape {shape})")
    return axis, rows


def _tail_line(actual: torch.Tensor, axis: int, rows: int) -> str | None:
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
    atol: float | None = None
    rtol: float | None = None
    max_error_ratio: float = 0.005
    valid_rows: int | None = None
    valid_axis: int = 0
    zero_tail: bool = False
    ignore_nan: bool | None = None

    def _judge(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
               outputs: Sides) -> Comparison:
        if self.valid_rows is None:
            return self._ratio(name, _pair(self, name, actual, expected, policy))
        _comparable(name, actual, expected)  # first: a shape that differs is named as such, not as a bad axis
        axis, rows = _leading(name, tuple(expected.shape), self.valid_rows, self.valid_axis)
        try:  # the leading slice's coordinates are the full tensor's
            result = self._ratio(name, _judged(self, name, actual.narrow(axis, 0, rows),
                                               expected.narrow(axis, 0, rows), policy))
        except _Unjudgeable as why:  # a golden NaN everywhere in the slice: the tail is still checked
            result = why.verdict(name)
        if rows == 0:
            result = dataclasses.replace(result, message=f"output {name!r}: 0 rows compared "
                                                         f"(valid_rows=0 along axis {axis})")
        tail = _tail_line(actual, axis, rows) if self.zero_tail else None
        if tail:
            result = dataclasses.replace(result, passed=False, message=f"{result.message}\n{tail}")
        return result

    def _ratio(self, name: str, pair: _Flat) -> Comparison:
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
class MatchedRatio(RatioAllclose):
    """FlashInfer-Bench's rule (its evaluator's compute_error_stats): a point is bad only when its absolute error
    is above atol and its relative error |actual - expected| / (|expected| + 1e-8) above rtol; the output passes
    when bad/considered <= max_error_ratio (1 - the format's required_matched_ratio: 0, every point, by
    default). NaN and Inf fail as in RatioAllclose."""
    max_error_ratio: float = 0.0

    def _ratio(self, name: str, pair: _Flat) -> Comparison:
        # the bound is max(atol, rtol * (|e| + 1e-8)): within it, one of the two errors is within its tolerance
        pair.__dict__["bound"] = torch.maximum(torch.full_like(pair.e, float(pair.atol), dtype=torch.float64),
                                               float(pair.rtol) * (pair.e.double().abs() + 1e-8))
        return super()._ratio(name, pair)


matched_ratio = MatchedRatio


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

    def _judge(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
               outputs: Sides) -> Comparison:
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


def _duplicate_lines(idx: torch.Tensor) -> list[str]:
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

    def _judge(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
               outputs: Sides) -> Comparison:
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

        def tied(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
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


def _percentile(ordered: torch.Tensor, p: float) -> float:
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
    judge: Comparator | None = None
    thresholds: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    percentiles: tuple[float, ...] = (50, 90, 99, 99.9)

    def __post_init__(self) -> None:
        if not all(0 <= p <= 100 for p in self.percentiles):
            raise ValueError(f"percentiles must lie in 0..100, got {self.percentiles}")

    def _judge(self, name: str, actual: torch.Tensor, expected: torch.Tensor, policy: Policy,
               outputs: Sides) -> Comparison:
        _comparable(name, actual, expected)
        pair = _Flat.of(self, policy, actual, expected)  # not `_judged`: a golden NaN everywhere is measured too
        stats, line = self._measure(pair)
        if self.judge is None:
            return Comparison(name, True, f"measured only (no verdict): output {name!r}: {line}", *pair.maxima,
                              total=stats["finite"], stats=stats)
        verdict = self.judge(name, actual, expected, policy, outputs)
        return dataclasses.replace(verdict, message=f"{verdict.message}\n  distribution: {line}",
                                   stats={**stats, **verdict.stats})

    def _measure(self, pair: _Flat) -> tuple[dict[str, Any], str]:
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


def error_map(policy: Policy, name: str, actual: torch.Tensor,
              expected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
