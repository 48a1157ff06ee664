"""Fingerprints of live Python objects: what a function computes, not where its text sits.

A function's fingerprint covers its bytecode (not line numbers, comments or its
docstring), constants, defaults, closure cells, and, transitively, every global
it names that is user code: helpers in other project modules, module-level
constants, tensors. Library code (stdlib, site-packages, golden_tasks itself) is
identified by name only; its version enters the keys through the toolchain and
the pipeline's code version.

An object whose class defines `__fingerprint__(self, fingerprinter)` supplies its
own JSON-able token (a dict names its parts for `explain`) and adds the source
files it read to `fingerprinter.files`, so that editing them re-plans: kernels
written in other languages.

An object that cannot be fingerprinted faithfully gets a fixed "unknown" token
and is named in `fingerprinter.volatile`; a plan with volatile parts gets a fresh
nonce in its keys on every run, so everything depending on it recomputes: when
in doubt, recompute.
"""
import enum
import functools
import inspect
import sys
import sysconfig
import types
from pathlib import Path

from .hashing import digest_bytes, digest_json

LIBRARY_ROOTS = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


@functools.cache
def is_user_module(name: str) -> bool:
    """True for code the user edits: not stdlib, not an installed package, not golden_tasks."""
    if name is None or name == "golden_tasks" or name.startswith("golden_tasks."):
        return False
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if file is None or not Path(file).is_absolute():  # builtins and oddities such as torch._classes
        return name == "__main__"
    return not str(Path(file).resolve()).startswith(LIBRARY_ROOTS)


def dumps_by_value(obj) -> bytes:
    """cloudpickle `obj` with every loaded user module's code by value.

    By reference, a function pickles to the same bytes after its module is
    edited and runs whatever the module holds when loaded; by value, the bytes
    carry the code they were made from (artifacts, saved policies).
    """
    import cloudpickle  # noqa: PLC0415

    modules = [m for n, m in list(sys.modules.items()) if n != "__main__" and is_user_module(n)]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(obj)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


class Fingerprinter:
    """Computes fingerprints, memoized per object, and records the user source files read."""

    def __init__(self):
        self.files = set()
        self.volatile = []  # descriptions of what could not be fingerprinted (see the module docstring)
        self._memo = {}
        self._active = set()

    def __call__(self, obj) -> str:
        return digest_json(self.token(obj))

    def token(self, obj):
        """A JSON-able token that changes whenever `obj` could compute something else."""
        if obj is None or isinstance(obj, (bool, int, str)):
            return obj
        if isinstance(obj, float):
            return ["float", obj.hex()]
        if isinstance(obj, (tuple, list)):
            return [type(obj).__name__, [self.token(x) for x in obj]]
        if isinstance(obj, dict):
            return ["dict", sorted(([self.token(k), self.token(v)] for k, v in obj.items()), key=repr)]
        if isinstance(obj, (set, frozenset)):
            return ["set", sorted((self.token(x) for x in obj), key=repr)]
        if isinstance(obj, bytes):
            return ["bytes", digest_bytes(obj)]
        if isinstance(obj, enum.Enum):
            return ["enum", self._library_name(type(obj)), obj.name]
        key = id(obj)
        if key in self._memo:
            return self._memo[key]
        if key in self._active:  # recursion through globals: the name is enough
            return ["cycle", getattr(obj, "__qualname__", type(obj).__name__)]
        self._active.add(key)
        try:
            token = self._compound(obj)
        finally:
            self._active.discard(key)
        self._memo[key] = token
        return token

    def _compound(self, obj):
        import torch  # noqa: PLC0415 -- fingerprinting runs in workers, never in the doit parent

        if hasattr(type(obj), "__fingerprint__"):
            return ["custom", self._library_name(type(obj)), self.token(obj.__fingerprint__(self))]
        if isinstance(obj, torch.Tensor):
            data = obj.detach().cpu().contiguous()
            raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
            return ["tensor", str(data.dtype), list(data.shape), digest_bytes(raw)]
        if isinstance(obj, (torch.dtype, torch.device, torch.Size)):
            return ["torch", str(obj)]
        if type(obj).__module__ == "numpy" and hasattr(obj, "tobytes"):
            return ["ndarray", str(obj.dtype), list(getattr(obj, "shape", ())), digest_bytes(obj.tobytes())]
        if isinstance(obj, types.ModuleType):
            return ["module", obj.__name__]
        if isinstance(obj, functools.partial):
            return ["partial", self.token(obj.func), self.token(obj.args), self.token(obj.keywords)]
        if isinstance(obj, property):  # computed attributes of a user class
            return ["property", self.token(obj.fget), self.token(obj.fset), self.token(obj.fdel)]
        if isinstance(obj, (staticmethod, classmethod)):
            return [type(obj).__name__, self.token(obj.__func__)]
        if isinstance(obj, types.MethodType):
            return ["method", self.token(obj.__self__), self.token(obj.__func__)]
        if isinstance(obj, types.FunctionType):
            if not is_user_module(obj.__module__):
                return ["lib", self._library_name(obj)]
            return self._function(obj)
        if isinstance(obj, type):
            if not is_user_module(obj.__module__):
                return ["lib", self._library_name(obj)]
            attrs = {k: v for k, v in vars(obj).items() if not k.startswith("__") or k in ("__init__", "__call__")}
            return ["class", obj.__qualname__, self.token(attrs)]
        if callable(obj) and not hasattr(obj, "__dict__"):  # builtins: torch.randn, math.exp
            return ["lib", self._library_name(obj)]
        if hasattr(obj, "__dict__"):  # instances: their class and their state
            return ["object", self.token(type(obj)), self.token(dict(vars(obj)))]
        text = repr(obj)
        if " at 0x" not in text:
            return ["repr", self._library_name(type(obj)), text]
        self.volatile.append(f"{self._library_name(type(obj))} object {text}")
        return ["unknown", self._library_name(type(obj))]

    @staticmethod
    def _library_name(obj) -> str:
        return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"

    def _function(self, fn):
        file = inspect.getsourcefile(fn)
        if file and Path(file).is_file():  # not generated code ("<string>": dataclass methods)
            self.files.add(str(Path(file).resolve()))
        code = fn.__code__
        doc = fn.__doc__
        names = set()
        code_token = self._code(code, names, doc)
        fn_globals = fn.__globals__
        refs = {}
        user_modules = []
        for name in sorted(names):
            if name in fn_globals:
                value = fn_globals[name]
                refs[name] = self.token(value)
                if isinstance(value, types.ModuleType) and is_user_module(value.__name__):
                    user_modules.append(value)
        for module in user_modules:  # `helpers.scale(x)`: the attributes it reaches
            for name in sorted(names):
                if hasattr(module, name) and not isinstance(getattr(module, name), types.ModuleType):
                    refs[f"{module.__name__}.{name}"] = self.token(getattr(module, name))
        cells = [self.token(c.cell_contents) if _cell_filled(c) else "<empty>" for c in fn.__closure__ or ()]
        return ["function", fn.__qualname__, code_token, refs, cells,
                self.token(fn.__defaults__), self.token(fn.__kwdefaults__)]

    def _code(self, code, names: set, doc=None):
        names.update(code.co_names)
        consts = []
        for i, const in enumerate(code.co_consts):
            if isinstance(const, types.CodeType):
                consts.append(self._code(const, names))
            elif i == 0 and doc is not None and const == doc:
                consts.append("<doc>")
            else:
                consts.append(self.token(const))
        return ["code", code.co_code.hex(), consts, list(code.co_names), list(code.co_varnames),
                code.co_argcount, code.co_kwonlyargcount, code.co_flags,
                list(code.co_freevars), list(code.co_cellvars)]


def parts(obj) -> dict:
    """Named digests of what makes up a function's fingerprint: its body, and each
    global it reaches (helpers, constants), or the parts a `__fingerprint__` dict names.
    Lets `explain` name what changed."""
    fp = Fingerprinter()
    if hasattr(type(obj), "__fingerprint__"):
        token = obj.__fingerprint__(fp)
        named = token if isinstance(token, dict) else {"value": token}
        return {str(k): digest_json(t) for k, t in named.items()}
    fn = getattr(obj, "fn", obj)  # a kernel form wraps its function
    token = fp.token(fn)
    if not (isinstance(token, list) and token and token[0] == "function"):
        return {"value": digest_json(token)}
    _, qualname, code, refs, cells, defaults, kwdefaults = token
    out = {f"{qualname} (body)": digest_json([code, cells, defaults, kwdefaults])}
    out.update({name: digest_json(t) for name, t in refs.items()})
    if fn is not obj:
        out["kernel settings"] = digest_json(fp.token({k: v for k, v in vars(obj).items() if k != "fn"}))
    return out


def changed_parts(old: dict, new: dict) -> list:
    """Names whose digest differs between two `parts` results (added and removed included)."""
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def _cell_filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def fingerprint(obj) -> str:
    return Fingerprinter()(obj)
