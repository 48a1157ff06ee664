"""The GPU check: every GPU path of golden-tasks proven in one run, on a machine with an NVIDIA GPU.

    python benchmarks/gpu_check.py prepare [--wheels DIR]   here, where the package registries are
    python benchmarks/gpu_check.py run OUT [--wheels DIR]   on the GPU machine, first thing: OUT/table.md, OUT/logs/

`prepare` downloads into DIR (default wheels/, which git ignores) the wheels of what golden-tasks and its GPU
tests need beyond what this project's GPU machines hold (Python 3.12 with torch, triton and numpy, which are
never downloaded): at the versions this environment runs, for CPython 3.12 on x86_64 Linux. It says their size
beside the working tree's: at most 64 MiB travel with it (the device tool's `carry`).

`run` installs those wheels, with no index, into OUT/site (unpacked where the machine's Python has no pip),
and puts it and this working tree on PYTHONPATH:
golden-tasks runs from the tree on the machine's own torch and triton, nothing heavy installed. Then each check
runs in turn, within the run's budget (under 8 minutes), its output in OUT/logs/<check>.log:

    environment   Python, torch (against the package's floor), triton, the GPUs, nvcc, the sandbox
    library       the library's CUDA and Triton cases (compiled, bfloat16 included) and its CUDA multi-rank
                  case through real doit, cold, with flush=1: each PASS, or SKIPPED for a reason this machine
                  gives (NCCL wants a GPU per rank: two ranks on one GPU are skipped, and the table says so),
                  with its GB/s, TFLOP/s and fraction of the speed of light (CUDA events, the L2 flushed)
    limits        the GPU's bandwidth and matmul rates as the calibrate stage measured them, beside its
                  datasheet: between a quarter of it and 5% above, or FAIL
    do_bench      the bench stage's mean of each Triton case against triton.testing.do_bench on the same
                  launcher, inputs and GPU (benchmarks/triton_vs_do_bench.py): within 5%, or FAIL
    gpu tests     `pytest -m gpu`: the tests of GPU paths that skip without a GPU (CUDA events and L2 flush, the
                  CUDA form, NCCL ranks, the GPU sandbox) and the exploit suite's attacks made from the GPU

OUT/table.md holds a row per check, then the cases and the ratios; the exit status is 1 when a check failed.
Without a CUDA device it is a dry run: the environment is reported, every GPU check is listed with why it is
skipped, the GPU tests it would run are collected, and the wheels are checked installable for Python 3.12.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import tomllib

ROOT = Path(__file__).resolve().parents[1]
BUDGET_SECONDS = 450.0  # the whole run: under 8 minutes with the machine's start
CARRY_BYTES = 64 * 2**20  # what the device tool carries with the working tree
# the GPU machines' Python, and the packages they hold, which are never downloaded (device/KINDS.md)
PYTHON = "3.12"
HELD = ("torch", "triton", "numpy") + ("nvidia-", "cuda-")  # names, and prefixes of the CUDA libraries' wheels
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
TESTS = ("pytest",)  # what the GPU tests need besides golden-tasks' own dependencies
# the library's GPU cases: CUDA (and its two-rank NCCL case), Triton (each float32 case beside its bfloat16 one)
CUDA_CASES = ("rms_norm_cuda", "rms_norm_cuda_ranks")
TRITON_CASES = ("rms_norm_triton", "rms_norm_triton_bf16", "softmax_triton", "softmax_triton_bf16", "matmul_triton",
                "matmul_triton_bf16", "decode_swa_triton_f32", "decode_swa_triton")
RATIO_TOLERANCE = 0.05


def requirements() -> list:
    """golden-tasks' runtime dependencies but those the GPU machines hold, then what its GPU tests need."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[ ;<>=!~\[]", d, maxsplit=1)[0] for d in declared if "python_version < " not in d]
    return [n for n in names if not _held(n)] + list(TESTS)


def _held(name: str) -> bool:
    name = name.lower().replace("_", "-")
    return name in HELD or name.startswith(tuple(h for h in HELD if h.endswith("-")))


def _dist_of(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def prepare(wheels: Path) -> int:
    """Download the wheels (see the module); print what travels, and whether it fits."""
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("*.whl"):
        old.unlink()
    pins = [f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
            if d.metadata["Name"] and not _held(d.metadata["Name"]) and d.metadata["Name"] != "golden-tasks"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints:
        constraints.write("\n".join(sorted(set(pins))) + "\n")
        constraints.flush()
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheels), "--only-binary",
                               ":all:", "--python-version", PYTHON, "--implementation", "cp", *platforms, "-c",
                               constraints.name, *requirements()], capture_output=True, text=True)
    if done.returncode:
        print(f"pip download failed:\n{done.stdout}{done.stderr}", file=sys.stderr)
        return 1
    for wheel in wheels.glob("*.whl"):
        if _held(_dist_of(wheel)):  # pulled in by a dependency (matplotlib's numpy): the machines have it
            wheel.unlink()
    carried = sum(w.stat().st_size for w in wheels.glob("*.whl"))
    tree = _tree_bytes()
    for wheel in sorted(wheels.glob("*.whl")):
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    fits = carried + tree <= CARRY_BYTES
    print(f"wheels {carried / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB = {(carried + tree) / 2**20:.1f} MiB"
          f" of the {CARRY_BYTES / 2**20:.0f} MiB carried: {'fits' if fits else 'TOO BIG'}")
    return 0 if fits else 1


def _tree_bytes() -> int:
    """What the device tool copies of the working tree: the files git tracks, and those it does not ignore."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    return sum((ROOT / p).stat().st_size for p in listed.split("\0") if p and (ROOT / p).is_file())


# -- the run


class Run:
    """The checks' shared state: the output folder, the environment the checks' processes get, the budget."""

    def __init__(self, out: Path, wheels: Path, dry: bool):
        self.out, self.wheels, self.dry = out, wheels, dry
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.site = out / "site"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(self.site)]),
                    "GOLDEN_TASKS_HTML": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        self.deadline = time.monotonic() + BUDGET_SECONDS
        self.rows, self.sections = [], []

    def left(self, wanted: float) -> float:
        return max(1.0, min(wanted, self.deadline - time.monotonic()))

    def command(self, name: str, args: list, seconds: float, cwd: Path = ROOT, env: dict = None):
        """Run `args`, its output to logs/<name>.log; the CompletedProcess, or None when it ran out of time."""
        log = self.logs / f"{name}.log"
        with open(log, "a") as f:
            f.write(f"$ {' '.join(map(str, args))}\n")
            f.flush()
            try:
                return subprocess.run(args, cwd=cwd, env=env or self.env, stdout=f, stderr=subprocess.STDOUT,
                                      timeout=self.left(seconds), text=True)
            except subprocess.TimeoutExpired:
                f.write("\n(stopped: out of its time)\n")
                return None

    def row(self, check: str, result: str, started: float, detail: str) -> None:
        self.rows.append((check, result, time.monotonic() - started, detail))
        print(f"{check:12} {result:8} {detail}", flush=True)


def _gpu() -> tuple:
    """(the number of CUDA devices, their names), as torch here sees them."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count, [torch.cuda.get_device_name(i) for i in range(count)]


def check_environment(run: Run) -> None:
    started = time.monotonic()
    import torch

    found = {"python": sys.version.split()[0], "torch": torch.__version__, "torch.cuda": torch.version.cuda}
    for name in ("triton", "numpy"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    count, names = _gpu()
    found["gpus"] = ", ".join(names) or "none"
    nvcc = shutil.which("nvcc")
    found["nvcc"] = nvcc and subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip() \
        .splitlines()[-1]
    probe = subprocess.run([sys.executable, "-c", "import golden_tasks, sys; from golden_tasks.project import "
                            "sandbox; print(golden_tasks.__file__); print(sandbox.support() or 'confines')"],
                           env=run.env, capture_output=True, text=True)
    (run.logs / "environment.log").write_text(json.dumps(found, indent=1) + "\n" + probe.stdout + probe.stderr)
    floor = _torch_floor()
    problems = []
    if probe.returncode:
        problems.append(f"golden_tasks does not import from the working tree: {probe.stderr.strip()[-300:]}")
    elif not probe.stdout.startswith(str(ROOT)):
        problems.append(f"golden_tasks imports from {probe.stdout.splitlines()[0]}, not from the working tree")
    if floor and _version(torch.__version__) < _version(floor):
        problems.append(f"torch {torch.__version__} is below the package's floor {floor}")
    sandboxed = probe.stdout.splitlines()[-1] if probe.returncode == 0 else "?"
    detail = (f"Python {found['python']}, torch {found['torch']} (CUDA {found['torch.cuda']}; floor {floor}), "
              f"triton {found['triton']}, GPUs: {found['gpus']}, nvcc: {found['nvcc'] or 'none'}, sandbox: {sandboxed}")
    run.row("environment", "FAIL" if problems else "PASS", started, "; ".join(problems) or detail)


def _torch_floor() -> str:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next((d.split(">=")[1] for d in declared if d.startswith("torch>=")), None)


def _version(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def install(run: Run) -> bool:
    """The wheels into OUT/site, with no index (a dry run: checked installable for Python 3.12, nothing
    installed); whether that worked, said in a row."""
    started = time.monotonic()
    wheels = sorted(run.wheels.glob("*.whl"))
    if not wheels:
        run.row("wheels", "FAIL", started, f"none in {run.wheels}: run `python benchmarks/gpu_check.py prepare` "
                                           "where the package registries are, and carry the folder")
        return False
    target = ["--target", str(run.site)]
    if run.dry:  # what the GPU machine's pip would do, for its Python, without doing it
        platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
        target = ["--dry-run", "--only-binary", ":all:", "--python-version", PYTHON, "--implementation", "cp",
                  *platforms, *target]
    if importlib.util.find_spec("pip") is None and not run.dry:  # a Python without pip: a wheel is a zip to unpack
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(run.site, [n for n in archive.namelist() if ".data/" not in n])
        ok = True
    else:
        done = run.command("wheels", [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
                                      *target, *map(str, wheels)], 120)
        ok = done is not None and done.returncode == 0
    size = sum(w.stat().st_size for w in wheels) / 2**20
    done_what = f"installable for Python {PYTHON} (a dry run: not installed)" if run.dry else "installed"
    run.row("wheels", "PASS" if ok else "FAIL", started,
            f"{len(wheels)} wheels, {size:.1f} MiB, {done_what}" + ("" if ok else ": see logs/wheels.log"))
    return ok


def check_library(run: Run) -> Path:
    """The GPU cases through doit in a copy of the library with its own cache; the record's path."""
    started = time.monotonic()
    project = run.out / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir()
    shutil.copy(ROOT / "dodo.py", project)
    shutil.copytree(ROOT / "kernels", project / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**run.env, "GOLDEN_TASKS_CACHE": str(project / "cache"), "GOLDEN_TASKS_RUNS": str(project / "runs")}
    cases = [*CUDA_CASES, *TRITON_CASES]
    done = run.command("library", [sys.executable, "-m", "doit", "-n", "4", *[f"verify:{c}" for c in cases],
                                   "flush=1"], 300, cwd=project, env=env)
    record = project / "runs" / "report.json"
    if done is None or not record.exists():
        run.row("library", "FAIL", started, "no run record: see logs/library.log")
        return None
    rows = json.loads(record.read_text())["cases"]
    count, _ = _gpu()
    lines = ["| case | status | kernel mean us | GB/s | TFLOP/s | SOL | why |", "|" + " --- |" * 7]
    failed = []
    for r in rows:
        why = r.get("reason") or r.get("skipped") or ""
        mean = (r.get("kernel_timing") or {}).get("mean")
        speed = [(r.get("speed") or {}).get(k) for k in ("gbps", "tflops", "sol")]
        shown = " | ".join("-" if v is None else f"{v:.3g}" for v in speed)
        lines.append(f"| {r['case']} | {r['status']} | {'-' if mean is None else f'{mean:.2f}'} | {shown} | {why} |")
        one_gpu_nccl = r["status"] == "SKIPPED" and count < 2 and "CUDA devices (NCCL" in why
        if r["status"] != "PASS" and not one_gpu_nccl:
            failed.append(f"{r['case']} {r['status']}")
    run.sections.append("## The library's GPU cases\n\n" + "\n".join(lines))
    statuses = [r["status"] for r in rows]
    said = [f"{statuses.count('PASS')} PASS, {statuses.count('SKIPPED')} SKIPPED", *failed]
    if count < 2:
        said.append("NCCL wants a GPU per rank: the two-rank case cannot run on one")
    run.row("library", "FAIL" if failed else "PASS", started, "; ".join(said))
    return record


def check_limits(run: Run, cache: Path) -> None:
    """The GPU's limits as the calibrate stage measured them (CUDA events), beside its datasheet: a measure
    above the datasheet, or below a quarter of it, is a FAIL (the measure, not the GPU, is wrong)."""
    started = time.monotonic()
    found = [limits for path in cache.glob("entries/calibrate/*/*.json")
             for limits in json.loads(path.read_text())["meta"]["limits"] if limits["device"] == "cuda"]
    if not found:
        run.row("limits", "FAIL", started, "no calibrate entry measured the GPU")
        return
    limits = found[0]
    sheet = limits.get("datasheet") or {}
    best = max(max(b["gbps"].values()) for b in limits["bandwidth"])
    pairs = [("memory GB/s", best, sheet.get("gbps"))]
    pairs += [(f"matmul {d} TFLOP/s", rate, (sheet.get("tflops") or {}).get(d)) for d, rate in limits["tflops"].items()]
    lines = ["| figure | measured | datasheet | measured / datasheet |", "| --- | --- | --- | --- |"]
    off = []
    for what, measured, datasheet in pairs:
        ratio = measured / datasheet if datasheet else None
        lines.append(f"| {what} | {measured:.4g} | {datasheet or '-'} | {'-' if ratio is None else f'{ratio:.2f}'} |")
        if ratio is not None and not 0.25 <= ratio <= 1.05:
            off.append(f"{what} {ratio:.2f}")
    run.sections.append(f"## {limits['name']}: measured limits beside the datasheet\n\n" + "\n".join(lines))
    run.row("limits", "FAIL" if off else "PASS", started,
            f"{limits['name']}: {best:.0f} GB/s measured" + (f"; off the datasheet: {', '.join(off)}" * bool(off)))


def check_do_bench(run: Run, record: Path) -> None:
    started = time.monotonic()
    rows_file = run.logs / "do_bench.json"
    done = run.command("do_bench", [sys.executable, str(ROOT / "benchmarks" / "triton_vs_do_bench.py"), "--record",
                                    str(record), "--json", str(rows_file)], 120)
    if done is None or done.returncode or not rows_file.exists():
        run.row("do_bench", "FAIL", started, "no comparison: see logs/do_bench.log")
        return
    rows = json.loads(rows_file.read_text())
    lines = ["| case | bench mean us | do_bench mean us | ratio |", "| --- | --- | --- | --- |"]
    off = []
    for r in rows:
        ratio = r["ratio"]
        lines.append(f"| {r['case']} | {r['bench_us'] or '-'} | {r['do_bench_us'] or '-'} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} |")
        if ratio is not None and abs(ratio - 1) > RATIO_TOLERANCE:
            off.append(f"{r['case']} {ratio:.3f}")
    run.sections.append("## The bench stage against triton.testing.do_bench\n\n" + "\n".join(lines))
    measured = [r["ratio"] for r in rows if r["ratio"] is not None]
    spread = f"ratios {min(measured):.3f}..{max(measured):.3f}" if measured else "nothing measured"
    run.row("do_bench", "FAIL" if off or not measured else "PASS", started,
            f"{spread} over {len(measured)} cases" + (f"; beyond {RATIO_TOLERANCE:.0%}: {', '.join(off)}" * bool(off)))


def check_gpu_tests(run: Run) -> None:
    started = time.monotonic()
    xml = run.logs / "gpu-tests.xml"
    args = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
            "-rs", str(ROOT / "tests")]
    if run.dry:
        args.append("--collect-only")
    done = run.command("gpu-tests", args, 300)
    if done is None or not xml.exists():
        run.row("gpu tests", "FAIL", started, "no result: see logs/gpu-tests.log")
        return
    suite = ElementTree.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    if run.dry:
        names = re.findall(r"^(tests/\S+::\S+)$", (run.logs / "gpu-tests.log").read_text(), re.M)
        run.sections.append("## The tests of GPU paths it would run (pytest -m gpu)\n\n"
                            + "\n".join(f"- {name}" for name in names))
        run.row("gpu tests", "SKIPPED", started, f"no CUDA device here: {len(names)} tests of GPU paths collected "
                                                 "(pytest -m gpu), none run")
        return
    failed = counts["failures"] + counts["errors"]
    run.row("gpu tests", "FAIL" if failed else "PASS", started,
            f"{counts['tests'] - failed - counts['skipped']} passed, {failed} failed, {counts['skipped']} skipped "
            "(logs/gpu-tests.log says why)")


def run_checks(out: Path, wheels: Path) -> int:
    count, _ = _gpu()
    run = Run(out, wheels, dry=count == 0)
    installed = install(run)  # first: golden-tasks imports its dependencies from them
    check_environment(run)
    no_gpu = "no CUDA device here (torch.cuda.is_available() is False): a dry run"
    if run.dry:
        run.row("library", "SKIPPED", time.monotonic(), f"{no_gpu}; would verify {', '.join(CUDA_CASES + TRITON_CASES)}"
                                                         " with flush=1")
        run.row("limits", "SKIPPED", time.monotonic(), f"{no_gpu}; would set the GPU's measured bandwidth and "
                                                        "matmul rates beside its datasheet")
        run.row("do_bench", "SKIPPED", time.monotonic(), f"{no_gpu}; would time each Triton case that passed with "
                                                          "triton.testing.do_bench")
        check_gpu_tests(run)
    elif installed:
        record = check_library(run)
        if record is not None:
            check_limits(run, run.out / "project" / "cache")
            check_do_bench(run, record)
        else:
            run.row("do_bench", "SKIPPED", time.monotonic(), "the library's run left no record")
        check_gpu_tests(run)
    table = ["| check | result | seconds | detail |", "| --- | --- | --- | --- |"]
    table += [f"| {check} | {result} | {seconds:.1f} | {detail} |" for check, result, seconds, detail in run.rows]
    (out / "table.md").write_text("\n".join(["# GPU check", "", *table, "", *[s + "\n" for s in run.sections]]))
    print(f"table: {out / 'table.md'}")
    return 1 if any(result == "FAIL" for _, result, _, _ in run.rows) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare_p = sub.add_parser("prepare", help="download the wheels the GPU machine lacks")
    run_p = sub.add_parser("run", help="the check (a dry run without a CUDA device)")
    run_p.add_argument("out", type=Path, help="where the table and the logs go")
    for p in (prepare_p, run_p):
        p.add_argument("--wheels", type=Path, default=ROOT / "wheels", help="the wheels' folder (default: wheels/)")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.wheels)
    args.out.mkdir(parents=True, exist_ok=True)
    return run_checks(args.out.resolve(), args.wheels.resolve())


if __name__ == "__main__":
    sys.exit(main())
