"""A case's figures for the HTML page, drawn from the outputs in the store (present even when validate
failed): per output, the error distribution relative to the tolerance bound of its own comparator
(compare.error_map); for a failing output, a heat map of where its mismatching elements lie; and the
kernel's benchmark rounds. Whatever cannot be drawn is a Plot that says why. Figures are matplotlib
figures without pyplot (no display or GUI backend), as inline SVG (a heat map's cells an embedded PNG), and
are kept in the cache under the content they are drawn from (plot_key), so a page of unchanged cases draws
nothing.

Everything drawn comes from the run record and the store entries its keys name: no kernel module is imported
and nothing is planned, so the page of a run whose source has since changed shows that run. torch and matplotlib
are imported where they are used (the doit parent imports this module to find figures already drawn), and a
case's saved policy (its comparators user code by value) is unpickled only where figures are drawn."""
import dataclasses
import functools
import importlib
import importlib.util
import io
import json
import math
from pathlib import Path

from ..model.hashing import digest_file, digest_json
from ..model.records import CaseRow, Timing
from ..pipeline.stage_table import StageName
from ..pipeline.stored import load_outputs, load_timings
from ..pipeline.summary import first_line
from ..storage.store import atomic_write

MAX_BINS = 64  # a heat map has at most MAX_BINS x MAX_BINS cells, whatever the tensor's size
BINS_PER_DECADE = 4
MAX_ROUNDS_SHOWN = 1000  # rounds beyond this are thinned to every k-th (outliers always kept)
LOW_DECADE = -6
RATIO_FLOOR = 10.0 ** LOW_DECADE  # gap/bound below this (an exact match included) is drawn in the lowest bin


class Unplottable(Exception):
    """What keeps a case or an output from being drawn, as the one line the page shows instead."""


@dataclasses.dataclass
class Plot:
    """One drawn figure (`svg`) or the reason there is none (`reason`), of a `kind` for one output or the case."""
    kind: str  # "error-histogram" | "mismatch-map" | "bench-rounds"; "outputs": the reason none could be drawn
    caption: str
    svg: str = None
    reason: str = None
    output: str = None


# -- computations (torch), kept apart from drawing so they can be tested on their own


def grid_shape(shape) -> tuple:
    """(rows, cols) of the 2-D view of a tensor: rows = the product of its leading dims, cols = its last dim."""
    shape = tuple(shape)
    if not shape:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def mismatch_bins(mismatch, max_bins: int = MAX_BINS) -> tuple:
    """(share, row_edges, col_edges) of a bool tensor viewed as `grid_shape`: share[i, j] is the fraction of
    mismatching elements among the rows row_edges[i]..row_edges[i + 1] - 1 and the columns col_edges[j]..
    col_edges[j + 1] - 1; at most max_bins bins per axis, each of one or more whole rows (columns), in order."""
    import torch  # noqa: PLC0415 -- the report's own process only

    rows, cols = grid_shape(mismatch.shape)
    flat = mismatch.reshape(rows, cols).to(torch.float32)
    nr, nc = min(rows, max_bins), min(cols, max_bins)
    row_bin, col_bin = torch.arange(rows) * nr // rows, torch.arange(cols) * nc // cols
    by_col = torch.zeros(rows, nc).index_add_(1, col_bin, flat)
    counts = torch.zeros(nr, nc).index_add_(0, row_bin, by_col)
    sizes = torch.bincount(row_bin, minlength=nr).outer(torch.bincount(col_bin, minlength=nc))
    row_edges, col_edges = ([int(i) for i in torch.searchsorted(b, torch.arange(n))] + [len(b)]
                            for b, n in ((row_bin, nr), (col_bin, nc)))
    return (counts / sizes).numpy(), row_edges, col_edges


def mismatch_extent(mismatch) -> str:
    """The rows and columns (of `grid_shape`) that hold mismatching elements, as text for a caption."""
    rows, cols = grid_shape(mismatch.shape)
    where = mismatch.reshape(rows, cols).nonzero()
    if not len(where):
        return "no element mismatches"
    (r0, c0), (r1, c1) = where.amin(0).tolist(), where.amax(0).tolist()
    return f"{len(where)} mismatching elements within rows {r0}..{r1} and columns {c0}..{c1} of {rows} x {cols}"


@dataclasses.dataclass
class RatioHistogram:
    """gap/bound over the judged points: counts per log10 bin (`edges`: ratios), the points at or below
    RATIO_FLOOR (exact matches included) in the lowest bin, NaN/Inf ratios counted apart."""
    counts: list
    edges: list
    judged: int
    over: int  # not ratio <= 1: outside the bound (NaN/Inf included), as compare.error_map defines a mismatch
    nonfinite: int
    worst: float  # the largest finite ratio


def ratio_histogram(gap, bound, per_decade: int = BINS_PER_DECADE) -> RatioHistogram:
    """The distribution of gap/bound (compare.error_map) over the points with a finite bound, in bins (a, b] of
    1/per_decade decade from RATIO_FLOOR up to a whole decade at or above the worst ratio and 10: the pass line
    (ratio 1) is always an edge, and an element exactly at its bound falls left of it."""
    import torch  # noqa: PLC0415 -- the report's own process only

    judged = torch.isfinite(bound)
    gap, bound = gap[judged], bound[judged]
    ratio = torch.where(gap == 0, 0.0, gap / bound)  # bound 0: an exact match is 0, anything else inf
    finite = torch.isfinite(ratio)
    logs = ratio[finite].clamp_min(RATIO_FLOOR).log10()
    worst = float(ratio[finite].max()) if bool(finite.any()) else 0.0
    top = max(1, math.ceil(float(logs.max()))) if logs.numel() else 1
    steps = range(LOW_DECADE * per_decade, top * per_decade + 1)  # edges j / per_decade: log 0 is exact
    edges = torch.tensor([j / per_decade for j in steps], dtype=logs.dtype)
    counts = torch.bincount(torch.bucketize(logs, edges[1:-1]), minlength=len(edges) - 1)
    return RatioHistogram(counts.tolist(), [10.0 ** e for e in edges.tolist()], int(judged.sum()),
                          int((~(ratio <= 1)).sum()), int((~finite).sum()), worst)


# -- drawing (matplotlib, Agg) to inline SVG


def new_figure(width: float, height: float):
    """A figure with fixed margins: a layout engine measured every tick label of every figure again,
    most of the page's drawing time."""
    from matplotlib.figure import Figure  # noqa: PLC0415 -- the report's own process only

    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.15, right=0.96, bottom=0.2, top=0.88)
    return fig


def plain_log_labels(axis):
    """Label a log axis in plain text (1e-05, 0.1, 10): its default labels are TeX, parsed label by label."""
    from matplotlib import ticker  # noqa: PLC0415 -- the report's own process only

    axis.set_major_formatter(ticker.LogFormatter())
    axis.set_minor_formatter(ticker.NullFormatter())


def svg_of(fig) -> str:
    """The figure as an <svg> element: text as text (no glyph outlines), ids salted alike on every run."""
    import matplotlib  # noqa: PLC0415 -- the report's own process only

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "golden-tasks"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def draw_histogram(name: str, hist: RatioHistogram) -> str:
    fig = new_figure(5.2, 2.6)
    ax = fig.add_subplot()
    ax.stairs(hist.counts, hist.edges, fill=True, color="#4a7bb7")
    ax.axvline(1.0, color="#c0392b", linewidth=1.5, label="bound (pass at or below)")
    ax.set_xscale("log")
    plain_log_labels(ax.xaxis)
    if any(hist.counts):
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)
        ax.set_ylim(bottom=0.7)
    ax.set_xlabel(f"|actual - golden| / bound (first bin: <= {RATIO_FLOOR:g}, exact)")
    ax.set_ylabel("elements")
    ax.set_title(f"output {name!r}: error relative to its tolerance", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return svg_of(fig)


def draw_heat_map(name: str, shape: tuple, share, row_edges: list, col_edges: list) -> str:
    rows, cols = grid_shape(shape)
    fig = new_figure(5.2, 3.6)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest",
                      extent=(0, cols, rows, 0))
    fig.colorbar(image, ax=ax, label="share mismatching")
    leading = " x ".join(str(d) for d in shape[:-1]) or "1"
    ax.set_xlabel(f"last dim (columns 0..{cols - 1}; {len(col_edges) - 1} bins)")
    ax.set_ylabel(f"rows ({leading}; {len(row_edges) - 1} bins)")
    ax.set_title(f"output {name!r}: where elements mismatch", fontsize=10)
    return svg_of(fig)


def rounds_range(timing: Timing) -> tuple[float, float]:
    """The y range of a rounds plot of `timing` (with its round times): the rounds that are not outliers,
    with a margin, so that one slow round does not flatten the rest (outliers beyond it are drawn at its edge)."""
    outliers = set(timing.outlier_times)
    regular = [t for t in timing.times if t not in outliers] or timing.times
    low, high = min(regular), max(regular)
    margin = 0.15 * (high - low) or 0.05 * abs(high) or 1.0
    return low - margin, high + margin


def draw_rounds(timing: Timing) -> str:
    """The rounds plot of `timing`, with its round times."""
    times, outliers = timing.times, set(timing.outlier_times)
    step = max(1, math.ceil(len(times) / MAX_ROUNDS_SHOWN))
    shown = [(i, t) for i, t in enumerate(times) if i % step == 0 or t in outliers]
    fig = new_figure(5.2, 2.6)
    ax = fig.add_subplot()
    low, high = rounds_range(timing)
    regular = [(i, t) for i, t in shown if t not in outliers]
    odd = [(i, t) for i, t in shown if t in outliers and low <= t <= high]
    above = [(i, high) for i, t in shown if t in outliers and t > high]  # drawn at the edge they are beyond
    below = [(i, low) for i, t in shown if t in outliers and t < low]
    slowest = max(times)
    for points, style in ((regular, {"color": "#4a7bb7", "label": "round"}),
                          (odd, {"color": "#c0392b", "marker": "x", "label": "outlier (> 1.5 IQR)"}),
                          (above, {"color": "#c0392b", "marker": "^",
                                   "label": f"outlier above the scale (slowest {slowest:.4g} us)"}),
                          (below, {"color": "#c0392b", "marker": "v", "label": "outlier below the scale"})):
        if points:
            ax.scatter(*zip(*points), s=12, clip_on=False, **style)
    ax.set_ylim(low, high)
    ax.axhline(timing.median, color="#222222", linewidth=1, label=f"median {timing.median:.4g} us")
    ax.set_xlabel("round" + (f" (one in {step} shown, and every outlier)" if step > 1 else ""))
    ax.set_ylabel("us")
    ax.set_title("kernel benchmark rounds", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return svg_of(fig)


# -- a case's figures from the store


@dataclasses.dataclass
class Sources:
    """Where a case's figures come from: the store, read through the entries its row's keys name."""
    store: object

    def entry(self, stage: StageName, row: CaseRow):
        """The row's entry of `stage` (Unplottable: the run made none, or the cache no longer holds it)."""
        key = row.keys.get(stage)
        if not key and "plan" in row.errors:
            raise Unplottable(f"the case could not be planned: {first_line(row.errors['plan'])}")
        if not key:
            raise Unplottable(f"the run made no {stage} entry")
        entry = self.store.get(stage, key)
        if entry is None:
            raise Unplottable(f"its {stage} entry {key[:16]} is no longer in the cache")
        return entry

    def outputs(self, stage: StageName, row: CaseRow):
        """The Outputs of the row's entry of `stage`."""
        outputs = load_outputs(self.store, self.entry(stage, row))
        if outputs.skipped:
            raise Unplottable(f"{stage} was skipped: {outputs.skipped}")
        return outputs

    def kernel_timing(self, row: CaseRow) -> Timing:
        """The kernel's timing with every round, from the samples of the row's bench entry."""
        return load_timings(self.store, self.entry(StageName.BENCH, row)).kernel_us


def output_plots(row: CaseRow, sources: Sources) -> list:
    """Per output: its error histogram, and for a failing one the heat map of its mismatches."""
    from ..model import compare  # noqa: PLC0415 -- imports torch
    from ..stages.policy import saved_policy  # noqa: PLC0415 -- imports torch

    golden, dispatch = sources.outputs(StageName.GOLDEN, row), sources.outputs(StageName.DISPATCH, row)
    policy = saved_policy(sources.outputs(StageName.POLICY, row))
    verdicts = {c.name: c for c in policy.check(dispatch.tensors, golden.tensors)}
    plots = []
    for name, expected in golden.tensors.items():
        try:
            gap, bound = compare.error_map(policy, name, dispatch.tensors[name], expected)
        except ValueError as exc:
            plots.append(Plot("error-histogram", "error distribution", reason=str(exc), output=name))
            continue
        hist = ratio_histogram(gap, bound)
        plots.append(Plot("error-histogram", f"output {name!r}: {hist.judged} elements judged, {hist.over} over "
                                             f"the bound ({hist.nonfinite} of them NaN/Inf); worst finite "
                                             f"{hist.worst:.3g} x bound",
                          svg=draw_histogram(name, hist), output=name))
        if verdicts[name].passed:
            continue
        mismatch = ~(gap <= bound)
        if not bool(mismatch.any()):
            plots.append(Plot("mismatch-map", "mismatch map", output=name,
                              reason=f"output {name!r}: no element is outside its bound; its report says why it "
                                     f"fails (a zero tail, NaN or Inf, a hard cap)"))
            continue
        share, row_edges, col_edges = mismatch_bins(mismatch)
        plots.append(Plot("mismatch-map", f"output {name!r}: {mismatch_extent(mismatch)}", output=name,
                          svg=draw_heat_map(name, tuple(expected.shape), share, row_edges, col_edges)))
    return plots


def rounds_plot(row: CaseRow, sources: Sources) -> Plot:
    if not row.kernel_timing:
        return Plot("bench-rounds", "kernel benchmark rounds", reason="no benchmark rounds were recorded")
    timing = sources.kernel_timing(row)
    return Plot("bench-rounds", f"kernel benchmark: {len(timing.times)} rounds, "
                                f"{len(timing.outlier_times)} outliers", svg=draw_rounds(timing))


def case_plots(row: CaseRow, sources: Sources) -> list:
    """Every figure of a case, or Plots with the reason in place of those that cannot be drawn."""
    try:
        plots = output_plots(row, sources)
    except Unplottable as why:
        plots = [Plot("outputs", "outputs", reason=str(why))]
    except Exception as exc:  # noqa: BLE001 -- a case's figures never break the page: its reason is shown instead
        plots = [Plot("outputs", "outputs", reason=f"cannot draw: {type(exc).__name__}: {first_line(str(exc))}")]
    try:
        plots.append(rounds_plot(row, sources))
    except Unplottable as why:
        plots.append(Plot("bench-rounds", "kernel benchmark rounds", reason=str(why)))
    except Exception as exc:  # noqa: BLE001 -- as above, for a malformed timing record
        plots.append(Plot("bench-rounds", "kernel benchmark rounds",
                          reason=f"cannot draw: {type(exc).__name__}: {first_line(str(exc))}"))
    return plots


# -- the figures of a case, kept in the cache under the content they are drawn from


# the stages whose entries a case's figures show
_DRAWN_FROM = (StageName.GOLDEN, StageName.DISPATCH, StageName.POLICY, StageName.BENCH)


@functools.cache
def drawing_code(*modules: str) -> list:
    """The digests of the modules that draw (this one and what it computes with, or `modules`), found, not
    imported (the comparators import torch)."""
    drawing = modules or (__name__, "golden_tasks.model.compare", "golden_tasks.model.comparison")
    return [digest_file(Path(importlib.util.find_spec(name).origin)) for name in drawing]


def plot_key(row: CaseRow) -> str:
    """The digest of everything a case's figures are drawn from, or None when the row cannot say (no
    content keys): the golden's and the kernel's outputs, the policy judging them and the rounds (their
    entries' keys, None for a stage that made none), and the code that draws them. A case that could not be
    planned has no content to draw: its figures say why, from its error alone."""
    if "plan" in row.errors:
        return digest_json({"plan": row.errors["plan"], "code": drawing_code()})
    if not row.keys:
        return None
    return digest_json({**{stage: row.keys.get(stage) for stage in _DRAWN_FROM}, "code": drawing_code()})


def remembered_plots(store, row: CaseRow) -> list:
    """The case's figures as drawn before from the same content, or None."""
    key = plot_key(row)
    try:
        return key and [Plot(**p) for p in json.loads(store.plot_path(key).read_text())["plots"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def remember_plots(store, row: CaseRow, plots: list) -> None:
    """Keep the case's figures for the next page drawn from the same content (not for a read-only cache),
    with the entries they show, so that gc drops them with those (drawn_from)."""
    key = plot_key(row)
    if key and not store.readonly:
        shown = [[stage, row.keys[stage]] for stage in _DRAWN_FROM if row.keys.get(stage)]
        text = json.dumps({"drawn_from": shown, "plots": [dataclasses.asdict(p) for p in plots]}).encode()
        atomic_write(store.plot_path(key), lambda f: f.write(text))


def drawn_from(path: Path) -> set:
    """The (stage, key) of the entries the figures remembered at `path` show (empty if unreadable)."""
    try:
        return {tuple(pair) for pair in json.loads(path.read_text())["drawn_from"]}
    except (OSError, ValueError, TypeError, KeyError):
        return set()
