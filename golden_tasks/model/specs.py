"""Parameter markers and the specs that describe a kernel's arguments.

A spec never states a direction: the kernel's signature does (In, Out, InOut,
Scalar), and the ABI stage stamps it onto the specs. Reading `is_input` /
`is_output` before stamping raises rather than guessing.

What differs between a tensor and a scalar is each spec class's own answer (Spec:
its signature, its row of a parameter table, what a call passes for it, ...):
nothing outside this module asks which class a spec is.
"""
import dataclasses
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Self, cast

import torch

from .errors import SpecError
from .origin import described
from .rows import STACKED, Directed, ParamRow, SignatureRow, view_shape

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
    dtype: torch.dtype = getattr(torch, name)  # `name` is a dtype's (dtype_name)
    return dtype


@dataclasses.dataclass(frozen=True)
class Param:
    """Annotation marker for a kernel parameter: its direction and, once typed, its dtype's name (a
    TensorParam: In, Out, InOut; a ScalarParam: Scalar)."""
    direction: str  # "in" | "out" | "inout"
    dtype: str | None = None
    kind: ClassVar[str]  # the word for what it marks in the declared table (ParamRow.kind)
    dtypes: ClassVar[str]  # the dtypes it is typed with, as the message refusing another says

    def __getitem__(self, dtype: object) -> Self:
        """The marker typed with `dtype`: `In[torch.float32]`, `Scalar[torch.int64]`."""
        name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else None
        if name is None or not self.takes(name):
            raise TypeError(f"{self!r}[...] takes {self.dtypes}, got {dtype!r}")
        return dataclasses.replace(self, dtype=name)

    def takes(self, name: str) -> bool:
        """Whether it may be typed with the dtype named `name`."""
        raise NotImplementedError

    @property
    def marker(self) -> str:
        """Its name in an annotation."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.marker}[{self.dtype}]" if self.dtype else self.marker

    def row(self, name: str) -> ParamRow:
        """The declared row of the parameter `name` it marks: its dtype only where typed (the ABI stage
        checks it), no shape."""
        return ParamRow(name, self.kind, self.direction, self.dtype)


class TensorParam(Param):
    """In, Out, InOut: a tensor of any dtype."""
    kind = "tensor"
    dtypes = "a torch.dtype"

    def takes(self, name: str) -> bool:
        return True

    @property
    def marker(self) -> str:
        return {"in": "In", "out": "Out", "inout": "InOut"}[self.direction]


class ScalarParam(Param):
    """Scalar: a number a kernel receives by value, of one of SCALAR_DTYPES; always In."""
    kind = "scalar"
    dtypes = f"one of {', '.join(SCALAR_DTYPES)}"

    def takes(self, name: str) -> bool:
        return name in SCALAR_DTYPES

    @property
    def marker(self) -> str:
        return "Scalar"


In = TensorParam("in")
Out = TensorParam("out")
InOut = TensorParam("inout")
Scalar = ScalarParam("in")

# The content of an Out buffer that has no initial content (no init_value), as raw bits: a NaN whose
# payload arithmetic on numbers never makes (floats), an unlikely pattern (integers). An element that
# still holds it after the kernel ran was not written. bool has no spare value: such an Out is zeros.
_CANARY_BITS = {torch.float64: 0x7FF8_DEAD_BEEF_DEAD, torch.float32: 0x7FC0_DEAD, torch.float16: 0x7E5B,
                torch.bfloat16: 0x7FDB, torch.int64: 0xDEAD_BEEF_DEAD_BEEF, torch.int32: 0xDEAD_BEEF,
                torch.int16: 0xDEAD, torch.int8: 0xDE, torch.uint8: 0xDE}
_BITS_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _canary_word(dtype: torch.dtype) -> tuple[torch.dtype, int] | None:
    """(the integer dtype of `dtype`'s width, the canary as a value of it), or None (no canary)."""
    bits = _CANARY_BITS.get(dtype)
    if bits is None:
        return None
    width = torch.empty((), dtype=dtype).element_size()
    word = _BITS_OF_WIDTH[width]
    return word, bits - (1 << 8 * width) if word.is_signed and bits >= 1 << (8 * width - 1) else bits


def canary(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
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
    mask: torch.Tensor = t.contiguous().view(word) == value
    return mask


class Spec(Directed):
    """What every spec (TensorSpec, ScalarSpec) answers. Its direction is stamped from the kernel's signature
    (`stamped`); its signature and its row of an artifact's parameter table are what the records hold of it."""
    name: str
    dtype: torch.dtype
    _direction: str | None = None

    @property  # read-only, and unreadable until stamped: Directed only reads it
    def direction(self) -> str:  # type: ignore[override]
        if self._direction is None:
            raise SpecError(f"spec {self.name!r}: direction read before the ABI stage stamped it "
                            "(directions come from the kernel signature)")
        return self._direction

    def stamped(self, direction: str) -> Self:
        """A copy of this spec carrying the direction read off the artifact."""
        copy: Self = dataclasses.replace(cast(Any, self))  # a mixin of dataclasses: each spec class is one
        object.__setattr__(copy, "_direction", direction)
        return copy

    @property
    def by_value(self) -> bool:
        """Whether the kernel receives its value itself (a Python number: jit compiles it in, an input set
        holds it among its scalars), not a tensor."""
        raise NotImplementedError

    @property
    def signature(self) -> SignatureRow:
        """Its part of the ABI (Plan.signature): what the ABI stage checks against the kernel's table."""
        raise NotImplementedError

    def input_recipe(self, fingerprint: Callable[[Any], str]) -> SignatureRow:
        """Its row of Plan.specs, the key of an input set: its signature, and what makes its initial content,
        by `fingerprint` (project.fingerprint's)."""
        raise NotImplementedError

    def param_row(self, tensor_meta: Iterator[tuple[Sequence[int], str]] | None) -> ParamRow:
        """Its row of the parameter table of an artifact compiled for it (stamped). `tensor_meta`: the (shape,
        dtype name) of each tensor parameter in order, where the compiler says what it takes; a tensor takes the
        next, a scalar none. None: its own."""
        raise NotImplementedError

    def argument(self, tensor_for: Callable[["TensorSpec"], Any]) -> Any:
        """What a call passes for it: a tensor spec's `tensor_for(spec)`, a scalar's value."""
        raise NotImplementedError

    def rank_view(self) -> Self:
        """What each rank's kernel receives of it (the kernel is compiled for these): itself, unless it is a
        tensor placed across ranks."""
        raise NotImplementedError

    def mismatch(self, value: torch.Tensor) -> str | None:
        """Why `value`, read from a data file for it, is not what it describes (its shape and dtype, a scalar's
        value), or None."""
        raise NotImplementedError

    @property
    def rank_bytes(self) -> int:
        """The bytes each rank's kernel reads or writes of it at least once (model.work): a tensor's view's,
        none for a value passed by value."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, eq=False)
class TensorSpec(Spec):
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
    shape: tuple[int, ...]
    dtype: torch.dtype
    init_value: Any = None
    resident: int | str | None = None

    def __post_init__(self) -> None:
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
            made: torch.Tensor = init(self.shape, dtype=self.dtype)
            return made
        try:
            value = torch.as_tensor(init()).to(self.dtype)
        except Exception as exc:  # noqa: BLE001 -- the user's init: named, with its message and line
            raise SpecError(f"spec {self.name!r}: its init_value raised {described(exc)}") from None
        if tuple(value.shape) != self.shape:
            raise SpecError(f"spec {self.name!r}: init_value callable returned shape "
                            f"{tuple(value.shape)}, spec shape is {self.shape}")
        return value.contiguous()

    @property
    def by_value(self) -> bool:
        return False

    @property
    def signature(self) -> SignatureRow:
        return SignatureRow(self.name, "tensor", self.shape, dtype_name(self.dtype), resident=self.resident)

    def input_recipe(self, fingerprint: Callable[[Any], str]) -> SignatureRow:
        """Its signature, with the fingerprint of its init_value."""
        return dataclasses.replace(self.signature, init=fingerprint(self.init_value))

    def param_row(self, tensor_meta: Iterator[tuple[Sequence[int], str]] | None) -> ParamRow:
        shape, dtype = (self.shape, dtype_name(self.dtype)) if tensor_meta is None else next(tensor_meta)
        return ParamRow(self.name, "tensor", self.direction, dtype, tuple(shape))

    def argument(self, tensor_for: Callable[["TensorSpec"], Any]) -> Any:
        return tensor_for(self)

    def rank_view(self) -> Self:
        """A tensor placed across ranks (`resident`): the slice of a stacked one, unplaced; its initial content
        stays with the whole spec."""
        if self.resident is None:
            return self
        view = dataclasses.replace(self, shape=view_shape(self.shape, self.resident), init_value=None, resident=None)
        return view if self._direction is None else view.stamped(self._direction)

    @property
    def rank_bytes(self) -> int:
        return math.prod(self.rank_view().shape) * self.dtype.itemsize

    def mismatch(self, value: torch.Tensor) -> str | None:
        if tuple(value.shape) != self.shape or value.dtype != self.dtype:
            return (f"shape {tuple(value.shape)} {dtype_name(value.dtype)}, but spec {self.name!r} is "
                    f"shape {self.shape} {dtype_name(self.dtype)}")
        return None


@dataclasses.dataclass(frozen=True, eq=False)
class ScalarSpec(Spec):
    """A scalar parameter, checked for type and range at construction."""
    name: str
    dtype: torch.dtype
    value: int | float | bool  # checked against the dtype at construction

    def __post_init__(self) -> None:
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
    def shape(self) -> tuple[int, ...]:
        return ()

    @property
    def tensor(self) -> torch.Tensor:
        """The value as a 0-dim tensor of the scalar's dtype."""
        return torch.tensor(self.value, dtype=self.dtype)

    @property
    def by_value(self) -> bool:
        return True

    @property
    def signature(self) -> SignatureRow:
        return SignatureRow(self.name, "scalar", (), dtype_name(self.dtype), value=self.value)

    def input_recipe(self, fingerprint: Callable[[Any], str]) -> SignatureRow:
        """Its signature, which holds its value."""
        return self.signature

    def param_row(self, tensor_meta: Iterator[tuple[Sequence[int], str]] | None) -> ParamRow:
        return ParamRow(self.name, "scalar", self.direction, dtype_name(self.dtype), (), self.value)

    def argument(self, tensor_for: Callable[["TensorSpec"], Any]) -> Any:
        return self.value

    def rank_view(self) -> Self:
        """Itself: every rank receives its value."""
        return self

    @property
    def rank_bytes(self) -> int:
        return 0

    def mismatch(self, value: torch.Tensor) -> str | None:
        if value.numel() != 1 or not bool(value.reshape(()).to(self.dtype) == self.tensor):
            return f"holds {value.tolist()!r}, but scalar {self.name!r} is {self.value!r} (compiled in)"
        return None


def declared_params(fn: Callable[..., Any], typed: bool = False, meta_keywords: bool = False) -> list[ParamRow]:
    """The parameter table `fn`'s annotations declare (Param.row). `typed`: every marker must carry a dtype.
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
        rows.append(marker.row(p.name))
    return rows


def table_of(specs: list[Spec], tensor_meta: list[tuple[Sequence[int], str]] | None = None) -> list[ParamRow]:
    """The parameter table of an artifact compiled for the (stamped) `specs` (Spec.param_row): `tensor_meta`, the
    (shape, dtype name) of each tensor parameter in order where the compiler says what it takes (an exported
    program's inputs); by default each spec's own."""
    metas = None if tensor_meta is None else iter(tensor_meta)
    return [s.param_row(metas) for s in specs]


def stamp_all(specs: list[Spec], table: list[ParamRow]) -> list[Spec]:
    """Stamp each spec with the direction of the same-named row of an ABI-checked table."""
    directions = {row.name: row.direction for row in table}
    return [s.stamped(directions[s.name]) for s in specs]
