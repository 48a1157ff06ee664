"""The run as one self-contained HTML page: RUNS/report.html beside RUNS/report.json.

    python -m golden_tasks.html_report [--project DIR]

reads the run record (RUNS/report.json, in the project's runs folder: config.Project) and the store entries its
rows' content keys name, and writes the page atomically. Nothing else is read: no kernel module is imported and
the library is not planned, so the page of a run whose source has since changed shows that run.

Every case lists its status, reason, timings, warnings, stage states and content keys, and its figures
(golden_tasks.reports.figures), drawn in as many processes as the run had workers unless the cache holds them.
Nothing outside the file is referenced: CSS inline, figures inline SVG, and a small script that records each
figure's rendered size in the DOM (data-rendered-width/-height) once the page is laid out.

It runs in its own process: drawing imports torch and matplotlib and unpickles the cases' saved policies (their
comparators user code by value), which the doit parent must not, so those imports are made where they are used.
"""
import argparse
import html
import importlib
import importlib.util
import multiprocessing
import os
import re
import sys
import time
from pathlib import Path

from ..model.hashing import digest_json
from ..model.records import BadRecord, CaseRow, RunRecord, Timing
from ..model.verdicts import Verdict
from ..pipeline.stage_table import STAGES
from ..pipeline.summary import first_line, origin, resized, sweeps_of
from ..project import config
from ..storage.store import atomic_write
from . import roofline
from .figures import Plot, Sources, case_plots, drawing_code, plot_key, remember_plots, remembered_plots

# -- the page


def _e(value) -> str:
    return html.escape("-" if value is None else str(value))


_STAGE_ORDER = {s.name: i for i, s in enumerate(STAGES)}


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
    return _fmt(row.speedup, ".3g") + "x" + ("" if row.speedup_err is None else f" ± {_fmt(row.speedup_err, '.2g')}") \
        + f" over {row.speedup_over}"


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


def draws_figures(row: CaseRow) -> bool:
    """Whether a case's section has figures of its own: a sweep's point only where it did not pass (its sweep's
    figures show the others: a thousand points' figures would make a page of a hundred megabytes)."""
    return not row.sweep_of or row.status != Verdict.PASS


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
{f'<p class="point">a point of the sweep <a href="#sweep-{_e(row.sweep_of)}">{_e(row.sweep_of)}</a>: '
 f'{_e(", ".join(f"{a}={v}" for a, v in row.point.items()))}</p>' if row.sweep_of else ''}
{f'<p class="reason">{_e(why)}</p>' if why else ''}
<table class="facts">
<tr><th>kernel</th><td>{_e(_timing_text(row.kernel_timing, row.kernel_us))}</td></tr>
<tr><th>golden</th><td>{_e(_timing_text(row.golden_timing, row.golden_us))}</td></tr>
<tr><th>speedup</th><td>{_e(_speedup_text(row))} (the baseline's median / the kernel's, 1 sigma)</td></tr>
<tr><th>max error</th><td>{_e(row.max_error())}</td></tr>
<tr><th>golden protected</th><td>{_e(_protection_text(row.golden_protected))}</td></tr>
{f'<tr><th>from</th><td>{_e(_dataset_text(row.dataset))}</td></tr>' if row.dataset else ''}
</table>
{f'<ul class="warnings">{warnings}</ul>' if warnings else ''}
<table class="stages"><tr><th>stage</th><th>state</th><th>content key</th></tr>{stage_rows}</table>
{f'<table class="outputs"><tr><th>output</th><th>verdict</th><th>report</th></tr>{outputs}</table>' if outputs else ''}
{errors}
<div class="plots">{"".join(_plot_html(p) for p in plots)}</div>
</section>"""


def _dataset_text(dataset: dict) -> str:
    """A dataset's case (CaseRow.dataset): the dataset, where in it, and the sizes it ran at."""
    ran = f"; {resized(dataset)}" if dataset.get("declared") else ""
    solution = f", solution {dataset['solution']}" + (f" ({dataset['language']})" if dataset.get("language") else "")
    return f"the {dataset['format']} dataset {dataset['dataset']}: {origin(dataset)}{solution}{ran}"


def _sections(rows: list, plots_of, sweeps: dict) -> str:
    """Each case's section, in the record's order, a sweep's heading before its first point's."""
    parts, headed = [], set()
    for row in rows:
        if row.sweep_of and row.sweep_of not in headed:
            headed.add(row.sweep_of)
            parts.append(_sweep_html(row.sweep_of, sweeps[row.sweep_of]))
        parts.append(_case_html(row, plots_of(row)))
    return "".join(parts)


def _sweep_html(sweep: str, rows: list) -> str:
    """The heading of a sweep's points (their figures are with the library's, above)."""
    points = [r for r in rows if not r.baseline_of]
    counts = ", ".join(f"{n} {v}" for v in Verdict if (n := sum(r.status == v for r in points)))
    return f'<h2 class="sweep" id="sweep-{_e(sweep)}">sweep {_e(sweep)}: {len(points)} points ({_e(counts)})</h2>'


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


def render(record: RunRecord, plots_of, library: list[Plot]) -> str:
    """The page of a run record; `plots_of(row)` gives a case's Plots, `library` the library's (roofline)."""
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
<div class="plots">{"".join(_plot_html(p) for p in library)}</div>
{_sections(rows, plots_of, sweeps_of(rows))}
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
                        "figures": figures, "library": roofline.library_key(record), "code": drawing_code(__name__)})


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


def write_page(project: Path, plots_of, library: list[Plot]) -> Path:
    """RUNS/report.html from RUNS/report.json; raises ValueError naming a bad record."""
    runs = config.Project.at(project).runs
    page = render(read_record(runs / "report.json"), plots_of, library).encode()
    atomic_write(runs / "report.html", lambda f: f.write(page))
    return runs / "report.html"


def write_page_if_drawn(project: Path) -> bool:
    """Write the page here, without plotting, when every case's figures are in the cache (a run that changed
    nothing a figure shows): whether it did. Cheap enough for the doit parent: no torch, no matplotlib. A page
    of the same content (page_key) is the old page with the run's time in it: nothing is read or drawn again."""
    store, runs = (found := config.Project.at(project)).store, found.runs
    try:
        record = read_record(runs / "report.json")
    except ValueError:
        return False
    if (key := page_key(record)) and (old := _page(runs / "report.html", key)):
        page = _WHEN.sub(lambda _: _when_html(record).encode(), old, count=1)
        atomic_write(runs / "report.html", lambda f: f.write(page))
        return True
    plots = {row.case: remembered_plots(store, row) if draws_figures(row) else [] for row in record.cases}
    library = roofline.remembered(store, record)
    if any(p is None for p in plots.values()) or library is None:
        return False
    write_page(project, lambda row: plots[row.case], library)
    return True


def _page(path: Path, key: str) -> bytes:
    """The page at `path` (its bytes) if it was rendered from content of this page_key, else None."""
    try:
        page = path.read_bytes()
    except OSError:
        return None
    return page if f"<!-- page {key} -->".encode() in page[:1000] else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m golden_tasks.html_report",
                                     description="Write RUNS/report.html from RUNS/report.json and the store.")
    parser.add_argument("--project", type=Path, default=Path.cwd(), help="project root (default: .)")
    project = parser.parse_args(argv).project.resolve()
    try:
        record = read_record(config.Project.at(project).runs / "report.json")
    except ValueError as exc:
        print(f"golden-tasks html report: {exc}", file=sys.stderr)
        return 2
    store = config.Project.at(project).store
    plots = {row.case: remembered_plots(store, row) if draws_figures(row) else [] for row in record.cases}
    undrawn = [row for row in record.cases if plots[row.case] is None]
    drawers = min(len(undrawn), config.current().workers, os.cpu_count() or 1)
    # by the module's import name, so that a drawing process finds its functions (not in its __main__)
    this = importlib.import_module("golden_tasks.reports.html_report")
    if drawers > 1:  # as many drawing processes as doit had workers: figures cost ~0.2 s a case
        # here, not at the module's top: the doit parent imports this module at its exit (write_page_if_drawn),
        # where concurrent.futures.process can no longer register its own exit handler
        from concurrent.futures import ProcessPoolExecutor  # noqa: PLC0415

        with ProcessPoolExecutor(drawers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=this.start_drawing, initargs=(store,)) as pool:
            plots.update(zip((row.case for row in undrawn), pool.map(this.draw, undrawn)))
    elif undrawn:
        start_drawing(store)
        plots.update((row.case, draw(row)) for row in undrawn)
    if (library := roofline.remembered(store, record)) is None:
        start_drawing(store)
        library = roofline.library_plots(record, store)
        roofline.remember(store, record, library)
    print(f"html report: {write_page(project, lambda row: plots[row.case], library)}")
    return 0


_drawing = None  # this process's Sources, once start_drawing made them


def start_drawing(store) -> None:
    """Make this process ready to draw figures of the cases whose entries `store` holds (draw)."""
    global _drawing
    import matplotlib  # noqa: PLC0415 -- the report's own process only

    matplotlib.use("Agg")  # before a saved policy is unpickled: one whose module imports pyplot gets no GUI backend
    _drawing = Sources(store)


def draw(row: CaseRow) -> list:
    """The case's figures, drawn and remembered in the cache."""
    plots = case_plots(row, _drawing)
    remember_plots(_drawing.store, row, plots)
    return plots


if __name__ == "__main__":
    sys.exit(main())
