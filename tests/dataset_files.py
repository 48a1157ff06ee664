"""Small problem sets in the field's formats, written by the tests: a FlashInfer-Bench tree, SOL-ExecBench's
folders, and KernelBench's problems and solutions. One definition, scale_add (out = x * alpha + y over M x 64),
and a solution of each kind the readers meet: Python returning its output, Python writing it (destination
passing), Triton, C++ bound by torch, a wrong one, one that does not import, and a CUDA one bound by tvm-ffi,
which golden-tasks does not build."""
import json
from pathlib import Path

DEFINITION = {
    "name": "scale_add", "op_type": "elementwise", "tags": ["test"], "description": "out = x * alpha + y",
    "axes": {"M": {"type": "var"}, "N": {"type": "const", "value": 64}},
    "inputs": {"x": {"shape": ["M", "N"], "dtype": "float32"}, "y": {"shape": ["M", "N"], "dtype": "float32"},
               "alpha": {"shape": None, "dtype": "float32"}},
    "outputs": {"out": {"shape": ["M", "N"], "dtype": "float32"}},
    "reference": "import torch\n\n\ndef run(x, y, alpha):\n    return x * alpha + y\n",
}
WORKLOADS = [{"uuid": "a1b2c3d4-0000-4000-8000-000000000004", "axes": {"M": 4},
              "inputs": {"x": {"type": "random"}, "y": {"type": "random"}, "alpha": {"type": "scalar", "value": 0.5}}},
             {"uuid": "e5f6a7b8-0000-4000-8000-000000000016", "axes": {"M": 16},
              "inputs": {"x": {"type": "random"}, "y": {"type": "random"}, "alpha": {"type": "scalar", "value": 2.0}}}]

TRITON = '''import torch
import triton
import triton.language as tl


@triton.jit
def _scale_add(X, Y, O, alpha, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(O + offs, tl.load(X + offs, mask=mask) * alpha + tl.load(Y + offs, mask=mask), mask=mask)


def run(x, y, alpha, out):
    n = x.numel()
    _scale_add[(triton.cdiv(n, 256),)](x, y, out, alpha, n, BLOCK=256)
'''
CPP = '''#include <torch/extension.h>

void run(torch::Tensor x, torch::Tensor y, double alpha, torch::Tensor out) {
    at::add_out(out, y, x, alpha);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
'''
SOLUTIONS = {  # name -> (language, destination passing, main source; a C++ one bound by torch)
    "scale_add_torch": ("python", False, "def run(x, y, alpha):\n    return x * alpha + y\n"),
    "scale_add_dps": ("python", True, "import torch\n\n\ndef run(x, y, alpha, out):\n"
                                       "    torch.add(x * alpha, y, out=out)\n"),
    "scale_add_triton": ("triton", True, TRITON),
    "scale_add_wrong": ("python", True, "def run(x, y, alpha, out):\n    out.copy_(x * alpha - y)\n"),
    "scale_add_broken": ("python", True, "import not_a_module_anywhere\n\n\ndef run(x, y, alpha, out):\n    pass\n"),
    "scale_add_cuda": ("cuda", True, "// a CUDA solution bound by tvm-ffi\n"),
    "scale_add_cpp": ("cpp", True, CPP),
}


def solution(name: str, sol_layout: bool = False) -> dict:
    language, dps, source = SOLUTIONS[name]
    main = {"cuda": "kernel.cu", "cpp": "kernel.cpp"}.get(language, "main.py")
    spec = {"target_hardware": ["cuda"], "entry_point": f"{main}::run", "dependencies": [],
            "destination_passing_style": dps, **({"binding": "torch"} if language == "cpp" else {})}
    # SOL-ExecBench lists its languages, and calls PyTorch code "pytorch"
    spec.update({"languages": ["pytorch" if language == "python" else language]} if sol_layout
                else {"language": language})
    return {"name": name, "definition": "scale_add", "author": "tests", "spec": spec,
            "sources": [{"path": main, "content": source}]}


def write_flashinfer_tree(root: Path, names=tuple(n for n in SOLUTIONS if n != "scale_add_cpp")) -> Path:
    """FlashInfer-Bench's layout: definitions/<op_type>/<name>.json, solutions/<op_type>/<definition>/<name>.json,
    workloads/<op_type>/<definition>.jsonl (each line a Trace with no solution or evaluation)."""
    (root / "definitions" / "elementwise").mkdir(parents=True, exist_ok=True)
    (root / "definitions" / "elementwise" / "scale_add.json").write_text(json.dumps(DEFINITION, indent=2))
    folder = root / "solutions" / "elementwise" / "scale_add"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.json").write_text(json.dumps(solution(name), indent=2))
    (root / "workloads" / "elementwise").mkdir(parents=True, exist_ok=True)
    (root / "workloads" / "elementwise" / "scale_add.jsonl").write_text("".join(
        json.dumps({"definition": "scale_add", "solution": None, "evaluation": None, "workload": w}) + "\n"
        for w in WORKLOADS))
    return root


def write_sol_execbench(root: Path, names=("scale_add_torch", "scale_add_wrong")) -> Path:
    """SOL-ExecBench's layout: a folder per problem with definition.json, reference.py, workload.jsonl (bare
    workloads, with their tolerances) and solution_<tag>.json."""
    problem = root / "scale_add"
    problem.mkdir(parents=True, exist_ok=True)
    (problem / "definition.json").write_text(json.dumps({k: v for k, v in DEFINITION.items() if k != "tags"}))
    (problem / "reference.py").write_text(DEFINITION["reference"])
    (problem / "workload.jsonl").write_text("".join(
        json.dumps({**w, "correctness": {"max_atol": 1e-3, "max_rtol": 1e-3, "required_matched_ratio": 1.0}}) + "\n"
        for w in WORKLOADS))
    for name in names:
        (problem / f"solution_{name.removeprefix('scale_add_')}.json").write_text(
            json.dumps(solution(name, sol_layout=True)))
    return root


def datasets_table(*tables: dict) -> str:
    """pyproject.toml's [tool.golden-tasks] table with a [[tool.golden-tasks.datasets]] per table."""
    def value(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)
    return "[tool.golden-tasks]\n" + "".join(
        "\n[[tool.golden-tasks.datasets]]\n" + "".join(f"{k} = {value(v)}\n" for k, v in t.items()) for t in tables)


LINEAR = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """out = linear(x) * scale: its parameters come from the seeded init."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return self.linear(x) * self.scale


batch_size = 4096
in_features = 64
out_features = 32
scale = 2.0


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
'''
LINEAR_NEW = LINEAR.split("\n\n\nbatch_size")[0].replace("class Model(", "class ModelNew(")
SCALE_ADD = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y, alpha):
        return x * alpha + y


N = 1024 * 2
M = N // 4  # derived: follows N where the sizes change it


def get_inputs():
    return [torch.randn(M, N), torch.randn(M, N), 0.5]


def get_init_inputs():
    return []
'''
KERNELBENCH = {  # problem file stem -> (problem, solution)
    "1_Linear_scale": (LINEAR, LINEAR_NEW.replace("self.linear(x) * self.scale",
                                                  "torch.addmm(self.linear.bias, x, self.linear.weight.t()) * self.scale")),
    "2_Linear_wrong": (LINEAR, LINEAR_NEW.replace("self.linear(x) * self.scale", "self.linear(x) * self.scale + 1e-2")),
    "3_Linear_broken": (LINEAR, "import not_a_module_anywhere\n" + LINEAR_NEW),
    "4_Scale_add": (SCALE_ADD, "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
                               "    def forward(self, x, y, alpha):\n        return torch.add(y, x, alpha=alpha)\n"),
}


def write_kernelbench(problems: Path, solutions: Path, names=tuple(KERNELBENCH)) -> tuple:
    """KernelBench's layout: the problem files in `problems`, their solutions (ModelNew) of the same file names in
    `solutions`; returns the two folders."""
    for folder in (problems, solutions):
        folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        problem, solution = KERNELBENCH[name]
        (problems / f"{name}.py").write_text(problem)
        (solutions / f"{name}.py").write_text(solution)
    return problems, solutions
