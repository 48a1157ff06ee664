"""The library's figures for the HTML page: every case against this machine's limits, and each sweep's.

- The roofline: each case that does FLOPs at its arithmetic intensity (FLOPs per byte of its work) and the
  FLOP rate it reached, under the machine's roofs (its matmul rate per dtype, flat; its bandwidth in cache and
  in memory, sloped).
- The bandwidth curve: the bandwidth the machine reached at each working-set size (the best way, and a
  STREAM triad), with each case at its working set and the GB/s it reached.

Drawn from the run record (each row's `speed`) and the calibrate entry its rows' keys name, like a case's
figures (figures.py), and kept in the cache under what they are drawn from (library_key), so a page whose
cases' speeds did not change draws nothing.
"""
import collections
import dataclasses
import json

from ..model.hashing import digest_json
from ..model.machine import Limits
from ..model.outputs import MachineMeta
from ..model.records import RunRecord
from ..pipeline.stage_table import StageName
from ..storage.store import atomic_write
from .figures import Plot, Unplottable, drawing_code, new_figure, plain_log_labels, svg_of
from .machine import threads_text
from .sweeps import sweep_plots


def library_key(record: RunRecord) -> str:
    """The digest of everything the library's figures are drawn from: each row's speed, the calibrate entries
    its rows name, and the code that draws them."""
    speeds = [[row.case, row.speed and row.speed.to_json(), row.point, row.sweep_of, row.status, row.kernel_us,
               row.caveat] for row in record.cases]
    calibrated = sorted({key for row in record.cases if (key := row.keys.get(StageName.CALIBRATE))})
    return digest_json({"speeds": speeds, "limits": calibrated, "declared": record.declared,
                        "code": drawing_code(__name__, "golden_tasks.reports.sweeps")})


def limits_of(record: RunRecord, store) -> Limits:
    """The limits the rows were measured against: the calibrate entry most rows name, at the device and thread
    count most of their timings had (Unplottable where there is none)."""
    keys = collections.Counter(key for row in record.cases if (key := row.keys.get(StageName.CALIBRATE)))
    if not keys:
        raise Unplottable("no case of this run was measured against this machine's limits")
    key = keys.most_common(1)[0][0]
    entry = store.get(StageName.CALIBRATE, key)
    if entry is None:
        raise Unplottable(f"its calibrate entry {key[:16]} is no longer in the cache")
    timed = collections.Counter((t.device or "cpu", t.threads) for row in record.cases if (t := row.kernel_timing))
    device, threads = timed.most_common(1)[0][0] if timed else ("cpu", None)
    limits = MachineMeta.of(entry).of_device(device, threads, record.declared)
    if limits is None:
        raise Unplottable(f"the calibration holds no limits of the {device}")
    return limits


def draw_roofline(record: RunRecord, limits: Limits) -> Plot:
    points = [(row.case, row.speed.intensity, row.speed.tflops * 1e3) for row in record.cases
              if row.speed and row.speed.intensity and row.speed.tflops]
    swept = {row.case for row in record.cases if row.sweep_of}
    if not points:
        return Plot("roofline", "roofline", reason="no case of this run does FLOPs that were counted or declared")
    fig = new_figure(6.4, 3.8)
    ax = fig.add_subplot()
    xs = [x for _, x, _ in points]
    low, high = min(xs) / 4, max(xs) * 4
    in_memory, in_cache = limits.bandwidth[-1].best, max(b.best for b in limits.bandwidth)
    for gbps, label in ((in_cache, "cache"), (in_memory, "memory")):
        ax.plot([low, high], [low * gbps, high * gbps], linestyle="--", linewidth=1,
                label=f"{label} {gbps:.3g} GB/s")
    for dtype, rate in sorted(limits.tflops.items(), key=lambda item: -item[1]):
        ax.axhline(rate * 1e3, linewidth=1, color="#555555", alpha=0.6)
        ax.annotate(f"matmul {dtype} {rate * 1e3:.3g} GFLOP/s", (high, rate * 1e3), fontsize=7, ha="right",
                    va="bottom", color="#555555")
    ax.scatter(xs, [y for _, _, y in points], s=16, color="#c0392b", zorder=3, label="case")
    for name, x, y in points:
        if name not in swept:  # a sweep's points: too many to name (the sweep's own figures show each)
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_labels(ax.xaxis)
    plain_log_labels(ax.yaxis)
    ax.set_xlim(low, high)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of its work)")
    ax.set_ylabel("GFLOP/s reached")
    ax.set_title(f"roofline: {limits.name}{threads_text(limits)}", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    return Plot("roofline", f"{len(points)} cases that do FLOPs, under this machine's roofs", svg=svg_of(fig))


def draw_bandwidth(record: RunRecord, limits: Limits) -> Plot:
    points = [(row.case, row.speed.working_set, row.speed.gbps) for row in record.cases
              if row.speed and row.speed.gbps and row.speed.working_set]
    fig = new_figure(6.4, 3.8)
    ax = fig.add_subplot()
    sizes = [b.size for b in limits.bandwidth]
    ax.plot(sizes, [b.best for b in limits.bandwidth], marker="o", markersize=3, label="this machine, best")
    ax.plot(sizes, [b.gbps.get("triad", b.best) for b in limits.bandwidth], linestyle="--", linewidth=1,
            label="STREAM triad")
    if points:
        ax.scatter([s for _, s, _ in points], [g for _, _, g in points], s=16, color="#c0392b", zorder=3,
                   label="case")
        swept = {row.case for row in record.cases if row.sweep_of}
        for name, size, gbps in points:
            if name not in swept:
                ax.annotate(name, (size, gbps), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_labels(ax.yaxis)
    ax.set_xlabel("working set (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title("bandwidth by working-set size", fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    return Plot("bandwidth", f"{len(points)} cases at their working sets, on this machine's bandwidth curve",
                svg=svg_of(fig))


def library_plots(record: RunRecord, store) -> list[Plot]:
    """The library's figures (or a Plot saying why there are none), and each sweep's (sweeps.sweep_plots)."""
    try:
        limits = limits_of(record, store)
    except Unplottable as why:
        plots = [Plot("roofline", "roofline", reason=str(why))]
    else:
        plots = [draw_roofline(record, limits), draw_bandwidth(record, limits)]
    return plots + sweep_plots(record)


def remembered(store, record: RunRecord) -> list[Plot] | None:
    """The library's figures as drawn before from the same content, or None."""
    try:
        found = json.loads(store.plot_path(library_key(record)).read_text())
        return [Plot(**p) for p in found["plots"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None


def remember(store, record: RunRecord, plots: list[Plot]) -> None:
    """Keep the library's figures for the next page drawn from the same content (figures.remember_plots), with
    the calibrate entries they show, so that gc drops them with those."""
    if not store.readonly:
        shown = sorted({(StageName.CALIBRATE.value, key) for row in record.cases
                        if (key := row.keys.get(StageName.CALIBRATE))})
        text = json.dumps({"drawn_from": shown, "plots": [dataclasses.asdict(p) for p in plots]}).encode()
        atomic_write(store.plot_path(library_key(record)), lambda f: f.write(text))
