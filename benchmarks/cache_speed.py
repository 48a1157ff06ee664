"""Speed of the cache itself, measured side by side in one run.

1. No-op: median wall time of `doit verify` on a temporary copy of the project
   whose cache is fully populated, next to the median time of
   `python -c "import torch"` (target: no-op < 1/3 of importing torch).
2. Scaling: the same no-op on a generated library with 10x the cases (every
   kernel module copied ten times as kernels/<m>_x<i>.py, its kernel, golden
   and case names and its imports of other kernel modules suffixed with _x<i>;
   kernels/_*.py helpers and kernels/cpp/ copied once), against the real
   library (target: < 3x).
3. Tensor throughput for a 1 GiB float32 tensor: golden_tasks' put_tensor and
   load_tensor against torch.save and torch.load (mmap off and on); each load
   is followed by a full read, float(x.sum()). Loads are from the page cache.

Every doit command passes backend=eager (it is part of the keys), so the cold
runs that populate the caches compile nothing.

    python benchmarks/cache_speed.py
"""
import itertools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from golden_tasks.storage.store import Store
from golden_tasks.storage.tensors import load_tensor, put_tensor

ROOT = Path(__file__).resolve().parents[1]
DOIT_VARS = ("backend=eager",)
COPIES = 10
RUNS = 5
REPEATS = 3
SHAPE = (256, 1024, 1024)  # float32: exactly 1 GiB


def run(cmd: list, cwd: Path, env: dict = None) -> tuple[float, str]:
    """Wall seconds and stdout of a command that must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {cwd}:\n{proc.stdout}\n{proc.stderr}")
    return elapsed, proc.stdout


def doit(path: Path, *args) -> tuple[float, str]:
    env = {**os.environ, "GOLDEN_TASKS_CACHE": str(path / "cache"), "GOLDEN_TASKS_RUNS": str(path / "runs"),
           "PYTHONWARNINGS": "ignore"}
    return run([sys.executable, "-m", "doit", *args, *DOIT_VARS], path, env)


def noop_seconds(path: Path) -> float:
    """Median of RUNS `doit verify` runs that must find every task up to date."""
    times = []
    for _ in range(RUNS):
        seconds, out = doit(path, "verify")
        if any(line.startswith(". ") for line in out.splitlines()):
            sys.exit(f"`doit verify` in {path} ran tasks: not a no-op (did golden_tasks change mid-run?)")
        times.append(seconds)
    return statistics.median(times)


def import_torch_seconds() -> float:
    return statistics.median(run([sys.executable, "-c", "import torch"], ROOT)[0] for _ in range(RUNS))


def case_count(path: Path) -> int:
    _, out = doit(path, "list", "--all", "-q", "verify")
    return sum(line.startswith("verify:") for line in out.splitlines())


def real_project(path: Path) -> Path:
    path.mkdir()
    shutil.copy(ROOT / "dodo.py", path)
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    return path


def renamed(source: str, module: str, modules: list, suffix: str) -> str:
    """A module's source renamed for one copy of the library (suffix `_x<i>`).

    Its kernel `<m>` and golden `golden_<m>` are suffixed (they are the case's defaults), as are its imports
    of the library's other modules (`kernels.<m>`, `from kernels import <m>`) and the goldens it reads from
    them (`<m>.golden_<m>`); attribute accesses such as `torch.<m>` are left alone. The case names are
    suffixed by a line appended to the module (they may be computed), unless one already ends with the suffix.
    """
    def add(m: re.Match) -> str:
        return m[0] + suffix

    names = "|".join(re.escape(m) for m in sorted(modules, key=len, reverse=True))
    source = re.sub(rf"(?<![\w.])(?:golden_)?{re.escape(module)}(?!\w)", add, source)
    source = re.sub(rf"(?<=kernels\.)(?:{names})(?!\w)|(?<=\.)golden_(?:{names})(?!\w)", add, source)
    source = re.sub(r"^from kernels import (.+)$", lambda m: "from kernels import " + ", ".join(
        f"{name}{suffix} as {name}" for name in re.split(r",\s*", m[1].strip())), source, flags=re.M)
    return source + (f"\n\nCASES = [__import__('dataclasses').replace(c, name=c.name + {suffix!r}) "
                     f"if not c.name.endswith({suffix!r}) else c for c in CASES]\n")


def scaled_project(path: Path) -> Path:
    """A project whose library is COPIES renamed copies of the real library (no originals): each copy imports
    its own modules; private helper modules (kernels/_*.py) and the C++ sources are shared."""
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__", "[!_]*.py"))
    shutil.copy(ROOT / "dodo.py", path)
    modules = [module.stem for module in (ROOT / "kernels").glob("[!_]*.py")]
    for module in modules:
        for i in range(COPIES):
            suffix = f"_x{i}"
            text = renamed((ROOT / "kernels" / f"{module}.py").read_text(), module, modules, suffix)
            (path / "kernels" / f"{module}{suffix}.py").write_text(text)
    return path


def best_seconds(action, setup=lambda: None) -> float:
    """Best of REPEATS timings of action(setup()); setup is not timed."""
    times = []
    for _ in range(REPEATS):
        arg = setup()
        start = time.perf_counter()
        action(arg)
        times.append(time.perf_counter() - start)
    return min(times)


def full_read(x: torch.Tensor) -> float:
    return float(x.sum())


def tensor_rows(tmp: Path) -> list:
    """(measurement, seconds) for storing and loading one 1 GiB float32 tensor."""
    t = torch.randn(SHAPE)
    counter = itertools.count()

    def fresh(name):
        return lambda: tmp / f"{name}-{next(counter)}"

    def put(root):
        put_tensor(Store(root), t)
        shutil.rmtree(root)

    def save(path):
        torch.save(t, path)
        path.unlink()

    def save_fsync(path):
        with open(path, "wb") as f:
            torch.save(t, f)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()

    store = Store(tmp / "store")
    record = put_tensor(store, t)
    saved = tmp / "tensor.pt"
    torch.save(t, saved)
    return [
        ("in-memory full read, float(t.sum())", best_seconds(lambda _: full_read(t))),
        ("put_tensor (xxh3 + write + fsync)", best_seconds(put, fresh("store"))),
        ("torch.save", best_seconds(save, fresh("save"))),
        ("torch.save + fsync", best_seconds(save_fsync, fresh("save"))),
        ("load_tensor + full read", best_seconds(lambda _: full_read(load_tensor(store, record)))),
        ("torch.load(mmap=False) + full read", best_seconds(lambda _: full_read(torch.load(saved, mmap=False)))),
        ("torch.load(mmap=True) + full read", best_seconds(lambda _: full_read(torch.load(saved, mmap=True)))),
    ]


def main():
    with tempfile.TemporaryDirectory(prefix="golden-cache-speed-") as tmp:
        tmp = Path(tmp)
        real, scaled = real_project(tmp / "real"), scaled_project(tmp / "x10")
        doit(real, "-n", "2", "verify")
        doit(scaled, "-n", "2", "verify")  # exits on failure: the generated library plans and passes
        real_cases, scaled_cases = case_count(real), case_count(scaled)
        if scaled_cases != COPIES * real_cases:
            sys.exit(f"the generated library has {scaled_cases} cases, expected {COPIES} x {real_cases}")
        noop_real = noop_seconds(real)
        import_torch = import_torch_seconds()
        noop_scaled = noop_seconds(scaled)
        tensors = tensor_rows(tmp)

    print_table(f"no-op and scaling (median of {RUNS})", ["seconds", "ratio"], [
        ('python -c "import torch"', f"{import_torch:.3f}", ""),
        (f"no-op verify, real library ({real_cases} cases)", f"{noop_real:.3f}",
         f"{noop_real / import_torch:.3f} of import torch (target < 0.333)"),
        (f"no-op verify, 10x library ({scaled_cases} cases)", f"{noop_scaled:.3f}",
         f"{noop_scaled / noop_real:.2f} of real library (target < 3)"),
    ])
    print()
    print_table(f"1 GiB float32 tensor (best of {REPEATS})", ["seconds", "GiB/s"],
                [(name, f"{seconds:.3f}", f"{1 / seconds:.2f}") for name, seconds in tensors])
    print("loads are from the page cache (it cannot be dropped here); each store writes to a fresh directory")


def print_table(title: str, columns: list, rows: list) -> None:
    print(f"{title:44} " + "  ".join(f"{c:>8}" for c in columns))
    for name, *cells in rows:
        print(f"{name:44} " + "  ".join(f"{c:>8}" for c in cells).rstrip())


if __name__ == "__main__":
    main()
