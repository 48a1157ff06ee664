"""Differential check of the cache: a cached verdict must equal the verdict of an empty cache.

A generated project holds kernels that reach their values through every route a
fingerprint or a plan must follow: a helper through a dotted chain of modules, a
class's special method, a base class, an enum member's value, a callable object
with __slots__, values computed at import from a data file, an environment
variable, a directory listing and a module outside the project, a file the
golden reads when called (declared), a scalar compiled in, a pure Out's
init_value, the tolerance, C++ headers reached by -include and -isystem, the
seed and the shapes. Each site has a base value (every case PASSes) and
alternatives: some change what a side computes (the fresh verdict is FAIL),
some are equivalent rewrites (PASS, though the source changed).

`Differential.check(edit)` applies one edit to a project whose cache holds the
base run, verifies with that cache and with an empty one (real doit, -n 2,
--continue), compares the verdicts of every case, then reverts the edit and
checks that the base is a fully cached PASS again.
"""
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from project import ROOT

# site -> (base, alternatives); a site's value is substituted for "{site}" in the files below.
SITES = {
    "chain": ("x + 1.0", ["x + (0.5 + 0.5)", "x + 2.0", "x - 1.0"]),  # _dpkg/sub/ops.py, reached as pkg.sub.ops.shift
    "special": ("x * 3.0", ["3.0 * x", "x * 3.5", "x * 2.0"]),  # Triple.__rmul__
    "base": ("2.0", ["(4.0 / 2)", "2.25", "1.0"]),  # Base.factor, inherited
    "enum": ("4", ["2 + 2", "5", "3"]),  # Mode.FAST's value
    "slots": ("0.25", ["(1 / 4)", "0.5", "0.0"]),  # Adder(amount) with __slots__
    "data_file": ("1.5", ["1.50", "2.5", "0.5"]),  # diff_offset.txt, read at import
    "env": ("0.5", ["0.50", "1.5", "-0.5"]),  # $GT_DIFF_BIAS, read at import
    "listing": ("2", ["3", "1"]),  # files in diff_tables/, counted at import
    "outside": ("0.75", ["(3 / 4)", "1.75", "0.25"]),  # a module outside the project, imported at import
    "golden_file": ("1.0", ["1.00", "2.0", "0.5"]),  # golden_scale.txt, read by the golden when called
    "golden_helper": ("t * 1.0", ["t * (2.0 - 1.0)", "t * 1.25", "t + 1.0"]),  # a golden helper module
    "scalar": ("2.0", ["3.0", "0.5"]),  # ScalarSpec value (both sides read it)
    "init": ("0.0", ["1.0", "float('nan')"]),  # init_value of a pure Out the kernel leaves half unwritten
    "rtol": ("1e-5", ["1e-4", "0.0"]),  # the kernel rounds through float32: exact comparison fails
    "header_force": ("3.0f", ["(1.5f * 2.0f)", "4.0f", "2.0f"]),  # cpp/force.h, by -include
    "header_system": ("1.0f", ["(0.5f + 0.5f)", "2.0f", "0.0f"]),  # cpp/sys/shift.h, by -isystem
    "seed": ("0", ["1", "7"]),
    "rows": ("6", ["5", "8"]),
}
ENV_SITES = {"env": "GT_DIFF_BIAS"}
CASES = ("diff_routes", "diff_half", "diff_cpp")

FILES = {
    "kernels/diff.py": '''
import enum
import os
import sys
from pathlib import Path

import torch

import kernels._dpkg as pkg
from golden_tasks import Case, In, Out, Scalar, ScalarSpec, TensorSpec, cpp, jit
from kernels._dpkg.shapes import Base

HERE = Path(__file__).parent
OFFSET = float((HERE / "diff_offset.txt").read_text())
BIAS = float(os.environ.get("GT_DIFF_BIAS", "0.5"))
TABLES = len(sorted((HERE / "diff_tables").glob("*.bin")))
sys.path.insert(0, os.environ["GT_DIFF_OUTSIDE"])
from diff_outside import GAIN  # noqa: E402
ROWS, COLS = {rows}, 8


class Mode(enum.Enum):
    FAST = {enum}
    SLOW = 1


class Scaled(Base):
    """factor() comes from the base class."""


class Triple:
    def __rmul__(self, x):
        return {special}


class Adder:
    __slots__ = ("amount",)

    def __init__(self, amount):
        self.amount = amount

    def __call__(self, x):
        return x + self.amount


ADD = Adder({slots})
TRIPLE = Triple()


@jit
def diff_routes(x: In, alpha: Scalar, out: Out):
    y = (pkg.sub.ops.shift(x) + Scaled().factor() * x + ADD(x) + x * TRIPLE + Mode.FAST.value * x
         + OFFSET + BIAS + TABLES + GAIN * x)
    out.copy_(y * alpha)


def golden_diff_routes(t):
    from kernels._dpkg import golden_helpers
    x = t["x"].double()
    y = (x + 1.0) + 2.0 * x + (x + 0.25) + x * 3.0 + 4 * x + 1.5 + 0.5 + 2 + 0.75 * x
    scale = float((HERE / "golden_scale.txt").read_text())
    t["out"].copy_(golden_helpers.finish(y * t["alpha"]) * scale)


@jit
def diff_half(x: In, out: Out):
    """Writes the first half of the columns: the rest stays as the kernel's zeros."""
    out[:, :COLS // 2].copy_((x[:, :COLS // 2] * (1 / 3)).float())


def golden_diff_half(t):
    t["out"][:, :COLS // 2].copy_(t["x"][:, :COLS // 2].double() / 3)


@cpp("cpp/diff.cpp", flags=("-O2", "-include", "cpp/force.h", "-isystem", "cpp/sys"))
def diff_cpp(x: In[torch.float32], out: Out[torch.float32], n: Scalar[torch.int64]): ...


def golden_diff_cpp(t):
    t["out"].copy_(t["x"] * 3.0 + 1.0)


def routes_specs():
    return [TensorSpec("x", (ROWS, COLS), torch.float32, torch.randn), ScalarSpec("alpha", torch.float32, {scalar}),
            TensorSpec("out", (ROWS, COLS), torch.float32)]


CASES = [
    Case("diff_routes", kernel=diff_routes, golden=golden_diff_routes, specs=routes_specs, seed={seed}, rtol=1e-5, atol=1e-5, rounds=2,
         file_deps=("golden_scale.txt",)),
    Case("diff_half", kernel=diff_half, golden=golden_diff_half, specs=lambda: [TensorSpec("x", (ROWS, COLS), torch.float32, torch.randn),
                                     TensorSpec("out", (ROWS, COLS), torch.float32, {init})],
         seed={seed}, rtol={rtol}, atol=0.0, rounds=2),
    Case("diff_cpp", kernel=diff_cpp, golden=golden_diff_cpp, seed={seed}, rounds=2,
         specs=lambda: [TensorSpec("x", (ROWS * COLS,), torch.float32, torch.randn),
                        TensorSpec("out", (ROWS * COLS,), torch.float32), ScalarSpec("n", torch.int64, ROWS * COLS)]),
]
''',
    "kernels/_dpkg/__init__.py": "from kernels._dpkg import sub  # noqa: F401\n",
    "kernels/_dpkg/sub/__init__.py": "from kernels._dpkg.sub import ops  # noqa: F401\n",
    "kernels/_dpkg/sub/ops.py": "def shift(x):\n    return {chain}\n",
    "kernels/_dpkg/shapes.py": "class Base:\n    def factor(self):\n        return {base}\n",
    "kernels/_dpkg/golden_helpers.py": "def finish(t):\n    return {golden_helper}\n",
    "kernels/diff_offset.txt": "{data_file}",
    "kernels/golden_scale.txt": "{golden_file}",
    "outside/diff_outside.py": "GAIN = {outside}\n",
    "kernels/cpp/diff.cpp": '''#include <cstdint>
#include <shift.h>
extern "C" void diff_cpp(const float* x, float* out, int64_t n) {{
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * FORCED_SCALE + SYSTEM_SHIFT;
}}
''',
    "kernels/cpp/force.h": "#define FORCED_SCALE {header_force}\n",
    "kernels/cpp/sys/shift.h": "#define SYSTEM_SHIFT {header_system}\n",
}


@dataclasses.dataclass(frozen=True)
class Edit:
    site: str
    value: str

    def __str__(self):
        return f"{self.site}: {SITES[self.site][0]!r} -> {self.value!r}"


def random_edits(seed: int, count: int) -> list:
    """`count` edits, each a random site and one of its alternatives, drawn from `seed`."""
    rng = random.Random(seed)
    return [Edit(site, rng.choice(SITES[site][1])) for site in rng.sample(sorted(SITES), count)]


class Differential:
    """A generated project with a warm cache of its base run; see the module docstring."""

    def __init__(self, path: Path, backend: str = "eager"):
        self.path, self.backend = path, backend
        self.warm, self.outside = path / "warm-cache", path / "project" / "outside"
        project = path / "project"
        project.mkdir(parents=True)
        shutil.copy(ROOT / "dodo.py", project)
        (project / "kernels").mkdir()
        shutil.copy(ROOT / "kernels" / "__init__.py", project / "kernels")
        self.project = project
        self.fresh_runs = 0

    def render(self, edit: Edit = None) -> dict:
        """Write the project for the base values with `edit` applied; the environment it runs in."""
        values = {site: base for site, (base, _) in SITES.items()}
        if edit:
            values[edit.site] = edit.value
        for rel, text in FILES.items():
            path = self.project / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            content = text.format(**values)
            if not path.exists() or path.read_text() != content:
                path.write_text(content)
        tables = self.project / "kernels" / "diff_tables"
        shutil.rmtree(tables, ignore_errors=True)
        tables.mkdir()
        for i in range(int(values["listing"])):
            (tables / f"t{i}.bin").write_bytes(b"")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOLDEN_TASKS_")}
        env.update({"GT_DIFF_OUTSIDE": str(self.outside), "GOLDEN_TASKS_RUNS": str(self.path / "runs"),
                    "PYTHONWARNINGS": "ignore", "GOLDEN_TASKS_HTML": "0",
                    **{var: values[site] for site, var in ENV_SITES.items()}})
        return env

    def verify(self, env: dict, cache: Path) -> tuple[dict, dict]:
        """({case: "PASS" | "FAIL"}, {task: doit result}) of `doit -n 2 --continue verify` with `cache`."""
        proc = subprocess.run([sys.executable, "-m", "doit", "--reporter=json", "-n", "2", "--continue", "verify",
                               f"backend={self.backend}"], cwd=self.project,
                              env={**env, "GOLDEN_TASKS_CACHE": str(cache)}, capture_output=True, text=True,
                              timeout=1800)
        try:
            results = {t["name"]: t["result"] for t in json.loads(proc.stdout)["tasks"]}
        except (ValueError, KeyError):
            raise AssertionError(f"doit printed no JSON report:\n{proc.stdout}\n{proc.stderr}") from None
        verdicts = {case: "PASS" if results.get(f"verify:{case}") in ("success", "up-to-date") else "FAIL" for case in CASES}
        return verdicts, results

    def base(self) -> dict:
        """Verify the base project into the warm cache; its verdicts."""
        verdicts, _ = self.verify(self.render(), self.warm)
        return verdicts

    def check(self, edit: Edit) -> list:
        """Problems found for one edit (empty when the cache told the truth)."""
        env = self.render(edit)
        cached, _ = self.verify(env, self.warm)
        fresh_cache = self.path / f"fresh-{self.fresh_runs}"
        self.fresh_runs += 1
        fresh, _ = self.verify(env, fresh_cache)
        shutil.rmtree(fresh_cache, ignore_errors=True)
        problems = [f"{edit}: {case} is {cached[case]} with the cache, {fresh[case]} in an empty cache"
                    for case in CASES if cached[case] != fresh[case]]
        verdicts, results = self.verify(self.render(), self.warm)
        recomputed = sorted(n for n, r in results.items() if r != "up-to-date" and n.split(":")[0] not in
                            ("verify", "runtime"))
        if set(verdicts.values()) != {"PASS"} or recomputed:
            problems.append(f"{edit}: reverted, the base is {verdicts} and recomputed {recomputed}")
        return problems
