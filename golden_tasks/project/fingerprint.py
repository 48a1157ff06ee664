"""Fingerprints of live Python objects: what a function computes, not where its text sits.

A function's fingerprint covers its bytecode (not line numbers, comments or its
docstring), constants, defaults, closure cells, and, transitively, every global
it names that is user code: helpers in other project modules, also reached
through module attributes (`pkg.sub.helper`) or imported inside the function,
module-level constants, tensors. Everything reachable through Python's object
model counts: a user class by every attribute that can affect behaviour (special
methods, properties, class attributes, `__slots__`), its bases and metaclass; an
instance by its class, `__dict__`, slots and builtin-base content; an enum member
by its class and value. Library code (golden_tasks.model.origin decides which code is
the user's) is identified by name and the version of the distribution providing
it; the interpreter's, torch's and golden_tasks' versions enter the keys through
the toolchain and the pipeline's code version.

An object whose class defines `__fingerprint__(self, fingerprinter)` supplies its
own JSON-able token (a dict names its parts for `explain`) and adds the source
files it read to `fingerprinter.files`, so that editing them re-plans: kernels
written in other languages.

An object that cannot be fingerprinted faithfully, or whose fingerprinting fails
(an object of a kind not foreseen: a descriptor, an extension type), gets a fixed
"unknown" token and is named in `fingerprinter.volatile`; a plan with volatile parts gets a fresh
nonce in its keys on every run, so everything depending on it recomputes: when
in doubt, recompute.

Fingerprints are deterministic and path-independent: the same sources give the
same fingerprint in every interpreter, wherever the checkout lies.
"""
import dis
import enum
import functools
import importlib.metadata
import importlib.util
import inspect
import sys
import types
from pathlib import Path

from ..model.hashing import digest_bytes, digest_json
from ..model.origin import is_user_file, is_user_module, is_user_source

# Versioned elsewhere: the toolchain names the interpreter and torch, the pipeline digests golden_tasks.
_VERSIONED_ELSEWHERE = frozenset({"golden_tasks", "torch", *sys.stdlib_module_names})
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement, not a C type
_IMPORT_NAME = dis.opmap["IMPORT_NAME"]
# Attributes that cannot change what a class, module or instance computes.
_BOOKKEEPING = frozenset({
    "__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__firstlineno__",
    "__static_attributes__", "__slotnames__", "_abc_impl",  # interpreter, copyreg and ABC caches
    "_value2member_map_",  # Flag adds pseudo-members lazily; _member_map_ holds the members
    "__name__", "__package__", "__loader__", "__spec__", "__file__", "__cached__", "__builtins__", "__path__",
})
# A builtin base's content as that exact type, read by the base's own C code past a subclass's overrides.
_BASE_CONTENT = {
    int: int.__int__, float: float.__float__,
    dict: lambda obj: dict(dict.items(obj)), set: set.copy, frozenset: frozenset.copy,
    **{t: (lambda obj, t=t: t.__getitem__(obj, slice(None))) for t in (str, bytes, tuple, list)},
}
# Objects that behave as their class and these attributes make them.
_WRAPPERS = {
    functools.partial: ("func", "args", "keywords"), property: ("fget", "fset", "fdel"),
    functools.cached_property: ("func",), staticmethod: ("__func__",), classmethod: ("__func__",),
    types.MethodType: ("__self__", "__func__"),
}
# Library objects that behave as these attributes make them, named by class (their library is not imported
# here): Triton's kernel objects are their Python function and options, not the compiled kernels they cache.
_WRAPPERS_BY_NAME = {
    "triton.runtime.jit.JITFunction": ("fn", "do_not_specialize", "do_not_specialize_on_alignment", "debug",
                                       "noinline"),
    "triton.runtime.interpreter.InterpretedFunction": ("fn", "kwargs"),
    "triton.runtime.autotuner.Autotuner": ("fn", "configs", "keys", "restore_value", "early_config_prune",
                                           "perf_model", "configs_top_k", "user_defined_pre_hook",
                                           "user_defined_post_hook"),
}
_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                      types.MethodWrapperType, types.ClassMethodDescriptorType)


def _is_user_top(top: str) -> bool:
    """Whether the top-level package `top`, loaded or not, is user code (finding it imports nothing)."""
    if top in sys.modules:
        return is_user_module(top)
    spec = importlib.util.find_spec(top)
    return spec is not None and is_user_source(
        top, spec.origin or next(iter(spec.submodule_search_locations or ()), None))


_distributions = functools.cache(importlib.metadata.packages_distributions)


@functools.cache
def _version(module: str) -> str | None:
    """The distributions that provide library module `module` ("numpy==2.4.6"), or None where the
    keys carry its version otherwise or no distribution provides it."""
    top = (module or "").partition(".")[0]
    if not top or top in _VERSIONED_ELSEWHERE:
        return None
    dists = sorted(set(_distributions().get(top, ())))
    return " ".join(f"{d}=={importlib.metadata.version(d)}" for d in dists) or None


@functools.cache
def _wrapped(cls: type):
    """The attributes that make an instance of `cls` what it is, if it is a known wrapper (see _WRAPPERS)."""
    found = (_WRAPPERS.get(c) or _WRAPPERS_BY_NAME.get(f"{c.__module__}.{c.__qualname__}") for c in cls.__mro__)
    return next((attrs for attrs in found if attrs), None)


@functools.cache
def _layout(cls: type) -> tuple:
    """(reader, complete): `reader(obj)` is the content of the nearest builtin base of `cls`
    (None: no such base); `complete` when that base, or object, is the C type laying out its
    instances, so that __dict__, __slots__ and the content are all they hold."""
    base = next((c for c in cls.__mro__ if c in _BASE_CONTENT), object)
    solid = next(c for c in cls.__mro__ if not c.__flags__ & _HEAPTYPE)
    return _BASE_CONTENT.get(base), solid is base


@functools.cache
def _user_source_file(file) -> str | None:
    """`file` resolved if it is a user source file: not generated code ("<string>": dataclass
    methods), nor a library's (a wrapper such as dataclasses' recursive repr takes the
    __module__ of what it wraps)."""
    return str(Path(file).resolve()) if file and Path(file).is_file() and is_user_file(file) else None


def _attributes(namespace) -> dict | None:
    """A namespace (of a class, module, instance or function) without its bookkeeping."""
    return namespace and {k: v for k, v in namespace.items() if k not in _BOOKKEEPING}


def _name(obj) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', obj.__name__)}"


def _key_repr(item) -> str:
    return repr(item[0])


def _dict_of(obj):
    try:  # object's own lookup runs no user __getattr__
        return object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return None


class Fingerprinter:
    """Computes fingerprints, memoized per object, and records the user source files read."""

    def __init__(self):
        self.files = set()
        self.volatile = []  # descriptions of what could not be fingerprinted (see the module docstring)
        # id -> (object, token, ids of the objects on cycles within it); holding the object keeps
        # its id from being reused
        self._memo = {}
        self._active = {}  # id -> depth of each object being tokenized, outermost first
        self._reach = 0  # the outermost depth a cycle token in the current subtree points to
        self._cyclic = frozenset()  # ids of the objects on cycles in the current subtree
        self._own_error = None  # what an object's own __fingerprint__ raised: the user's to read, not ours to hide

    def __call__(self, obj) -> str:
        return digest_json(self.token(obj))

    def token(self, obj):
        """A JSON-able token that changes whenever `obj` could compute something else.

        A cycle is cut where it comes back to an object being tokenized, so the token of an
        object on a cycle depends on where the traversal entered the cycle: a memoized token
        is reused only where none of the objects on its cycles is being tokenized, which makes
        a fingerprint independent of what the Fingerprinter computed before."""
        cls = type(obj)
        if obj is None or cls in (bool, int, str):
            return obj
        if cls is float:
            return ["float", obj.hex()]
        if cls is bytes:
            return ["bytes", digest_bytes(obj)]
        if cls is tuple:  # immutable: on no cycle but through a mutable object, which is tracked below
            return ["tuple", [self.token(x) for x in obj]]
        key = id(obj)
        hit = self._memo.get(key)
        if hit is not None:
            if not hit[2]:
                return hit[1]
            if hit[2].isdisjoint(self._active):
                self._cyclic |= hit[2]
                return hit[1]
        depth = self._active.get(key)
        if depth is not None:  # recursion (through globals, an enum's members): how far up is enough
            self._reach = min(self._reach, depth)
            self._cyclic |= {key}
            return ["cycle", len(self._active) - depth]
        depth = self._active[key] = len(self._active)
        outer_reach, outer_cyclic = self._reach, self._cyclic
        self._reach, self._cyclic = depth, frozenset()
        try:
            token = self._compound(obj)
        except Exception as exc:  # an object of a kind not foreseen: recompute, never fail
            if exc is self._own_error:
                raise
            token = self._unknown(obj, f"cannot be fingerprinted: {type(exc).__name__}: {exc}")
        finally:
            del self._active[key]
        cyclic = self._cyclic
        if self._reach < depth:  # on a cycle through an enclosing object: valid in this context only
            cyclic |= {key}
        else:
            self._memo[key] = (obj, token, cyclic)
        self._reach = min(outer_reach, self._reach)
        self._cyclic = outer_cyclic | cyclic if cyclic else outer_cyclic
        return token

    def _compound(self, obj):
        cls = type(obj)
        if cls is list:
            return ["list", [self.token(x) for x in obj]]
        if cls in (dict, types.MappingProxyType):
            # keys are distinct: sorting by their tokens alone orders items without printing values
            return ["dict", sorted(([self.token(k), self.token(v)] for k, v in obj.items()), key=_key_repr)]
        if cls in (set, frozenset):
            return ["set", sorted((self.token(x) for x in obj), key=repr)]
        if hasattr(cls, "__fingerprint__"):
            try:
                own = obj.__fingerprint__(self)
            except Exception as exc:
                self._own_error = exc
                raise
            return ["custom", self.token(cls), self.token(own)]
        import torch  # noqa: PLC0415 -- fingerprinting runs in workers, never in the doit parent

        if isinstance(obj, torch.Tensor):
            data = obj.detach().cpu().contiguous()
            raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else b""
            return ["tensor", self.token(cls), str(data.dtype), list(data.shape), digest_bytes(raw)]
        if isinstance(obj, (torch.dtype, torch.device, torch.Size)):
            return ["torch", str(obj)]
        if cls.__module__ == "numpy" and hasattr(obj, "tobytes"):
            return ["ndarray", str(obj.dtype), list(getattr(obj, "shape", ())), digest_bytes(obj.tobytes())]
        if isinstance(obj, types.ModuleType):
            return self._module(obj)
        if isinstance(obj, enum.Enum):  # a library enum's value is the library's business
            user = is_user_module(cls.__module__)
            return ["enum", self.token(cls), obj.name, self.token(obj._value_) if user else None]
        if attrs := _wrapped(cls):
            return ["wraps", self.token(cls), [self.token(getattr(obj, a)) for a in attrs]]
        if isinstance(obj, (types.FunctionType, type)):
            if is_user_module(obj.__module__):
                return self._function(obj) if isinstance(obj, types.FunctionType) else self._class(obj)
            if isinstance(obj, types.FunctionType) and obj.__closure__:  # a library closure may close over user code
                return [*self._lib(obj), self._cells(obj)]
            return self._lib(obj)
        return self._instance(obj)

    @staticmethod
    def _lib(obj) -> list:
        """A library function, class or builtin: its name and its distribution's version."""
        return ["lib", _name(obj), _version(getattr(obj, "__module__", None))]

    def _module(self, module) -> list:
        """A library module by name; a user module reached as a value (not a global the code
        names) by all it holds, since any attribute of it may be used."""
        if not is_user_module(module.__name__):
            return ["module", module.__name__, _version(module.__name__)]
        self._read(getattr(module, "__file__", None))
        return ["module", module.__name__, self.token(_attributes(vars(module)))]

    def _class(self, cls) -> list:
        """A user class: its metaclass, bases and every attribute of its own but bookkeeping."""
        return ["class", cls.__qualname__, self.token(type(cls)), [self.token(b) for b in cls.__bases__],
                self.token(_attributes(vars(cls)))]

    def _instance(self, obj) -> list:
        cls = type(obj)
        if isinstance(obj, _BUILTIN_CALLABLES):  # torch.randn, math.exp, tensor.sum: a name, bound to something
            return ["builtin", self._lib(obj), self.token(getattr(obj, "__self__", None))]
        reader, complete = _layout(cls)
        user = is_user_module(cls.__module__)
        if user and not complete:
            return self._unknown(obj, "an instance of a user class holding C state")
        # what it holds can be read: a user class's instance, a library object with a __dict__
        # (its C state, if any, taken as its library's business), a namedtuple
        if user or _dict_of(obj) is not None or (complete and reader is not None):
            return ["object", self.token(cls), self.token(self._state(obj, reader))]
        try:  # a library object's state as it pickles it, whole where a repr may abridge (a long
            # re.Pattern): dataclasses.Field, defaultdict, torch.Generator, PosixPath, and an
            # object() sentinel, which reduces to its class alone: its one behaviour, identity,
            # gives `x is SENTINEL` the same answer in every process (B = A versus B = object()
            # escapes the fingerprints of all values, not of sentinels only)
            reduced = obj.__reduce_ex__(4)
        except Exception:  # noqa: BLE001 -- "cannot pickle" (locks, code objects), or the library's own error
            text = repr(obj)
            if " at 0x" in text:
                return self._unknown(obj, text)
            return ["repr", self.token(cls), text]  # the library's own description
        if isinstance(reduced, str):  # a module-level singleton, pickled by name
            return ["global", self.token(cls), reduced]
        return ["reduce", [self.token(list(x) if i in (3, 4) and x is not None else x)  # item iterators
                           for i, x in enumerate(reduced)]]

    def _state(self, obj, reader) -> list:
        """An instance's __dict__, its set __slots__ (read by their descriptors, so no user code
        runs) and its builtin base's content."""
        slots = {}
        for c in type(obj).__mro__:
            names = vars(c).get("__slots__", ())
            for name in [names] if isinstance(names, str) else names:
                if name.startswith("__") and not name.endswith("__"):  # private: mangled
                    name = f"_{c.__name__.lstrip('_')}{name}"
                if name not in ("__dict__", "__weakref__"):
                    try:
                        slots[f"{c.__qualname__}.{name}"] = vars(c)[name].__get__(obj, c)
                    except AttributeError:  # unset
                        pass
        return [_attributes(_dict_of(obj)), slots, reader and reader(obj)]

    def _unknown(self, obj, why: str) -> list:
        name = _name(type(obj))
        self.volatile.append(f"{name} object: {why}")
        return ["unknown", name]

    def _read(self, file):
        if path := _user_source_file(file):
            self.files.add(path)

    def _function(self, fn) -> list:
        self._read(inspect.getsourcefile(fn))
        codes = []
        code_token = self._code(fn.__code__, codes, fn.__doc__)
        names = sorted(set().union(*(c.co_names for c in codes)))
        refs = {}
        modules = self._imported(fn, codes, refs)
        for name in names:
            if name in fn.__globals__:
                refs[name] = self._ref(fn.__globals__[name], modules)
        seen = set()
        while modules:  # `helpers.scale(x)`, `pkg.sub.helper(x)`, `helpers.CONFIG`: what user modules hold
            module = modules.pop()
            if module.__name__ in seen:
                continue
            seen.add(module.__name__)
            self._read(getattr(module, "__file__", None))
            attrs = vars(module)
            for name in [*names, "__getattr__"]:  # a module __getattr__ computes the names it lacks
                if name in attrs:
                    refs[f"{module.__name__}.{name}"] = self._ref(attrs[name], modules)
        return ["function", fn.__qualname__, code_token, refs, self._cells(fn), self.token(fn.__defaults__),
                self.token(fn.__kwdefaults__), self.token(_attributes(vars(fn)))]  # fn.table = ..., __wrapped__

    def _cells(self, fn) -> list:
        return [self.token(c.cell_contents) if cell_filled(c) else "<empty>" for c in fn.__closure__ or ()]

    def _ref(self, value, modules: list):
        """The token of a value the code names; a user module is queued in `modules`, to be
        followed through the names the code uses, rather than taken whole."""
        if isinstance(value, types.ModuleType) and is_user_module(value.__name__):
            modules.append(value)
            return ["module", value.__name__]
        return self.token(value)

    def _imported(self, fn, codes, refs: dict) -> list:
        """The user modules that the function's own import statements name (`import a.b as c`,
        `from . import d`, `from a.b import f`), resolved as the import will resolve them; a
        library one is named in `refs` ("import numpy").

        A user module not loaded yet is imported (running the function would import it): a
        fingerprint must not depend on what the process happened to import before. One that
        fails to import makes the fingerprint volatile."""
        found = []
        package = fn.__globals__.get("__package__")
        for code in codes:
            if _IMPORT_NAME not in code.co_code[::2]:
                continue
            args = [None, None]  # what the two instructions before IMPORT_NAME push: level, fromlist
            for ins in dis.get_instructions(code):
                if ins.opcode == _IMPORT_NAME:
                    level, fromlist = args
                    try:
                        base = importlib.util.resolve_name("." * level + ins.argval, package)
                    except (ImportError, ValueError):  # beyond the top-level package: it fails whenever it runs
                        continue
                    for target in [base, *(f"{base}.{x}" for x in fromlist or () if x != "*")]:
                        if target in sys.modules:
                            refs[f"import {target}"] = self._ref(sys.modules[target], found)
                        elif target != base and hasattr(sys.modules.get(base), target.rpartition(".")[2]):
                            continue  # `from a.b import f`: f is followed through a.b
                        elif _is_user_top(target.partition(".")[0]):
                            try:
                                refs[f"import {target}"] = self._ref(importlib.import_module(target), found)
                            except Exception as exc:  # noqa: BLE001 -- it fails whenever the function runs, too
                                self.volatile.append(f"{fn.__module__}.{fn.__qualname__} imports {target}, "
                                                     f"which fails: {type(exc).__name__}: {exc}")
                        else:
                            refs[f"import {target}"] = ["module", target, _version(target)]
                args = [args[1], ins.argval]
        return found

    def _code(self, code, codes: list, doc=None):
        codes.append(code)
        consts = []
        for i, const in enumerate(code.co_consts):
            if isinstance(const, types.CodeType):
                consts.append(self._code(const, codes))
            elif i == 0 and doc is not None and const == doc:
                consts.append("<doc>")
            else:
                consts.append(self.token(const))
        return ["code", code.co_code.hex(), consts, list(code.co_names), list(code.co_varnames),
                code.co_argcount, code.co_kwonlyargcount, code.co_flags,
                list(code.co_freevars), list(code.co_cellvars)]


def cell_filled(cell) -> bool:
    """Whether a closure cell holds a value (a name assigned after the closure was made may not yet)."""
    try:
        cell.cell_contents  # noqa: B018 -- reading an empty cell raises
    except ValueError:
        return False
    return True


def fingerprint(obj) -> str:
    return Fingerprinter()(obj)
