"""Parameter markers and the specs that describe a kernel's arguments.

A spec never states a direction: the kernel's signature does (In, Out, InOut,
Scalar), and the ABI stage stamps it onto the specs. Reading `is_input` /
`is_output` before stamping raises rather than guessing.
"""
import dataclasses
import inspect
import math
from typing import Any, Self, cast

import torch

from .errors import SpecError
from .origin import described
from .rows import STACKED, Directed, ParamRow, SignatureRow, view_shape


@dataclasses.dataclass(frozen=True)
class Param:
    """Annotation marker for a kernel parameter: its kind, direction and, once typed, dtype name."""
    kind: str  # "tensor" | "scalar"
    direction: str  # "in" | "out" | "inout"
    dtype: str | None = None

    def __getitem__(self, dtype):
        """The marker typed with `dtype`: `In[torch.float32]`, `Scalar[torch.int64]`."""
        name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else None
        if name is None or self.kind == "scalar" and name not in SCALAR_DTYPES:
            allowed = f"one of {', '.join(SCALAR_DTYPES)}" if self.kind == "scalar" else "a torch.dtype"
            raise TypeError(f"{self!r}[...] takes {allowed}, got {dtype!r}")
        return dataclasses.replace(self, dtype=name)

    def __repr__(self):
        marker = {"in": "In", "out": "Out", "inout": "InOut"}[self.direction] if self.kind == "tensor" else "Scalar"
        return f"{marker}[{self.dtype}]" if self.dtype else marker


In = Param("tensor", "in")
Out = Param("tensor", "out")
InOut = Param("tensor", "inout")
Scalar = Param("scalar", "in")

# Factories that the init_value rule calls as factory(shape, dtype=dtype).
TENSOR_FACTORIES = (torch.randn, torch.rand, torch.zeros, torch.ones)

# name -> (python type, min, max); floats are range-checked against the dtype.
SCALAR_DTYPES = {
    "int8": (int, -(2**7), 2**7 - 1),
    "int32": (int, -(2**31), 2**31 - 1),
    "int64": (int, -(2**63), 2**63 - 1),
    "uint8": (int, 0, 2**8 - 1),
    "bool": (bool, False, True),
    "float32": (float, -torch.finfo(torch.float32).max, torch.finfo(torch.float32).max),
    "float16": (float, -torch.finfo(torch.float16).max, torch.finfo(torch.float16).max),
    "bfloat16": (float, -torch.finfo(torch.bfloat16).max, torch.finfo(torch.bfloat16).max),
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


# The content of an Out buffer that has no initial content (no init_value), as raw bits: a NaN whose
# payload arithmetic on numbers never makes (floats), an unlikely pattern (integers). An element that
# still holds it after the kernel ran was not written. bool has no spare value: such an Out is zeros.
_CANARY_BITS = {torch.float64: 0x7FF8_DEAD_BEEF_DEAD, torch.float32: 0x7FC0_DEAD, torch.float16: 0x7E5B,
                torch.bfloat16: 0x7FDB, torch.int64: 0xDEAD_BEEF_DEAD_BEEF, torch.int32: 0xDEAD_BEEF,
                torch.int16: 0xDEAD, torch.int8: 0xDE, torch.uint8: 0xDE}
_BITS_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _canary_word(dtype: torch.dtype):
    """(the integer dtype of `dtype`'s width, the canary as a value of it), or None (no canary)."""
    bits = _CANARY_BITS.get(dtype)
    if bits is None:
        return None
    width = torch.empty((), dtype=dtype).element_size()
    word = _BITS_OF_WIDTH[width]
    return word, bits - (1 << 8 * width) if word.is_signed and bits >= 1 << (8 * width - 1) else bits


def canary(shape, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of `shape` that holds no value yet: every element the canary (zeros for a dtype without one)."""
    found = _canary_word(dtype)
    if found is None:
        return torch.zeros(shape, dtype=dtype)
    word, value = found
    return torch.full(tuple(shape), value, dtype=word).view(dtype)


def unwritten(t: torch.Tensor) -> torch.Tensor:
    """Where `t` still holds the canary (a bool mask of its shape; all False for a dtype without one)."""
    found = _canary_word(t.dtype)
    if found is None:
        return torch.zeros(t.shape, dtype=torch.bool)
    word, value = found
    return t.contiguous().view(word) == value


class _Stampable(Directed):
    name: str
    _direction: str | None = None

    @property  # read-only, and unreadable until stamped: Directed only reads it
    def direction(self) -> str:  # type: ignore[override]
        if self._direction is None:
            raise SpecError(f"spec {self.name!r}: direction read before the ABI stage stamped it "
                            "(directions come from the kernel signature)")
        return self._direction

    def stamped(self, direction: str) -> Self:
        """A copy of this spec carrying the direction read off the artifact."""
        copy = dataclasses.replace(cast(Any, self))  # a mixin of dataclasses: each spec class is one
        object.__setattr__(copy, "_direction", direction)
        return copy


@dataclasses.dataclass(frozen=True, eq=False)
class TensorSpec(_Stampable):
    """A tensor parameter. `init_value` is its initial content, for the golden and the kernel alike:

    None -> zeros for an input and for the golden's copy of an Out; the kernel's copy of such an Out
    has no content (the canary, see `canary`); int/float -> filled; a tensor -> converted to `dtype`;
    torch.randn/rand/zeros/ones -> called with (shape, dtype=dtype);
    any other callable -> called with no arguments, result converted.
    Random data is never implicit; the pipeline seeds every call.

    `resident` places it for a multi-rank kernel: None or False, every rank gets
    the whole tensor; an int k, it lives on rank k only; "stacked", its leading
    dim is the rank and rank r gets slice r. (True is refused as ambiguous.)
    """
    name: str
    shape: tuple
    dtype: torch.dtype
    init_value: Any = None
    resident: int | str | None = None
    kind = "tensor"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise SpecError(f"TensorSpec name {self.name!r} is not an identifier")
        try:
            shape = tuple(int(d) for d in self.shape)
        except TypeError:
            raise SpecError(f"spec {self.name!r}: shape {self.shape!r} is not a sequence of ints") from None
        if any(d < 0 for d in shape):
            raise SpecError(f"spec {self.name!r}: negative dimension in shape {shape}")
        object.__setattr__(self, "shape", shape)
        if not isinstance(self.dtype, torch.dtype):
            raise SpecError(f"spec {self.name!r}: dtype {self.dtype!r} is not a torch.dtype")
        init = self.init_value
        if not (init is None or isinstance(init, (int, float, torch.Tensor)) or callable(init)):
            raise SpecError(f"spec {self.name!r}: unknown init_value {init!r} "
                            "(expected None, a number, a tensor or a callable)")
        if isinstance(init, torch.Tensor) and tuple(init.shape) != shape:
            raise SpecError(f"spec {self.name!r}: init_value tensor has shape {tuple(init.shape)}, "
                            f"spec shape is {shape}")
        where = self.resident
        if where is True or not (where is None or where is False or where == STACKED
                                 or isinstance(where, int) and not isinstance(where, bool) and where >= 0):
            raise SpecError(f"spec {self.name!r}: resident={where!r} is ambiguous or unknown (expected None, "
                            f"a rank number >= 0, or {STACKED!r})")
        if where == STACKED and not shape:
            raise SpecError(f"spec {self.name!r}: resident={STACKED!r} needs a leading dim (one slice per rank)")
        object.__setattr__(self, "resident", None if where is False else where)

    @property
    def initialised(self) -> bool:
        """Whether the kernel's buffer starts with content: an input's, or an Out's init_value (an Out
        without one starts as the canary, and every element the kernel leaves is reported unwritten)."""
        return self.is_input or self.init_value is not None

    def make(self) -> torch.Tensor:
        """The initial tensor; callers seed torch's RNG first."""
        init = self.init_value
        if init is None:
            return torch.zeros(self.shape, dtype=self.dtype)
        if isinstance(init, (int, float)):
            return torch.full(self.shape, init, dtype=self.dtype)
        if isinstance(init, torch.Tensor):
            return init.detach().to(self.dtype).clone()
        if any(init is f for f in TENSOR_FACTORIES):
            return init(self.shape, dtype=self.dtype)
        try:
            value = torch.as_tensor(init()).to(self.dtype)
        except Exception as exc:  # noqa: BLE001 -- the user's init: named, with its message and line
            raise SpecError(f"spec {self.name!r}: its init_value raised {described(exc)}") from None
        if tuple(value.shape) != self.shape:
            raise SpecError(f"spec {self.name!r}: init_value callable returned shape "
                            f"{tuple(value.shape)}, spec shape is {self.shape}")
        return value.contiguous()


@dataclasses.dataclass(frozen=True, eq=False)
class ScalarSpec(_Stampable):
    """A scalar parameter, checked for type and range at construction."""
    name: str
    dtype: torch.dtype
    value: int | float | bool  # checked against the dtype at construction
    kind = "scalar"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise SpecError(f"ScalarSpec name {self.name!r} is not an identifier")
        name = dtype_name(self.dtype) if isinstance(self.dtype, torch.dtype) else None
        if name not in SCALAR_DTYPES:
            raise SpecError(f"scalar {self.name!r}: dtype {self.dtype!r} is not one of "
                            f"{', '.join(SCALAR_DTYPES)}")
        pytype, lo, hi = SCALAR_DTYPES[name]
        value = self.value
        ok_type = isinstance(value, bool) if pytype is bool else (
            isinstance(value, pytype) and not isinstance(value, bool)
            or pytype is float and isinstance(value, int) and not isinstance(value, bool))
        if not ok_type:
            raise SpecError(f"scalar {self.name!r}: value {value!r} is not a {pytype.__name__} "
                            f"for dtype {name}")
        if pytype is float and math.isfinite(value) and not lo <= value <= hi:
            raise SpecError(f"scalar {self.name!r}: value {value!r} is out of range for {name}")
        if pytype is int and not lo <= value <= hi:
            raise SpecError(f"scalar {self.name!r}: value {value!r} is out of range for {name} [{lo}, {hi}]")
        object.__setattr__(self, "value", pytype(value))

    @property
    def shape(self) -> tuple:
        return ()

    @property
    def tensor(self) -> torch.Tensor:
        """The value as a 0-dim tensor of the scalar's dtype."""
        return torch.tensor(self.value, dtype=self.dtype)


def declared_params(fn, typed=False, meta_keywords=False) -> list[ParamRow]:
    """The parameter table `fn`'s annotations declare: name, kind and direction, and the dtype of a typed
    marker (the ABI stage checks it). `typed`: every marker must carry a dtype.
    `meta_keywords`: keyword-only parameters are meta-parameters (a Triton launcher's), not in the table."""
    rows = []
    for p in inspect.signature(fn, eval_str=True).parameters.values():
        if meta_keywords and p.kind == p.KEYWORD_ONLY:
            continue
        marker = p.annotation
        if not isinstance(marker, Param) or typed and marker.dtype is None:
            need = ("a typed annotation such as In[torch.float32]" if typed
                    else "an In, Out, InOut or Scalar annotation")
            raise TypeError(f"kernel {fn.__name__}: parameter {p.name!r} needs {need}, got {marker!r}")
        rows.append(ParamRow(p.name, marker.kind, marker.direction, marker.dtype))
    return rows


def table_of(specs, tensor_meta) -> list[ParamRow]:
    """An artifact's parameter table rows; tensor (shape, dtype name) pairs come from `tensor_meta`, in order."""
    rows, metas = [], iter(tensor_meta)
    for s in specs:
        shape, dtype = next(metas) if s.kind == "tensor" else ((), dtype_name(s.dtype))
        rows.append(ParamRow(s.name, s.kind, s.direction, dtype, tuple(shape)))
    return rows


def signature_of(spec) -> SignatureRow:
    """The spec's part of the ABI: name, kind, shape, dtype (a scalar's value; a resident tensor's place)."""
    if spec.kind == "scalar":
        return SignatureRow(spec.name, spec.kind, (), dtype_name(spec.dtype), value=spec.value)
    return SignatureRow(spec.name, spec.kind, spec.shape, dtype_name(spec.dtype), resident=spec.resident)


def rank_view(spec):
    """The spec of what each rank's kernel receives (a stacked tensor's slice, unplaced): the
    kernel is compiled for these. Its initial content stays with the whole spec."""
    if spec.kind != "tensor" or spec.resident is None:
        return spec
    view = dataclasses.replace(spec, shape=view_shape(spec.shape, spec.resident), init_value=None, resident=None)
    return view if spec._direction is None else view.stamped(spec._direction)


def stamp_all(specs, table: list[ParamRow]) -> list:
    """Stamp each spec with the direction of the same-named row of an ABI-checked table."""
    directions = {row.name: row.direction for row in table}
    return [s.stamped(directions[s.name]) for s in specs]
