"""The rows of a kernel's parameter table (ParamRow) and of its specs' ABI signature (SignatureRow), typed.

A form declares a parameter table (forms.KernelForm.params: name, kind, direction, and a dtype or shape
where it declares one); an artifact embeds the table it was compiled for (every field set), and the ABI
stage checks the declared table against the specs' signature and stamps the table the other stages read
(AbiMeta.table). Rows cross into JSON (a plan, a stored entry's meta, a runtime dir's manifest, the
answer of a confined probe: forms/untrusted.py) by `to_json`, which leaves out a field that is None (a
declared row's shape, a tensor's value), and come back by `from_json`, which refuses a malformed row
naming its field: the probe's answer comes from a process that runs untrusted code.

No torch here: the doit parent reads plans, and their rows, without importing it.
"""
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Self, TypeVar

STACKED = "stacked"  # TensorSpec.resident: the leading dim is the rank
KINDS = ("tensor", "scalar")
DIRECTIONS = ("in", "out", "inout")


_Dim = TypeVar("_Dim", int, int | None)  # a dim of a shape: a spec's (int) or a declared row's (None: any size)


def view_shape(shape: Sequence[_Dim], resident: int | str | None) -> tuple[_Dim, ...]:
    """The shape one rank of a multi-rank kernel receives of a tensor of `shape` placed by
    `resident`: a stacked tensor's slice (its leading dim is the rank); anything else whole."""
    return tuple(shape[1:] if resident == STACKED else shape)


class Directed:
    """What a direction ("in", "out" or "inout") says of a parameter: a spec's (once stamped) or a row's."""
    direction: str

    @property
    def is_input(self) -> bool:
        """The kernel reads its content: an In or InOut parameter."""
        return self.direction in ("in", "inout")

    @property
    def is_output(self) -> bool:
        """The kernel writes it: an Out or InOut parameter."""
        return self.direction in ("out", "inout")


# A JSON value's check: (whether a value is acceptable, what is expected, for the message refusing one)
_Check = tuple[Callable[[Any], bool], str]


def _name(value: object) -> bool:
    return isinstance(value, str) and value.isidentifier()


def _word(words: tuple[str, ...]) -> _Check:
    return (lambda value: value in words), " or ".join(map(repr, words))


def _dim(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shape(dynamic: bool) -> _Check:
    """A shape: a list of dims (ints >= 0), where `dynamic` also None (a dim any size matches)."""
    return ((lambda value: isinstance(value, list) and all(_dim(d) or dynamic and d is None for d in value)),
            "a list of dims (ints >= 0" + (" or None)" if dynamic else ")"))


_TEXT: _Check = (lambda value: isinstance(value, str)), "text"
_NAME: _Check = _name, "an identifier"


class Row:
    """A row: a frozen dataclass of JSON values (a shape as a tuple), and `_CHECKS`, what from_json accepts of
    each field."""
    _CHECKS: ClassVar[dict[str, _Check]]
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]  # each row type is a dataclass

    def to_json(self) -> dict[str, Any]:
        """The row as JSON: its fields but those that are None, a shape as a list."""
        fields = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: list(value) if isinstance(value, tuple) else value for name, value in fields
                if value is not None}

    @classmethod
    def from_json(cls, data: object, where: str) -> Self:
        """The row `data` holds (`to_json`'s); a ValueError naming `where` and the field for anything else: a
        field it does not have, a missing one, a value of the wrong kind."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected an object (a {cls.__name__}), got {data!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name not in fields:
                raise ValueError(f"{where}.{name}: not a field of a {cls.__name__} (it has {', '.join(fields)})")
            accepts, expected = cls._CHECKS[name]
            if not accepts(value):
                raise ValueError(f"{where}.{name}: expected {expected}, got {value!r}")
        if missing := [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in data]:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        return cls(**{name: tuple(value) if isinstance(value, list) else value for name, value in data.items()})


def _scalar_value(value: object) -> bool:
    return isinstance(value, (bool, int, float))


@dataclasses.dataclass(frozen=True)
class ParamRow(Row, Directed):
    """A parameter of a kernel: its name, kind ("tensor" or "scalar") and direction ("in", "out" or "inout");
    the name of its dtype and its shape where a form declares them (a dim None matches any size) or an
    artifact was compiled for them, else None (also an artifact's that one build serves at every shape:
    KernelForm.builds_once); a scalar's value where the table is one for a compile (the ABI's, an
    artifact's, Plan.compiled_for: what a kernel may compile in), but for a build that serves every value."""
    name: str
    kind: str
    direction: str
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None
    value: bool | int | float | None = None

    _CHECKS = {"name": _NAME, "kind": _word(KINDS), "direction": _word(DIRECTIONS), "dtype": _TEXT,
               "shape": _shape(dynamic=True), "value": (_scalar_value, "a number or a bool")}

    @property
    def by_value(self) -> bool:
        """Whether the kernel receives its value itself (a scalar: specs.Spec.by_value), not a tensor."""
        return self.kind == "scalar"

    def open(self) -> "ParamRow":
        """The row of a build that serves every call (KernelForm.builds_once): a tensor's without its shape, a
        scalar's without its value."""
        return dataclasses.replace(self, value=None) if self.by_value else dataclasses.replace(self, shape=None)

    def serves(self, checked: "ParamRow") -> bool:
        """Whether an artifact built for this row takes the parameter of the ABI-checked row `checked`: the
        same row, or the row of a build that serves every call (`open`) of one."""
        return self in (checked, checked.open())


def _resident(value: object) -> bool:
    return value == STACKED or _dim(value)


@dataclasses.dataclass(frozen=True)
class SignatureRow(Row):
    """A spec's part of the ABI: its name, kind, shape and dtype's name; a scalar's value; a tensor's place
    across ranks (TensorSpec.resident) where it has one; and, in a plan's `specs` (what makes an input set),
    the fingerprint of a tensor's init_value (`init`)."""
    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str
    value: bool | int | float | None = None
    resident: int | str | None = None
    init: str | None = None

    _CHECKS = {"name": _NAME, "kind": _word(KINDS), "shape": _shape(dynamic=False), "dtype": _TEXT,
               "value": (_scalar_value, "a number or a bool"), "resident": (_resident, f"a rank or {STACKED!r}"),
               "init": _TEXT}

    @property
    def rank_shape(self) -> tuple[int | None, ...]:
        """The shape each rank's kernel receives (view_shape)."""
        return view_shape(self.shape, self.resident)

    def param_row(self, direction: str) -> ParamRow:
        """The row of the table the ABI stage checked and stamped: what the kernel takes on each rank, in
        `direction` (the kernel's)."""
        return ParamRow(self.name, self.kind, direction, self.dtype, self.rank_shape, self.value)


_R = TypeVar("_R", bound=Row)


def stamped_table(params: list[ParamRow], signature: list[SignatureRow]) -> list[ParamRow]:
    """The table the ABI stage stamps (AbiMeta.table): each spec's row in the direction the kernel declares for
    it. A spec the kernel does not declare counts as "in": the ABI stage fails that case before it stamps."""
    directions = {p.name: p.direction for p in params}
    return [s.param_row(directions.get(s.name, "in")) for s in signature]


def compiled_for(params: list[ParamRow], signature: list[SignatureRow], builds_once: bool) -> list[ParamRow]:
    """The table a kernel is compiled for (Plan.compiled_for): the ABI stage's (stamped_table); for a kernel that
    one build serves at any shapes and scalar values (KernelForm.builds_once), without a tensor's shape or a
    scalar's value."""
    return [r.open() if builds_once else r for r in stamped_table(params, signature)]


def placement_of(signature: list[SignatureRow]) -> dict[str, int | str]:
    """Where each resident tensor of a signature lives across ranks: name -> TensorSpec.resident
    (AbiMeta.placement)."""
    return {s.name: s.resident for s in signature if s.resident is not None}


def rows_from_json(row: type[_R], data: object, where: str) -> list[_R]:
    """The `row` rows a JSON list holds; a ValueError naming `where` and the row for anything else."""
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of rows, got {data!r}")
    return [row.from_json(item, f"{where}[{i}]") for i, item in enumerate(data)]


def rows_field(row: type[Row], required: bool = False, **metadata: Any) -> Any:
    """A dataclass field holding a list of `row` rows (a parameter table, a signature): `json_of` writes it as
    the rows' JSON and `fields_from_json` reads it back. Without a default where `required`, else an empty
    list; `metadata`: the field's own besides."""
    if required:
        return dataclasses.field(metadata={**metadata, "rows": row})
    return dataclasses.field(default_factory=list, metadata={**metadata, "rows": row})


def _rows_of(cls: type) -> dict[str, type[Row]]:
    """field name -> row type, of the fields of the dataclass `cls` made by rows_field."""
    return {f.name: f.metadata["rows"] for f in dataclasses.fields(cls) if f.metadata.get("rows")}


def json_of(obj: object, name: str) -> Any:
    """The field `name` of the dataclass `obj` as JSON: a rows_field as its rows' JSON, any other as it is."""
    value = getattr(obj, name)
    return [r.to_json() for r in value] if name in _rows_of(type(obj)) else value


def as_json(obj: Any) -> dict[str, Any]:
    """The dataclass `obj` as JSON: dataclasses.asdict (copies), with its rows_fields as their rows' JSON."""
    return {**dataclasses.asdict(obj), **{name: json_of(obj, name) for name in _rows_of(type(obj))}}


def fields_from_json(cls: type, record: dict[str, Any]) -> dict[str, Any]:
    """`record` (JSON: as_json's, or some of its fields) with the rows_fields of the dataclass `cls` read as
    their rows; a ValueError names a malformed one."""
    rows = _rows_of(cls)
    return {name: rows_from_json(rows[name], value, name) if name in rows else value
            for name, value in record.items()}
