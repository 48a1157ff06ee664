import importlib
import sys
import textwrap
import warnings

import pytest
import torch

from golden_tasks.fingerprint import Fingerprinter, fingerprint

BASE = '''
import torch
from {helpers} import scale

OFFSET = 1.0
TABLE = torch.arange(4.0)

def kernel(x):
    """Adds things."""
    # why: a comment
    return scale(x) + OFFSET + TABLE.sum()
'''
HELPERS = '''
FACTOR = 2.0

def scale(x):
    return x * FACTOR
'''


def _purge():
    for name in [n for n in sys.modules if n == "fpkg" or n.startswith("fpkg.")]:
        del sys.modules[name]


@pytest.fixture
def load(tmp_path, monkeypatch):
    """Write modules under package fpkg, in a fresh directory each time, and import them fresh.

    One package name throughout: module names enter fingerprints (refs such as "fpkg.helpers.scale").
    `files` adds modules by path relative to the package ("sub/__init__.py")."""
    counter = iter(range(1000))

    def _load(source, helpers=HELPERS, files=None):
        root = tmp_path / f"v{next(counter)}"
        for rel, text in {"__init__.py": "", "helpers.py": helpers, "mod.py": source, **(files or {})}.items():
            path = root / "fpkg" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).replace("{helpers}", "fpkg.helpers"))
        _purge()
        monkeypatch.syspath_prepend(str(root))
        importlib.invalidate_caches()
        return importlib.import_module("fpkg.mod")
    yield _load
    _purge()


def test_comments_docstrings_and_blank_lines_do_not_change_it(load):
    a = load(BASE)
    b = load(BASE.replace('"""Adds things."""', '"""Adds several things."""')
             .replace("# why: a comment", "# another comment\n\n\n"))
    assert fingerprint(a.kernel) == fingerprint(b.kernel)


@pytest.mark.parametrize("edit", [
    ("OFFSET = 1.0", "OFFSET = 1.5"),  # module-level constant
    ("torch.arange(4.0)", "torch.arange(5.0)"),  # module-level tensor
    ("+ OFFSET", "- OFFSET"),  # the body
])
def test_code_and_referenced_constants_change_it(load, edit):
    assert fingerprint(load(BASE).kernel) != fingerprint(load(BASE.replace(*edit)).kernel)


def test_a_helper_in_another_project_module_changes_it(load):
    a = load(BASE)
    b = load(BASE, helpers=HELPERS.replace("FACTOR = 2.0", "FACTOR = 3.0"))
    c = load(BASE, helpers=HELPERS + "\ndef unrelated():\n    return 1\n")
    assert fingerprint(a.kernel) != fingerprint(b.kernel)
    assert fingerprint(a.kernel) == fingerprint(c.kernel)


def test_module_attribute_access_is_followed(load):
    src = "from {helpers} import scale\nimport {helpers} as h\n\ndef kernel(x):\n    return h.scale(x)\n"
    a = load(src)
    b = load(src, helpers=HELPERS.replace("x * FACTOR", "x + FACTOR"))
    assert fingerprint(a.kernel) != fingerprint(b.kernel)


def test_source_files_read_are_recorded(load):
    mod = load(BASE)
    fp = Fingerprinter()
    fp(mod.kernel)
    assert {p.rsplit("/", 1)[-1] for p in fp.files} == {"mod.py", "helpers.py"}


def test_closures_defaults_and_values():
    def make(k):
        return lambda x, y=2: x * k + y
    assert fingerprint(make(1)) != fingerprint(make(2))
    assert fingerprint(make(1)) == fingerprint(make(1))
    assert fingerprint(torch.ones(3)) != fingerprint(torch.ones(3, dtype=torch.float64))
    assert fingerprint({"a": 1.0, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1.0})
    assert fingerprint(0.1) != fingerprint(0.1 + 1e-17 * 10)
    assert fingerprint(torch.randn) == fingerprint(torch.randn) != fingerprint(torch.rand)


def test_recursion_terminates(load):
    mod = load("def f(n):\n    return 1 if n == 0 else g(n - 1)\n\ndef g(n):\n    return f(n)\n")
    assert fingerprint(mod.f)


def test_properties_and_static_methods_of_user_classes_are_followed(load):
    src = ("import dataclasses\n\n@dataclasses.dataclass(frozen=True)\nclass Dims:\n    n: int\n\n"
           "    @property\n    def padded(self):\n        return -(-self.n // 16) * 16\n\n"
           "    @staticmethod\n    def unit():\n        return 1\n\nDIMS = Dims(5)\n\n"
           "def kernel(x):\n    return x[:DIMS.padded] * DIMS.unit()\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here is unknown to the fingerprinter
        base = fingerprint(load(src).kernel)
        assert base == fingerprint(load(src).kernel)
        assert base != fingerprint(load(src.replace("// 16) * 16", "// 8) * 8")).kernel)
        assert base != fingerprint(load(src.replace("return 1\n", "return 2\n")).kernel)


def test_generated_methods_record_no_source_file(load):
    mod = load("import dataclasses\n\n@dataclasses.dataclass\nclass P:\n    n: int\n\nDIM = P(3)\n\n"
               "def kernel(x):\n    return x * DIM.n\n")
    fp = Fingerprinter()
    fp(mod.kernel)  # P.__init__ was compiled from "<string>"
    assert {p.rsplit("/", 1)[-1] for p in fp.files} == {"mod.py"}
