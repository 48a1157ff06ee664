import importlib
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import golden_tasks
from golden_tasks.project.fingerprint import Fingerprinter, fingerprint
from golden_tasks.project.fingerprint_parts import parts

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
    fp = Fingerprinter()
    base = fp(load(src).kernel)
    assert fp.volatile == []  # nothing here is unknown to the fingerprinter
    assert base == fingerprint(load(src).kernel)
    assert base != fingerprint(load(src.replace("// 16) * 16", "// 8) * 8")).kernel)
    assert base != fingerprint(load(src.replace("return 1\n", "return 2\n")).kernel)


def test_generated_methods_record_no_source_file(load):
    mod = load("import dataclasses\n\n@dataclasses.dataclass\nclass P:\n    n: int\n\nDIM = P(3)\n\n"
               "def kernel(x):\n    return x * DIM.n\n")
    fp = Fingerprinter()
    fp(mod.kernel)  # P.__init__ was compiled from "<string>"
    assert {p.rsplit("/", 1)[-1] for p in fp.files} == {"mod.py"}


def _load_project(load, project: dict):
    """fpkg.mod, with `project` the package's files by relative path."""
    files = dict(project)
    return load(files.pop("mod.py"), files.pop("helpers.py", HELPERS), files)


def _fingerprint(load, project: dict) -> str:
    """The fingerprint of fpkg.mod.kernel; everything it reaches can be read (nothing volatile)."""
    fp = Fingerprinter()
    digest = fp(_load_project(load, project).kernel)
    assert fp.volatile == []
    return digest


def _check_edit(load, project: dict, edit: tuple, changes: bool):
    path, old, new = edit
    text = textwrap.dedent(project[path])
    assert old in text
    edited = _fingerprint(load, {**project, path: text.replace(old, new)})
    assert (edited != _fingerprint(load, project)) == changes


CLASSES = {"mod.py": """
    import string


    class Meta(type):
        def __call__(cls, *args):
            return super().__call__(*args)


    class Base:
        SCALE = 2

        def base(self):
            return self.SCALE


    class Desc:
        def __set_name__(self, owner, name):
            self.name = name

        def __get__(self, obj, objtype=None):
            return 3


    class Thing(Base, metaclass=Meta):
        \"\"\"A thing.\"\"\"
        __slots__ = ("n",)
        unit = Desc()

        def __new__(cls, n):
            return super().__new__(cls)

        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return self.n == other

        def __add__(self, other):
            return self.n + other

        def __getitem__(self, i):
            return self.n * i

        def __iter__(self):
            return iter(range(self.n))

        def __len__(self):
            return self.n + 0

        def __bool__(self):
            return True

        def __hash__(self):
            return 11

        def __repr__(self):
            return "Thing"

        def __init_subclass__(cls, **kw):
            super().__init_subclass__(**kw)

        def __class_getitem__(cls, item):
            return cls


    THING = Thing(4)


    def kernel(x):
        return x + THING
"""}


@pytest.mark.parametrize("old, new", [
    ("return self.n == other", "return self.n != other"),  # __eq__
    ("return self.n + other", "return self.n - other"),  # __add__
    ("return self.n * i", "return self.n * -i"),  # __getitem__
    ("iter(range(self.n))", "iter(range(1))"),  # __iter__
    ("return self.n + 0", "return self.n + 1"),  # __len__
    ("return True", "return False"),  # __bool__
    ("return 11", "return 12"),  # __hash__
    ('return "Thing"', 'return "Thing!"'),  # __repr__
    ("return super().__new__(cls)", "return super().__new__(Thing)"),  # __new__
    ("super().__init_subclass__(**kw)", "cls.tag = 1"),  # __init_subclass__
    ("return cls\n", "return item\n"),  # __class_getitem__
    ("self.name = name", "self.name = name * 2"),  # a descriptor's __set_name__
    ("return 3", "return 4"),  # a descriptor's __get__
    ("unit = Desc()", "unit = 3"),  # a class attribute
    ('__slots__ = ("n",)', '__slots__ = ("n", "m")'),
    ("SCALE = 2", "SCALE = 3"),  # a user base's attribute
    ("return self.SCALE", "return -self.SCALE"),  # a user base's method
    ("class Base:", "class Base(string.Formatter):"),  # a library base
    ("return super().__call__(*args)", "return super().__call__(*args[:1])"),  # the metaclass
    ("THING = Thing(4)", "THING = Thing(5)"),  # the instance's state
])
def test_every_behaviour_of_a_user_class_changes_it(load, old, new):
    _check_edit(load, CLASSES, ("mod.py", old, new), changes=True)


@pytest.mark.parametrize("old, new", [
    ('"""A thing."""', '"""A different thing."""'),
    ("return self.n == other", "# why: a comment\n        return self.n == other"),
])
def test_comments_and_docstrings_of_a_user_class_do_not_change_it(load, old, new):
    _check_edit(load, CLASSES, ("mod.py", old, new), changes=False)


SLOTS = {"mod.py": """
    class Scaler:
        __slots__ = ("factor", "__bias")

        def __init__(self, factor, bias):
            self.factor = factor
            self.__bias = bias

        def __call__(self, x):
            return x * self.factor + self.__bias


    SCALE = Scaler(2.0, 1.0)


    def kernel(x):
        return SCALE(x)
"""}


@pytest.mark.parametrize("edit, changes", [
    (("Scaler(2.0, 1.0)", "Scaler(3.0, 1.0)"), True),
    (("Scaler(2.0, 1.0)", "Scaler(2.0, 0.5)"), True),  # a private (mangled) slot
    (("x * self.factor", "x / self.factor"), True),
    (("def __call__", "# why: a comment\n    def __call__"), False),
])
def test_a_callable_instance_with_slots_is_its_class_and_slot_state(load, edit, changes):
    _check_edit(load, SLOTS, ("mod.py", *edit), changes)


BUILTIN_SUBCLASSES = {"mod.py": """
    import collections


    class Table(dict):
        def __getitem__(self, key):
            return dict.__getitem__(self, key) * 2


    Point = collections.namedtuple("Point", "x y")
    TABLE = Table(a=1.0)
    ORIGIN = Point(0.0, 1.0)
    FALLBACK = collections.defaultdict(lambda: 1.0)


    def kernel(x):
        return x * TABLE["a"] + ORIGIN.y + FALLBACK["b"]
"""}


@pytest.mark.parametrize("old, new", [
    ("* 2", "* 3"), ("a=1.0", "a=1.5"), ("Point(0.0, 1.0)", "Point(0.0, 2.0)"), ('"x y"', '"y x"'),
    ("lambda: 1.0", "lambda: 2.0"),  # a library container's C state (its default_factory)
])
def test_instances_of_builtin_subclasses_are_their_class_and_content(load, old, new):
    _check_edit(load, BUILTIN_SUBCLASSES, ("mod.py", old, new), changes=True)


ENUMS = {"mod.py": """
    import enum


    class Mode(enum.Enum):
        FAST = 1
        SLOW = 2

        def factor(self):
            return self.value * 2


    MODE = Mode.FAST


    def kernel(x):
        return x * MODE.factor()
"""}


@pytest.mark.parametrize("edit, changes", [
    (("FAST = 1", "FAST = 3"), True),
    (("SLOW = 2", "SLOW = 4"), True),
    (("self.value * 2", "self.value * 3"), True),
    (("MODE = Mode.FAST", "MODE = Mode.SLOW"), True),
    (("def factor", "# why: a comment\n    def factor"), False),
])
def test_an_enum_member_is_its_class_and_value(load, edit, changes):
    _check_edit(load, ENUMS, ("mod.py", *edit), changes)


def test_a_library_enum_member_is_named():
    assert Fingerprinter().token(inspect.Parameter.POSITIONAL_ONLY) == [
        "enum", ["lib", "inspect._ParameterKind", None], "POSITIONAL_ONLY", None]


DATACLASSES = {"mod.py": """
    import dataclasses


    @dataclasses.dataclass(frozen=True)
    class Config:
        n: int
        tags: list = dataclasses.field(default_factory=list)
        scale: float = dataclasses.field(default=2.0, metadata={"unit": "x"})

        def scaled(self, x):
            return x * self.scale * self.n


    CONFIG = Config(3)


    def kernel(x):
        return CONFIG.scaled(x)
"""}


@pytest.mark.parametrize("edit, changes", [
    (("Config(3)", "Config(4)"), True),
    (("n: int", "n: float"), True),
    (("default_factory=list", "default_factory=tuple"), True),
    (("default=2.0", "default=2.5"), True),
    (('{"unit": "x"}', '{"unit": "y"}'), True),
    (("frozen=True", "frozen=True, eq=False"), True),
    (("def scaled", "# why: a comment\n    def scaled"), False),
])
def test_a_dataclass_is_its_fields_and_methods(load, edit, changes):
    _check_edit(load, DATACLASSES, ("mod.py", *edit), changes)


DOTTED = {
    "mod.py": """
        import fpkg.sub.deep
        import fpkg.helpers as helpers


        def kernel(x):
            return fpkg.sub.deep.helper(x) + helpers.CONFIG.scale(x)
    """,
    "helpers.py": """
        class Config:
            def __init__(self, k):
                self.k = k

            def scale(self, x):
                return x * self.k


        CONFIG = Config(2.0)
    """,
    "sub/__init__.py": "",
    "sub/deep.py": "def helper(x):\n    return x + 1\n",
}
# The same reached through imports inside the function (the module level only loads them).
LOCAL_IMPORTS = {**DOTTED, "mod.py": """
    import fpkg.helpers, fpkg.sub.deep


    def kernel(x):
        import fpkg.sub.deep as d
        from . import helpers
        from fpkg.sub.deep import helper
        return d.helper(x) + helpers.CONFIG.scale(x) + helper(x)
"""}


@pytest.mark.parametrize("project", [DOTTED, LOCAL_IMPORTS], ids=["dotted", "local-imports"])
@pytest.mark.parametrize("edit, changes", [
    (("sub/deep.py", "x + 1", "x + 2"), True),
    (("helpers.py", "Config(2.0)", "Config(3.0)"), True),
    (("helpers.py", "x * self.k", "x / self.k"), True),
    (("sub/deep.py", "def helper", "def unrelated():\n    return 0\n\n\ndef helper"), False),
])
def test_helpers_reached_through_module_attributes_and_imports_change_it(load, project, edit, changes):
    _check_edit(load, project, edit, changes)


def test_refs_reached_through_modules_are_named_for_explain(load):
    named = parts(_load_project(load, DOTTED).kernel)
    assert {"fpkg", "helpers", "fpkg.sub.deep.helper", "fpkg.helpers.CONFIG"} <= set(named)


def test_a_user_module_imported_inside_the_function_is_followed_loaded_or_not(load):
    """Whether the process imported it already must not change the fingerprint."""
    src = "def kernel(x):\n    import fpkg.sub.deep as d\n    return d.helper(x)\n"
    fp = Fingerprinter()
    token = fp.token(_load_project(load, {**DOTTED, "mod.py": src}).kernel)  # fpkg.sub.deep not loaded yet
    assert fp.volatile == [] and "fpkg.sub.deep" in sys.modules
    assert Fingerprinter().token(sys.modules["fpkg.mod"].kernel) == token  # now loaded


def test_a_user_module_imported_inside_the_function_that_fails_to_import_is_volatile(load):
    fp = Fingerprinter()
    src = "def kernel(x):\n    import fpkg.missing_helpers as m\n    return m.helper(x)\n"
    fp(_load_project(load, {**DOTTED, "mod.py": src}).kernel)
    assert fp.volatile == ["fpkg.mod.kernel imports fpkg.missing_helpers, which fails: "
                           "ModuleNotFoundError: No module named 'fpkg.missing_helpers'"]


def test_a_library_imported_inside_the_function_is_named_loaded_or_not(load):
    fp = Fingerprinter()
    token = fp.token(load("def kernel(x):\n    import wave\n    return wave.open(x)\n").kernel)
    assert token[3]["import wave"] == ["module", "wave", None] and fp.volatile == []


def test_library_code_is_named_with_its_distribution_version():
    import numpy

    version = f"numpy=={importlib.metadata.version('numpy')}"
    assert Fingerprinter().token(numpy.ma.MaskedArray) == ["lib", "numpy.ma.MaskedArray", version]
    assert version in json.dumps(Fingerprinter().token(numpy.linalg.norm))  # a dispatcher wrapping a function
    assert Fingerprinter().token(torch.nn.functional.relu)[2] is None  # the toolchain names torch's version
    assert Fingerprinter().token(Fingerprinter)[2] is None  # the pipeline digests golden_tasks


def test_a_library_closure_is_what_it_closes_over():
    namespace = {"__name__": "json"}  # a closure factory as a library module would define it
    exec("def make(f):\n    def inner(x):\n        return f(x)\n    return inner\n", namespace)
    make = namespace["make"]
    assert fingerprint(make(lambda x: x + 1)) != fingerprint(make(lambda x: x + 2))


def test_unreadable_objects_are_volatile_but_sentinels_are_not(load):
    src = "import threading\n\nLOCK = threading.Lock()\nMISSING = object()\n\n" \
          "def kernel(x, y=MISSING):\n    return x if y is MISSING else y\n\n" \
          "def locked(x):\n    with LOCK:\n        return x\n"
    mod = load(src)
    fp = Fingerprinter()
    fp(mod.kernel)
    assert fp.volatile == []
    fp(mod.locked)
    assert len(fp.volatile) == 1 and fp.volatile[0].startswith("_thread.lock object")


def test_objects_it_does_not_foresee_are_volatile_never_an_error(load):
    """A library class with a `__closure__` descriptor (a function type), a bare descriptor, an
    instance whose `__dict__` raises: fingerprinted or named as volatile with the reason, never a crash."""
    mod = load("import types\n\nclass Odd:\n    @property\n    def __dict__(self):\n"
               "        raise RuntimeError('no dict here')\n\nODD = Odd()\n"
               "NAME = type.__dict__['__name__']\n\n"
               "def plain(x):\n    return types.FunctionType, NAME, x\n\n"
               "def odd(x):\n    return ODD, x\n")
    fp = Fingerprinter()
    assert fp(mod.plain) == fingerprint(mod.plain) and fp.volatile == []
    token = fp.token(mod.odd)
    assert token[3]["ODD"] == ["unknown", "fpkg.mod.Odd"]
    assert fp.volatile == ["fpkg.mod.Odd object: cannot be fingerprinted: RuntimeError: no dict here"]
    assert fingerprint(mod.odd) == fingerprint(mod.odd)  # the same unknown token: the plan's nonce recomputes it


def test_a_kernel_reaching_what_cannot_be_fingerprinted_plans_volatile_not_failed(load):
    from golden_tasks import Case, TensorSpec, jit
    from golden_tasks.planning.case import plan_of

    mod = load("import golden_tasks\n\nNAME = type.__dict__['__name__']\n\nclass Odd:\n    @property\n"
               "    def __dict__(self):\n        raise RuntimeError('no dict here')\n\nODD = Odd()\n\n"
               "def kernel(x: golden_tasks.In, out: golden_tasks.Out):\n    assert ODD and NAME\n"
               "    out.copy_(x)\n")
    specs = [TensorSpec("x", (2,), torch.float32, torch.randn), TensorSpec("out", (2,), torch.float32)]
    plan, _ = plan_of(Case("odd", specs=specs, kernel=jit(mod.kernel), golden=lambda t: None).resolved())
    assert plan.error is None and plan.volatile == ["fpkg.mod.Odd object: cannot be fingerprinted: RuntimeError: no dict here"]
    assert plan.for_this_run().nonce != plan.for_this_run().nonce  # recomputed on every run


def test_an_objects_own_fingerprint_error_is_not_hidden(load):
    mod = load("class Kernel:\n    def __fingerprint__(self, fingerprinter):\n"
               "        raise FileNotFoundError('kernel k: source k.cpp not found')\n\n"
               "K = Kernel()\n\ndef uses(x):\n    return K, x\n")
    with pytest.raises(FileNotFoundError, match="source k.cpp not found"):
        Fingerprinter()(mod.uses)


def test_a_memoized_token_is_the_one_a_fresh_fingerprinter_gives(load):
    mod = load("import enum\n\nclass Mode(enum.Enum):\n    FAST = 1\n    SLOW = 2\n\n"
               "def f(n):\n    return g(n) if n else Mode.FAST\n\ndef g(n):\n    return f(n - 1)\n")
    fp = Fingerprinter()
    fp(mod.f)
    fp(mod.Mode.FAST)
    for obj in (mod.g, mod.Mode, mod.Mode.SLOW):  # each met first inside a cycle
        assert fp(obj) == fingerprint(obj)


DETERMINISM = {
    **DOTTED,
    "mod.py": """
        import dataclasses
        import enum
        import fpkg.sub.deep
        import fpkg.helpers as helpers

        TAGS = {"alpha", "beta", "gamma", "delta"}  # string hashing differs between interpreters
        MISSING = object()


        class Mode(enum.Enum):
            FAST = 1
            SLOW = 2


        @dataclasses.dataclass
        class Config:
            n: int
            tags: list = dataclasses.field(default_factory=list)


        class Slotted:
            __slots__ = ("a", "b")

            def __init__(self, a):
                self.a = a


        STATE = (Mode.FAST, Config(3), Slotted(1.5))


        def kernel(x, y=MISSING):
            return fpkg.sub.deep.helper(x) + helpers.CONFIG.scale(x) + len(TAGS) + STATE[1].n
    """,
}


def test_the_same_sources_fingerprint_alike_in_fresh_interpreters_wherever_they_lie(tmp_path):
    code = ("import json, fpkg.mod as m; from golden_tasks.project.fingerprint import Fingerprinter; "
            "fp = Fingerprinter(); print(json.dumps([fp(m.kernel), fp.volatile]))")
    repo = str(Path(golden_tasks.__file__).parent.parent)
    results = []
    for seed, place in (("1", "one"), ("2", "elsewhere/two")):
        for rel, text in DETERMINISM.items():
            path = tmp_path / place / "fpkg" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text))
        (tmp_path / place / "fpkg" / "__init__.py").write_text("")
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join([str(tmp_path / place), repo])}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout))
    assert results[0] == results[1] and results[0][1] == []
