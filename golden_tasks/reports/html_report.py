"""The run as one self-contained HTML page: RUNS/report.html beside RUNS/report.json.

    python -m golden_tasks.html_report [--project DIR] [NAME=VALUE ...]

reads the run record (RUNS/report.json; RUNS is config.runs_root(project)) and the project's store, and
writes the page atomically. NAME=VALUE are the run's doit variables (backend=eager, profile=NAME, ...), used only
for a row without content keys, whose entries are then looked up under the library's current plans.

Every case lists its status, reason, timings, warnings, stage states and content keys, and draws from the
outputs in the store (present even when validate failed): per output, the error distribution relative to the
tolerance bound of its own comparator (compare.error_map); for a failing output, a heat map of where its
mismatching elements lie; and the kernel's benchmark rounds. Whatever cannot be drawn for a case is one line that
says why. Nothing outside the file is referenced: CSS inline, figures inline SVG (matplotlib figures without
pyplot, so no display or GUI backend is involved; a heat map's cells are an embedded PNG), and a small
script that records each figure's rendered size in the DOM (data-rendered-width/-height) once the page is laid out.

It runs in its own process: it imports torch, matplotlib and the kernel modules (for the cases' policies), which
the doit parent must not, so those imports are made where they are used.
"""
import argparse
import dataclasses
import functools
import html
import importlib
import importlib.util
import io
import json
import math
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ..model.hashing import digest_file, digest_json
from ..model.records import BadRecord, CaseRow, RunRecord, Timing
from ..model.verdicts import Verdict
from ..pipeline import graph
from ..pipeline.summary import first_line
from ..planning.library import planned_library, run_variables
from ..project import config
from ..project.layout import layout
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


def _figure(width: float, height: float):
    """A figure with fixed margins: a layout engine measured every tick label of every figure again,
    most of the page's drawing time."""
    from matplotlib.figure import Figure  # noqa: PLC0415 -- the report's own process only

    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=0.15, right=0.96, bottom=0.2, top=0.88)
    return fig


def _plain_log_labels(axis):
    """Label a log axis in plain text (1e-05, 0.1, 10): its default labels are TeX, parsed label by label."""
    from matplotlib import ticker  # noqa: PLC0415 -- the report's own process only

    axis.set_major_formatter(ticker.LogFormatter())
    axis.set_minor_formatter(ticker.NullFormatter())


def _svg(fig) -> str:
    """The figure as an <svg> element: text as text (no glyph outlines), ids salted alike on every run."""
    import matplotlib  # noqa: PLC0415 -- the report's own process only

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "golden-tasks"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def draw_histogram(name: str, hist: RatioHistogram) -> str:
    fig = _figure(5.2, 2.6)
    ax = fig.add_subplot()
    ax.stairs(hist.counts, hist.edges, fill=True, color="#4a7bb7")
    ax.axvline(1.0, color="#c0392b", linewidth=1.5, label="bound (pass at or below)")
    ax.set_xscale("log")
    _plain_log_labels(ax.xaxis)
    if any(hist.counts):
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
        ax.set_ylim(bottom=0.7)
    ax.set_xlabel(f"|actual - golden| / bound (first bin: <= {RATIO_FLOOR:g}, exact)")
    ax.set_ylabel("elements")
    ax.set_title(f"output {name!r}: error relative to its tolerance", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return _svg(fig)


def draw_heat_map(name: str, shape: tuple, share, row_edges: list, col_edges: list) -> str:
    rows, cols = grid_shape(shape)
    fig = _figure(5.2, 3.6)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest",
                      extent=(0, cols, rows, 0))
    fig.colorbar(image, ax=ax, label="share mismatching")
    leading = " x ".join(str(d) for d in shape[:-1]) or "1"
    ax.set_xlabel(f"last dim (columns 0..{cols - 1}; {len(col_edges) - 1} bins)")
    ax.set_ylabel(f"rows ({leading}; {len(row_edges) - 1} bins)")
    ax.set_title(f"output {name!r}: where elements mismatch", fontsize=10)
    return _svg(fig)


def rounds_range(timing: dict) -> tuple[float, float]:
    """The y range of a rounds plot: the rounds that are not outliers, with a margin, so that one slow
    round does not flatten the rest (outliers beyond it are drawn at its edge)."""
    outliers = set(timing.get("outliers") or ())
    regular = [t for t in timing["times"] if t not in outliers] or timing["times"]
    low, high = min(regular), max(regular)
    margin = 0.15 * (high - low) or 0.05 * abs(high) or 1.0
    return low - margin, high + margin


def draw_rounds(timing: dict) -> str:
    times = timing["times"]
    outliers = set(timing.get("outliers") or ())
    step = max(1, math.ceil(len(times) / MAX_ROUNDS_SHOWN))
    shown = [(i, t) for i, t in enumerate(times) if i % step == 0 or t in outliers]
    fig = _figure(5.2, 2.6)
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
    ax.axhline(timing["median"], color="#222222", linewidth=1, label=f"median {timing['median']:.4g} us")
    ax.set_xlabel("round" + (f" (one in {step} shown, and every outlier)" if step > 1 else ""))
    ax.set_ylabel("us")
    ax.set_title("kernel benchmark rounds", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return _svg(fig)


# -- a case's figures from the store


@dataclasses.dataclass
class Sources:
    """Where a case's figures come from: the project's store, and its plans (None: planning failed, `why`)."""
    store: object
    plans: dict = None
    why: str = None

    def plan(self, case: str):
        if self.plans is None:
            raise Unplottable(f"the kernel library could not be planned: {self.why}")
        plan = self.plans.get(case)
        if plan is None:
            raise Unplottable(f"case {case!r} is no longer in the kernel library")
        if plan.error:
            raise Unplottable(f"the case cannot be planned: {first_line(plan.error)}")
        return plan

    def outputs(self, stage: str, row: CaseRow):
        """The Outputs of the row's entry of `stage`: by its content key in the row, else under the current plan."""
        key = row.keys.get(stage)
        if key:
            entry = self.store.get(stage, key)
            where = f"its {stage} entry {key[:16]} is no longer in the cache"
        else:
            entry = graph.cached(graph.BY_NAME[stage], self.plan(row.case), self.store)
            where = (f"no {stage} entry in the cache for the case's current plan (a run with doit variables: "
                     f"pass them too, NAME=VALUE)")
        if entry is None:
            raise Unplottable(where)
        outputs = graph.load_outputs(self.store, entry)
        if outputs.skipped:
            raise Unplottable(f"{stage} was skipped: {outputs.skipped}")
        return outputs

    def kernel_timing(self, row: CaseRow) -> dict:
        """The kernel's timing with every round, from the samples of the row's bench entry."""
        key = row.keys.get("bench")
        if not key:
            raise Unplottable("the record names no bench entry, which holds the rounds")
        entry = self.store.get("bench", key)
        if entry is None:
            raise Unplottable(f"its bench entry {key[:16]} is no longer in the cache")
        return graph.load_timings(self.store, entry).kernel_us


def output_plots(row: CaseRow, sources: Sources) -> list:
    """Per output: its error histogram, and for a failing one the heat map of its mismatches."""
    from ..model import compare  # noqa: PLC0415 -- imports torch
    from ..planning.case import live_case  # noqa: PLC0415 -- imports torch and the kernel module

    golden, dispatch = sources.outputs("golden", row), sources.outputs("dispatch", row)
    policy = live_case(sources.plan(row.case)).policy()
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
    return Plot("bench-rounds", f"kernel benchmark: {len(timing['times'])} rounds, "
                                f"{len(timing['outliers'])} outliers", svg=draw_rounds(timing))


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


# -- the page


def _e(value) -> str:
    return html.escape("-" if value is None else str(value))


_STAGE_ORDER = {s.name: i for i, s in enumerate(graph.STAGES)}


def _reason(row: CaseRow) -> str:
    """Why the case is not a pass, in one line: its reason, why it was skipped, or its first error's first line."""
    return row.reason or row.skipped or (first_line(next(iter(row.errors.values()))) if row.errors else "")


def _fmt(value, spec: str) -> str:
    """A number of the record formatted, "-" when absent."""
    return "-" if value is None else format(value, spec)


def _timing_text(timing: Timing | None, median_us) -> str:
    """A timing's figures; without one, the row's bare median (a record from before timings had their noise)."""
    if timing is None:
        return "-" if median_us is None else f"median {_fmt(median_us, '.4g')} us"
    return (f"median {_fmt(timing.median, '.4g')} us, IQR {_fmt(timing.iqr, '.3g')}, "
            f"std {_fmt(timing.std, '.3g')}, min {_fmt(timing.min, '.4g')}, "
            f"max {_fmt(timing.max, '.4g')}, rse {_fmt(timing.rse, '.2%')}, "
            f"{_fmt(timing.rounds, 'd')} rounds after {_fmt(timing.warmup, 'd')} warmup, stopped by "
            f"{timing.stopped or '-'}, {_fmt(timing.outliers, 'd')} outliers")


def _speedup_text(row: CaseRow) -> str:
    if row.speedup is None:
        return "-"
    return _fmt(row.speedup, ".3g") + "x" + ("" if row.speedup_err is None else f" ± {_fmt(row.speedup_err, '.2g')}")


def _protection_text(protected) -> str:
    if protected is None:
        return "-"
    return ("protected: the kernel is named by import path, its module never ran beside the golden" if protected
            else "not protected from the kernel: they share a module, whose code runs beside the golden "
                 "(see docs/threat-model.md)")


def _plot_html(plot: Plot) -> str:
    attrs = f'data-kind="{_e(plot.kind)}"' + (f' data-output="{_e(plot.output)}"' if plot.output else "")
    if plot.svg is None:
        return f'<p class="no-plot" {attrs}>{_e(plot.caption)}: {_e(plot.reason)}</p>'
    return f'<figure class="plot" {attrs}>{plot.svg}<figcaption>{_e(plot.caption)}</figcaption></figure>'


def _case_html(row: CaseRow, plots: list) -> str:
    case, status = row.case, row.status
    stages = dict(sorted(row.stages.items(), key=lambda item: _STAGE_ORDER.get(item[0], len(_STAGE_ORDER))))
    stage_rows = "".join(f"<tr><td>{_e(s)}</td><td class=\"state {_e(state)}\">{_e(state)}</td>"
                         f"<td class=\"key\">{_e(row.keys.get(s))}</td></tr>" for s, state in stages.items())
    outputs = "".join(f"<tr><td>{_e(o.get('name'))}</td><td>{'pass' if o.get('passed') else 'FAIL'}</td>"
                      f"<td><pre>{_e(o.get('message'))}</pre></td></tr>" for o in row.outputs)
    warnings = "".join(f"<li>{_e(w)}</li>" for w in row.warnings)
    errors = "".join(f"<details><summary>{_e(stage)} error</summary><pre>{_e(message)}</pre></details>"
                     for stage, message in row.errors.items())
    why = _reason(row)
    return f"""
<section class="case" id="case-{_e(case)}" data-case="{_e(case)}" data-status="{_e(status)}">
<h2>{_e(case)} <span class="status {_e(status)}">{_e(status)}</span></h2>
{f'<p class="reason">{_e(why)}</p>' if why else ''}
<table class="facts">
<tr><th>kernel</th><td>{_e(_timing_text(row.kernel_timing, row.kernel_us))}</td></tr>
<tr><th>golden</th><td>{_e(_timing_text(row.golden_timing, row.golden_us))}</td></tr>
<tr><th>speedup</th><td>{_e(_speedup_text(row))} (golden median / kernel median, 1 sigma)</td></tr>
<tr><th>max abs error</th><td>{_e(row.max_abs)}</td></tr>
<tr><th>golden protected</th><td>{_e(_protection_text(row.golden_protected))}</td></tr>
</table>
{f'<ul class="warnings">{warnings}</ul>' if warnings else ''}
<table class="stages"><tr><th>stage</th><th>state</th><th>content key</th></tr>{stage_rows}</table>
{f'<table class="outputs"><tr><th>output</th><th>verdict</th><th>report</th></tr>{outputs}</table>' if outputs else ''}
{errors}
<div class="plots">{"".join(_plot_html(p) for p in plots)}</div>
</section>"""


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
pre { margin: 0; white-space: pre-wrap; font-size: 0.85em; }
.status, .state { font-weight: bold; }
.PASS, .ran, .cached { color: #1e7d32; } .FAIL, .FAILED { color: #c0392b; }
.SKIPPED, .INCOMPLETE { color: #b9770e; }
.key { font-family: monospace; font-size: 0.8em; }
section.case { border-top: 2px solid #888; margin-top: 2em; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
figure.plot { margin: 0; max-width: 560px; }
figure.plot svg { width: 100%; height: auto; }
figcaption, .no-plot { font-size: 0.85em; color: #555; }
"""

# After layout, every figure records its rendered size, so a headless browser's DOM dump shows what was drawn.
MEASURE = """
window.addEventListener("load", () => {
  for (const figure of document.querySelectorAll("figure.plot")) {
    const box = (figure.querySelector("svg") || figure).getBoundingClientRect();
    figure.dataset.renderedWidth = Math.round(box.width);
    figure.dataset.renderedHeight = Math.round(box.height);
  }
  document.body.dataset.layout = "done";
});
"""


def render(record: RunRecord, plots_of) -> str:
    """The page of a run record; `plots_of(row)` gives a case's Plots."""
    rows = record.cases
    statuses = [r.status for r in rows]
    failed = [s for s in statuses if s.failed]
    skipped = statuses.count(Verdict.SKIPPED)
    verdict = (f"FAILED ({len(failed)} of {len(rows)} cases)" if failed
               else f"ALL {len(rows)} SKIPPED (nothing verified)" if skipped == len(rows)
               else "PASSED" + (f" ({skipped} of {len(rows)} cases SKIPPED)" if skipped else ""))
    shade = Verdict.FAIL if failed else Verdict.SKIPPED if skipped == len(rows) else Verdict.PASS
    summary = "".join(f"<tr><td><a href=\"#case-{_e(r.case)}\">{_e(r.case)}</a></td>"
                      f"<td class=\"status {_e(r.status)}\">{_e(r.status)}</td><td>{_e(_reason(r))}</td>"
                      f"<td>{_fmt(r.kernel_us, '.4g')}</td><td>{_fmt(r.golden_us, '.4g')}</td>"
                      f"<td>{_e(_speedup_text(r))}</td></tr>" for r in rows)
    about = ", ".join(f"{k}: {v}" for k, v in {**record.machine, **record.toolchain}.items())
    key = page_key(record)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>golden-tasks run: {_e(verdict)}</title>
{f"<!-- page {key} -->" if key else ""}<style>{STYLE}</style></head>
<body data-layout="pending">
<h1>golden-tasks run: <span class="status {shade}">{_e(verdict)}</span></h1>
{_when_html(record)}
<p class="about">{_e(about)}</p>
<table class="summary"><tr><th>case</th><th>status</th><th>reason</th><th>kernel median us</th><th>golden median us</th>
<th>speedup</th></tr>{summary}</table>
{"".join(_case_html(r, plots_of(r)) for r in rows)}
<script>{MEASURE}</script>
</body></html>
"""


_WHEN = re.compile(rb'<p class="when">[^<]*</p>')  # all that differs between pages of the same content


def _when_html(record: RunRecord) -> str:
    return f'<p class="when">{_e(_when(record))}</p>'


def page_key(record: RunRecord) -> str:
    """The digest of everything a page shows but when the run was (_WHEN): the record, each case's figures
    (plot_key) and the code; None when a row cannot say what its figures are drawn from."""
    figures = [plot_key(row) for row in record.cases]
    if None in figures:
        return None
    return digest_json({"record": {k: v for k, v in record.to_json().items() if k not in ("started", "finished")},
                        "figures": figures, "code": _drawing_code()})


def _when(record: RunRecord) -> str:
    started, finished = record.started, record.finished
    if started is None:
        return ""
    text = "started " + time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
    return text + (f", took {finished - started:.1f} s" if finished is not None else "")


def read_record(path: Path) -> RunRecord:
    """The run record at `path`; raises BadRecord (a ValueError) with a message naming the file and field."""
    if not path.exists():
        raise BadRecord(f"no run record at {path}: run `doit verify` first")
    return RunRecord.read(path)


# -- the figures of a case, kept in the cache under the content they are drawn from


_DRAWN_FROM = ("golden", "dispatch", "bench")  # the stages whose entries a case's figures show


@functools.cache
def _drawing_code() -> list:
    drawing = (__name__, "golden_tasks.model.compare")  # found, not imported: the comparators import torch
    return [digest_file(Path(importlib.util.find_spec(name).origin)) for name in drawing]


def plot_key(row: CaseRow) -> str:
    """The digest of everything a case's figures are drawn from, or None when the row cannot say (no
    content keys): the golden's and the kernel's outputs and the rounds (their entries' keys, None for a
    stage that did not run), the policy judging them (its fingerprint), and the code that draws them."""
    if not row.keys or not row.fingerprints.get("policy"):
        return None
    drawn_from = {stage: row.keys.get(stage) for stage in _DRAWN_FROM}
    return digest_json({**drawn_from, "policy": row.fingerprints["policy"], "code": _drawing_code()})


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


def write_page(project: Path, plots_of) -> Path:
    """RUNS/report.html from RUNS/report.json; raises ValueError naming a bad record."""
    runs = config.runs_root(project)
    page = render(read_record(runs / "report.json"), plots_of).encode()
    atomic_write(runs / "report.html", lambda f: f.write(page))
    return runs / "report.html"


def write_page_if_drawn(project: Path) -> bool:
    """Write the page here, without plotting, when every case's figures are in the cache (a run that changed
    nothing a figure shows): whether it did. Cheap enough for the doit parent: no torch, no matplotlib. A page
    of the same content (page_key) is the old page with the run's time in it: nothing is read or drawn again."""
    store, runs = config.open_store(project), config.runs_root(project)
    try:
        record = read_record(runs / "report.json")
    except ValueError:
        return False
    if (key := page_key(record)) and (old := _page(runs / "report.html", key)):
        page = _WHEN.sub(lambda _: _when_html(record).encode(), old, count=1)
        atomic_write(runs / "report.html", lambda f: f.write(page))
        return True
    plots = {row.case: remembered_plots(store, row) for row in record.cases}
    if any(p is None for p in plots.values()):
        return False
    write_page(project, lambda row: plots[row.case])
    return True


def _page(path: Path, key: str) -> bytes:
    """The page at `path` (its bytes) if it was rendered from content of this page_key, else None."""
    try:
        page = path.read_bytes()
    except OSError:
        return None
    return page if f"<!-- page {key} -->".encode() in page[:1000] else None


def _sources(project: Path, variables: list) -> Sources:
    store = config.open_store(project)
    try:
        layout(project).importable()
        pairs = dict(v.split("=", 1) for v in variables)
        return Sources(store, planned_library(project, store, run_variables(project, pairs.get)))
    except (ValueError, RuntimeError) as exc:  # a bad variable; planning itself failed
        return Sources(store, why=first_line(exc))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m golden_tasks.html_report",
                                     description="Write RUNS/report.html from RUNS/report.json and the store.")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="project root (default: .)")
    parser.add_argument("variables", nargs="*", metavar="NAME=VALUE",
                        help="the run's doit variables (backend=eager, profile=NAME, ...)")
    args = parser.parse_args(argv)
    project = args.project.resolve()
    bad = [v for v in args.variables if "=" not in v]
    if bad:
        parser.error(f"{bad[0]!r} is not NAME=VALUE")
    try:
        record = read_record(config.runs_root(project) / "report.json")
    except ValueError as exc:
        print(f"golden-tasks html report: {exc}", file=sys.stderr)
        return 2
    store = config.open_store(project)
    plots = {row.case: remembered_plots(store, row) for row in record.cases}
    undrawn = [row for row in record.cases if plots[row.case] is None]
    drawers = min(len(undrawn), max(1, int(os.environ.get(config.WORKERS_ENV) or 1)), os.cpu_count() or 1)
    # by the module's import name, so that a drawing process finds its functions (not in its __main__)
    this = importlib.import_module("golden_tasks.reports.html_report")
    if drawers > 1:  # as many drawing processes as doit had workers: figures cost ~0.2 s a case
        with ProcessPoolExecutor(drawers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=this.start_drawing, initargs=(project, args.variables)) as pool:
            plots.update(zip((row.case for row in undrawn), pool.map(this.draw, undrawn)))
    elif undrawn:
        start_drawing(project, args.variables)
        plots.update((row.case, draw(row)) for row in undrawn)
    print(f"html report: {write_page(project, lambda row: plots[row.case])}")
    return 0


_drawing = None  # this process's Sources, once start_drawing made them


def start_drawing(project: Path, variables: list) -> None:
    """Make this process ready to draw figures of the project's cases (draw)."""
    global _drawing
    import matplotlib  # noqa: PLC0415 -- the report's own process only

    matplotlib.use("Agg")  # before the kernel modules are imported: one that imports pyplot gets no GUI backend
    _drawing = _sources(project, variables)


def draw(row: CaseRow) -> list:
    """The case's figures, drawn and remembered in the cache."""
    plots = case_plots(row, _drawing)
    remember_plots(_drawing.store, row, plots)
    return plots


if __name__ == "__main__":
    sys.exit(main())
