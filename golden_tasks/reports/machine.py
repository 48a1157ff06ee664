"""`golden-tasks machine`: what the calibrate stage measured of this machine, as text.

One block per device of each calibration in the store (one per machine class and thread count the runs used),
newest first: the bandwidth at each working-set size by the way the bytes moved, the matmul rate per dtype,
a GPU's datasheet figures beside them, and the figures a project declared in their place.
"""
import time

from ..model.machine import KINDS, Limits, size_text


def threads_text(limits: Limits) -> str:
    """", 2 threads" (a CPU's limits), or "" (a GPU's)."""
    return f", {limits.threads} thread{'s' if limits.threads > 1 else ''}" if limits.threads else ""


def format_limits(found: list[tuple[dict, Limits]]) -> str:
    """The calibrations `found` ((the machine its key names, its limits) each), newest first."""
    blocks = []
    for machine, limits in sorted(found, key=lambda pair: (-pair[1].measured, -(pair[1].threads or 0))):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(limits.measured))
        host = machine.get("host", "a node of its class")
        lines = [f"{limits.device}: {limits.name}{threads_text(limits)} on {host}, measured {when} in "
                 f"{limits.seconds:.1f} s"]
        header = ["working set", *KINDS, "best", "±"]
        rows = [[size_text(b.size), *(f"{b.gbps[k]:.1f}" if k in b.gbps else "-" for k in KINDS), f"{b.best:.1f}",
                 f"{b.spread:.0%}"] for b in limits.bandwidth]
        widths = [max(len(x) for x in column) for column in zip(header, *rows)]
        lines.append("  GB/s  " + "  ".join(h.rjust(w) for h, w in zip(header, widths)))
        lines += ["        " + "  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in rows]
        lines.append("  matmul TFLOP/s: " + ", ".join(f"{dtype} {rate:.3g}" for dtype, rate in limits.tflops.items()))
        if limits.datasheet:
            lines.append(f"  datasheet: {limits.datasheet['gbps']:g} GB/s, TFLOP/s "
                         + ", ".join(f"{d} {r:g}" for d, r in limits.datasheet["tflops"].items()))
        if limits.declared:
            figures = ([f"{limits.declared['gbps']:g} GB/s"] if "gbps" in limits.declared else []) + (
                ["TFLOP/s " + ", ".join(f"{d} {r:g}" for d, r in limits.declared["tflops"].items())]
                if "tflops" in limits.declared else [])
            lines.append(f"  declared in pyproject.toml [tool.golden-tasks.machine.{limits.device}], which the reports "
                         f"use instead: {', '.join(figures)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
