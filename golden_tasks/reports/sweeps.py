"""A sweep's figures for the HTML page: its kernel's time and throughput against each of its axes.

For each sweep of the run (the rows of its points, Case.sweep) and each axis with more than one value: the
kernel's median against the axis, one line for each combination of the other axes' values, with each of its
baselines (dashed); beside it the throughput the kernel reached, in TFLOP/s where the points count FLOPs and
GB/s where they do not, under the machine's limit at each point (dotted: the peak its speed was measured
against, model.machine). Drawn from the run record alone, with the library's figures (roofline.library_plots).
"""
from ..model.records import CaseRow, RunRecord
from ..model.verdicts import Verdict
from ..pipeline.summary import sweeps_of
from .figures import Plot, new_figure, plain_log_labels, svg_of


def _positions(values: list) -> tuple[list, bool]:
    """Where each of an axis's values sits on the x axis, and whether that axis is a log2 one (numbers spanning
    8x or more); otherwise the values in order, one step apart."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)
    if numeric and max(values) / min(values) >= 8:
        return list(values), True
    return list(range(len(values))), False


def _series(rows: list[CaseRow], axis: str, value_of) -> dict[str, dict]:
    """label -> {axis value: y} for the rows with a y (value_of(row) not None), a line per combination of the
    other axes' values."""
    lines: dict[str, dict] = {}
    for row in rows:
        if (y := value_of(row)) is None:
            continue
        others = ", ".join(f"{a}={v}" for a, v in row.point.items() if a != axis)
        lines.setdefault(others, {})[row.point[axis]] = y
    return lines


def _draw(ax, axis: str, values: list, lines: dict, style: dict, name: str) -> None:
    xs, log2 = _positions(values)
    where = dict(zip(values, xs))
    for label, ys in lines.items():
        shown = [v for v in values if v in ys]
        ax.plot([where[v] for v in shown], [ys[v] for v in shown], label=(f"{name} {label}".strip()), **style)
    if log2:
        ax.set_xscale("log", base=2)
    else:
        ax.set_xticks(xs, [str(v) for v in values])
    ax.set_xlabel(axis)


def _y_scale(ax) -> None:
    """A log y axis where what is drawn spans 10x or more, else a linear one."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y and y > 0]
    if ys and max(ys) / min(ys) >= 10:
        ax.set_yscale("log")
        plain_log_labels(ax.yaxis)


def _kernel_time(row: CaseRow):
    return row.kernel_us if row.status == Verdict.PASS and not row.caveat else None


def draw_axis(sweep: str, axis: str, rows: list[CaseRow]) -> Plot:
    """The sweep's time and throughput against `axis`."""
    points = [r for r in rows if not r.baseline_of]
    values = list(dict.fromkeys(r.point[axis] for r in points))
    baselines: dict[str, list[CaseRow]] = {}
    for row in rows:
        if row.baseline_of:
            baselines.setdefault(row.case.rpartition("@")[2], []).append(row)
    fig = new_figure(9.6, 3.6)
    fig.subplots_adjust(left=0.08, right=0.98, wspace=0.3)
    timed, rate = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _draw(timed, axis, values, _series(points, axis, _kernel_time), {"marker": "o", "markersize": 3}, "kernel")
    for name, own in baselines.items():
        _draw(timed, axis, values, _series(own, axis, _kernel_time),
              {"marker": "x", "markersize": 3, "linestyle": "--", "linewidth": 1}, name)
    _y_scale(timed)
    timed.set_ylabel("median us")
    timed.legend(fontsize=6)
    flops = sum(1 for r in points if r.speed and r.speed.tflops) * 2 > len(points)
    unit, reached, peak = (("TFLOP/s", "tflops", "peak_tflops") if flops else ("GB/s", "gbps", "peak_gbps"))
    _draw(rate, axis, values, _series(points, axis, lambda r: _kernel_time(r) and getattr(r.speed, reached, None)),
          {"marker": "o", "markersize": 3}, "kernel")
    _draw(rate, axis, values, _series(points, axis, lambda r: r.speed and getattr(r.speed, peak)),
          {"linestyle": ":", "linewidth": 1, "color": "#555555"}, "machine's limit")
    _y_scale(rate)
    rate.set_ylabel(unit)
    rate.legend(fontsize=6)
    fig.suptitle(f"{sweep} against {axis}", fontsize=10)
    return Plot("sweep", f"{sweep}: the kernel's median and {unit} at each {axis} ({len(points)} points)",
                svg=svg_of(fig))


def sweep_plots(record: RunRecord) -> list[Plot]:
    """A Plot for each axis of more than one value of each sweep of the run."""
    plots = []
    for sweep, rows in sweeps_of(record.cases).items():
        axes = list(dict.fromkeys(axis for r in rows for axis in r.point))
        for axis in axes:
            if len({r.point.get(axis) for r in rows}) > 1:
                plots.append(draw_axis(sweep, axis, rows))
    return plots
