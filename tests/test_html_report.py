"""runs/report.html: a real doit run rendered, then opened in headless chromium; the heat map binning on its own."""
import json
import re
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest
import torch
from project import Project

from golden_tasks.model.records import RunRecord, Timing
from golden_tasks.reports import figures
from golden_tasks.reports import html_report as html_report_module
from golden_tasks.reports.figures import RATIO_FLOOR, grid_shape, mismatch_bins, mismatch_extent, ratio_histogram
from golden_tasks.reports.html_report import write_page_if_drawn

INSTALL = "apt-get install -y chromium"
# As root chromium needs --no-sandbox; --virtual-time-budget lets the page's load handler run before the dump;
# --disable-dev-shm-usage keeps it working in containers with a small /dev/shm.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                  "--window-size=1280,2400", "--virtual-time-budget=5000"]

TILES = textwrap.dedent('''
    """tiles: out = 2 x, by a kernel that is right and by one that is wrong only in its last tile."""
    import torch

    from golden_tasks import Case, In, Out, TensorSpec, jit, ratio_allclose

    SHAPE = (40, 96)  # 16 x 16 tiles: the last one holds rows 32..39 (a partial tile) and columns 80..95


    @jit
    def doubled(x: In, out: Out):
        out.copy_(x * 2)


    @jit
    def doubled_but_last_tile(x: In, out: Out):
        out.copy_(x * 2)
        out[32:, 80:] = x[32:, 80:]  # the tail tile is left undoubled


    def golden_doubled(t):
        t["out"].copy_(t["x"] * 2)


    def specs():
        return [TensorSpec("x", SHAPE, torch.float32, init_value=torch.randn),
                TensorSpec("out", SHAPE, torch.float32)]


    CASES = [Case(name, specs=specs, kernel=kernel, golden=golden_doubled, backend="eager", warmup=1, rounds=10,
                  compare=compare)
             for name, kernel, compare in (
                 ("tiles_ok", doubled, {}), ("tiles_tail_bug", doubled_but_last_tile, {}),
                 # rows 32.. are to be left 0, and are not: it fails with no element outside its bound
                 ("tiles_dirty_tail", doubled, {"out": ratio_allclose(valid_rows=32, zero_tail=True)}))]
''')


def chromium_path() -> str:
    """Debian's chromium; a missing browser fails the test (CI must install it), naming the install command."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail(f"chromium is not installed; install it: {INSTALL}")
    return exe


def chromium(exe, tmp_path, *args) -> subprocess.CompletedProcess:
    """chromium, headless, with its own profile directory."""
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


class Sections(HTMLParser):
    """case -> {"status", "plots": [attrs of each figure.plot / p.no-plot]} of a page's DOM."""

    def __init__(self, text):
        super().__init__()
        self.cases, self.body, self._case = {}, {}, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        elif tag == "section" and "case" in (attrs.get("class") or "").split():
            self._case = self.cases[attrs["data-case"]] = {"status": attrs["data-status"], "plots": []}
        elif self._case is not None and (tag, attrs.get("class")) in (("figure", "plot"), ("p", "no-plot")):
            self._case["plots"].append({"tag": tag, **attrs})

    def handle_endtag(self, tag):
        if tag == "section":
            self._case = None


def html_report(proj, *args):
    return subprocess.run([sys.executable, "-m", "golden_tasks.html_report", "--project", str(proj.path), *args],
                          cwd=proj.path, env=proj.env, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
def test_a_real_run_shows_where_the_failing_case_mismatches_in_a_browser(tmp_path, monkeypatch):
    browser = chromium_path()  # first: without one the test fails at once
    proj = Project(tmp_path / "p", (), html=True)
    (proj.path / "kernels" / "tiles.py").write_text(TILES)
    run = proj.console("--continue", "verify")
    assert run.returncode != 0 and re.search(r"^tiles_tail_bug +FAIL ", run.stdout, re.M), run.stdout + run.stderr
    page = proj.path / "runs" / "report.html"
    drawn_by_the_run = page.read_text()
    # the figures are kept under the content they show: the next page is drawn from them, without plotting
    assert len(list((proj.cache / "plots").glob("*.json"))) == 3 + 1  # each case's, and the library's
    monkeypatch.setenv("GOLDEN_TASKS_CACHE", str(proj.cache))
    monkeypatch.setenv("GOLDEN_TASKS_RUNS", str(proj.path / "runs"))
    assert write_page_if_drawn(proj.path) and page.read_text() == drawn_by_the_run
    made = html_report(proj)
    assert made.returncode == 0 and made.stdout == f"html report: {page}\n", made.stderr
    text = page.read_text()
    assert len(text) < 300_000  # figures are SVG of binned data, not of every element
    # self-contained: anchors within the page and data: URIs only (the heat map's cells are an embedded PNG)
    assert not re.findall(r"\bsrc=", text)
    assert {v.split(":")[0] for v in re.findall(r'href="([^"#]*)[#"]', text)} <= {"", "data"}
    assert "128 mismatching elements within rows 32..39 and columns 80..95 of 40 x 96" in text
    # the library against the machine's limits: its bandwidth curve with the cases on it; no case does FLOPs
    assert re.search(r'<figure class="plot" data-kind="bandwidth"[^>]*>', text) and "bandwidth by working-set" in text
    assert "no case of this run does FLOPs that were counted or declared" in text

    dom = Sections(chromium(browser, tmp_path, "--dump-dom", page.as_uri()).stdout)
    assert dom.body.get("data-layout") == "done"  # the page's script ran after layout
    ok, bad = dom.cases["tiles_ok"], dom.cases["tiles_tail_bug"]
    assert (ok["status"], bad["status"]) == ("PASS", "FAIL")

    def drawn(case, kind):
        return [(int(p["data-rendered-width"]), int(p["data-rendered-height"]))
                for p in case["plots"] if p["tag"] == "figure" and p["data-kind"] == kind]

    assert len(drawn(bad, "mismatch-map")) == 1 and all(w > 200 and h > 150 for w, h in drawn(bad, "mismatch-map"))
    assert [p for p in ok["plots"] if p["data-kind"] == "mismatch-map"] == []  # a passing output has no map
    dirty = dom.cases["tiles_dirty_tail"]
    assert dirty["status"] == "FAIL" and [p["tag"] for p in dirty["plots"] if p["data-kind"] == "mismatch-map"] == ["p"]
    assert "output &#x27;out&#x27;: no element is outside its bound; its report says why it fails" in text
    for case in (ok, bad, dirty):
        assert [p["data-output"] for p in case["plots"] if p["data-kind"] == "error-histogram"] == ["out"]
        assert all(w > 200 and h > 100 for w, h in drawn(case, "error-histogram"))
    # the rounds are drawn from the store for a case that reached its bench, else a reason says so
    timed = {r["case"]: bool(r.get("kernel_timing"))
             for r in json.loads((proj.path / "runs" / "report.json").read_text())["cases"]}
    assert timed["tiles_ok"] and re.search(r"kernel benchmark: \d+ rounds, \d+ outliers", text)
    assert not timed["tiles_tail_bug"] and not timed["tiles_dirty_tail"]
    for name, case in dom.cases.items():
        assert [p["tag"] for p in case["plots"] if p["data-kind"] == "bench-rounds"] == [
            "figure" if timed[name] else "p"], name

    # The page shows the run its record is of, from the entries its keys name: with the kernel module failing on
    # import and no figure remembered, it is drawn again, the same, importing no kernel module and planning nothing
    (proj.path / "kernels" / "tiles.py").write_text('raise SystemExit("the report imported the kernel module")\n')
    shutil.rmtree(proj.cache / "plots")
    made = html_report(proj)
    assert made.returncode == 0 and made.stdout == f"html report: {page}\n", made.stderr
    redrawn = Sections(page.read_text()).cases
    assert [p["tag"] for p in redrawn["tiles_tail_bug"]["plots"] if p["data-kind"] == "mismatch-map"] == ["figure"]
    assert "128 mismatching elements within rows 32..39" in page.read_text()
    record = json.loads((proj.path / "runs" / "report.json").read_text())
    next(row for row in record["cases"] if row["case"] == "tiles_ok")["keys"]["dispatch"] = None
    (proj.path / "runs" / "report.json").write_text(json.dumps(record))
    assert html_report(proj).returncode == 0
    assert "outputs: the run made no dispatch entry" in page.read_text()

    shot = tmp_path / "report.png"
    chromium(browser, tmp_path, f"--screenshot={shot}", page.as_uri())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (2400, 1280)
    assert (pixels[..., :3] < 0.9).any(-1).mean() > 0.02  # ink: text, tables and figures, not a blank page


RECORD = {
    "passed": False, "started": 1.7e9, "finished": 1.7e9 + 12.5,
    "machine": {"host": "h", "cpu": "c", "cores": 2, "threads": 2, "gpus": []}, "toolchain": {"python": "3.11"},
    "cases": [
        {"case": "gone", "status": "PASS", "stages": {"bench": "ran", "abi": "cached"}, "errors": {}, "reason": None,
         "skipped": None, "max_abs": 0.0, "outputs": [{"name": "o", "passed": True, "message": "output 'o': fine",
                                                        "max_abs": 0.0, "max_rel": 0.0, "mismatches": 0, "total": 4,
                                                        "stats": {}}],
         "warnings": ["output 'o': its golden is constant (0.0)"], "kernel_us": 10.0, "golden_us": 20.0,
         "speedup": 2.0, "speedup_err": 0.1,
         "kernel_timing": {"min": 9.0, "median": 10.0, "mean": 10.5, "max": 40.0, "std": 3.0, "iqr": 1.0,
                           "rse": 0.01, "outliers": 1, "rounds": 30, "warmup": 2, "stopped": "noise",
                           "samples": "3" * 32},
         "golden_timing": None, "rank_us": None, "imbalance": None,
         "keys": {"golden": "0" * 32, "dispatch": "1" * 32, "bench": "2" * 32}},
        {"case": "broken", "status": "FAIL", "stages": {}, "errors": {"plan": "SpecError: bad spec\nmore"},
         "kernel_timing": {"median": 5.0}},
    ],
}


@pytest.mark.e2e
def test_a_record_without_entries_says_why_it_has_no_figures(tmp_path):
    proj = Project(tmp_path / "p", ())
    (proj.path / "runs").mkdir()
    (proj.path / "runs" / "report.json").write_text(json.dumps(RECORD))
    made = html_report(proj)
    assert made.returncode == 0, made.stderr
    text = (proj.path / "runs" / "report.html").read_text()
    cases = Sections(text).cases
    gone, broken = cases["gone"]["plots"], cases["broken"]["plots"]
    assert [(p["tag"], p["data-kind"]) for p in gone] == [("p", "outputs"), ("p", "bench-rounds")]
    assert f"its golden entry {'0' * 16} is no longer in the cache" in text
    assert f"its bench entry {'2' * 16} is no longer in the cache" in text
    assert "kernel benchmark rounds: the case could not be planned: SpecError: bad spec" in text
    assert "2x ± 0.1" in text and "output &#x27;o&#x27;: its golden is constant (0.0)" in text
    assert [(p["tag"], p["data-kind"]) for p in broken] == [("p", "outputs"), ("p", "bench-rounds")]
    assert "outputs: the case could not be planned: SpecError: bad spec" in text
    assert "SpecError: bad spec</td>" in text  # the summary's reason: the first line of the first error
    assert "<th>kernel</th><td>median 10 us, IQR 1, std 3, min 9, max 40, rse 1.00%, 30 rounds after 2 warmup, " \
           "stopped by noise, 1 outliers</td>" in text
    assert "<th>golden</th><td>median 20 us</td>" in text  # no golden_timing: its bare median


@pytest.mark.e2e
@pytest.mark.parametrize("content, message", [
    (None, "no run record at {path}: run `doit verify` first"),
    ("{", "{path}: not JSON: Expecting property name"),
    ('{"cases": [{"status": "PASS"}]}', "{path}: cases[0]: missing case"),
    ('{"cases": [{"case": "c", "status": "PASS", "kernel_timing": {"median": "not a number"}}]}',
     '{path}: cases[0].kernel_timing.median: expected a finite number >= 0, got "not a number"'),
    ('{"cases": [{"case": "c", "status": "PASS", "kernel_us": 1.0, "golden": 2.0}]}',
     "{path}: cases[0].golden: not a field of CaseRow (it has case, status, stages,"),
])
def test_a_missing_or_malformed_record_is_one_message(tmp_path, content, message):
    proj = Project(tmp_path / "p", ())
    path = proj.path / "runs" / "report.json"
    if content is not None:
        path.parent.mkdir()
        path.write_text(content)
    made = html_report(proj)
    assert made.returncode == 2 and made.stderr.startswith("golden-tasks html report: " + message.format(path=path))
    assert "Traceback" not in made.stderr and not (proj.path / "runs" / "report.html").exists()


def test_importing_it_imports_neither_torch_nor_matplotlib():
    """The doit parent may import the module to start it; torch, matplotlib and numpy load only where it draws."""
    code = "import sys, golden_tasks.reports.html_report; print(sorted({'torch', 'matplotlib', 'numpy'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "[]\n"


def test_a_tail_tile_bug_lands_in_the_last_bins():
    mismatch = torch.zeros(3, 100, 130, dtype=torch.bool)  # rows = 3 x 100
    mismatch[2, 96:, 112:] = True  # the last tile of the last batch
    share, row_edges, col_edges = mismatch_bins(mismatch)
    assert share.shape == (64, 64) and row_edges[0] == col_edges[0] == 0 and (row_edges[-1], col_edges[-1]) == (300,
                                                                                                               130)
    assert all(b > a for a, b in zip(row_edges, row_edges[1:])) and all(b > a for a, b in zip(col_edges, col_edges[1:]))
    hot = (share > 0).nonzero()
    first_row_bin = max(i for i, edge in enumerate(row_edges) if edge <= 296)
    first_col_bin = max(i for i, edge in enumerate(col_edges) if edge <= 112)
    assert {int(i) for i in hot[0]} == set(range(first_row_bin, 64)) and min(hot[0]) >= 62
    assert {int(j) for j in hot[1]} == set(range(first_col_bin, 64)) and min(hot[1]) >= 55
    assert share[-1, -1] == 1.0  # bins wholly inside the tile are all mismatching
    counts = [(row_edges[i + 1] - row_edges[i]) * (col_edges[j + 1] - col_edges[j]) * share[i, j]
              for i, j in zip(*hot)]
    assert round(sum(counts)) == 4 * 18  # every mismatching element is counted once
    assert mismatch_extent(mismatch) == "72 mismatching elements within rows 296..299 and columns 112..129 of 300 x 130"


def test_small_tensors_get_one_bin_per_element():
    assert grid_shape(()) == (1, 1) and grid_shape((7,)) == (1, 7) and grid_shape((2, 3, 4)) == (6, 4)
    share, row_edges, col_edges = mismatch_bins(torch.tensor([False, True, False]))
    assert share.tolist() == [[0.0, 1.0, 0.0]] and row_edges == [0, 1] and col_edges == [0, 1, 2, 3]
    share, _, _ = mismatch_bins(torch.tensor(True))
    assert share.tolist() == [[1.0]]
    assert mismatch_extent(torch.zeros(2, 2, dtype=torch.bool)) == "no element mismatches"


def test_the_error_histogram_counts_each_judged_element_once_against_its_bound():
    inf, nan = float("inf"), float("nan")
    gap = torch.tensor([0.0, 1e-9, 0.5, 1.0, 3.0, 1.0, nan, 2.0, 5.0])
    bound = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, inf, 0.0])  # inf: not judged
    hist = ratio_histogram(gap, bound, per_decade=1)
    assert (hist.judged, hist.over, hist.nonfinite, hist.worst) == (8, 4, 3, 3.0)  # 3x, 1/0, NaN, 5/0
    assert len(hist.counts) == 7 and sum(hist.counts) == 5  # the finite ratios, from 1e-6 up to 10
    assert hist.edges[0] == pytest.approx(RATIO_FLOOR) and hist.edges[6] == 1.0 and hist.edges[-1] == 10.0
    assert hist.counts[0] == 2  # the exact match and 1e-9 lie at or below the floor
    assert hist.counts[5:] == [2, 1]  # 0.5 and exactly 1.0 left of the pass line, 3.0 right of it


@pytest.mark.parametrize("statuses, passed, verdict", [
    (("PASS", "SKIPPED"), True, "PASSED (1 of 2 cases SKIPPED)"),
    (("SKIPPED", "SKIPPED"), True, "ALL 2 SKIPPED (nothing verified)"),
    (("PASS", "PASS"), True, "PASSED"),
    (("FAIL", "SKIPPED", "PASS"), False, "FAILED (1 of 3 cases)"),
])
def test_the_verdict_counts_a_skip_as_no_failure(statuses, passed, verdict):
    record = {"passed": passed, "cases": [{"case": f"c{i}", "status": s} for i, s in enumerate(statuses)]}
    page = html_report_module.render(RunRecord.from_json(record), lambda row: [], [])
    assert f"<title>golden-tasks run: {verdict}</title>" in page


def test_one_slow_round_does_not_flatten_the_rounds_plot():
    times = [10.0 + 0.01 * (i % 7) for i in range(60)] + [500.0]
    timing = Timing(times=times, outliers=1, median=10.03)
    low, high = figures.rounds_range(timing)
    assert 9.9 < low < 10.0 and 10.06 < high < 10.1  # the regular rounds fill the axis
    svg = figures.draw_rounds(timing)
    assert "outlier above the scale (slowest 500 us)" in svg
