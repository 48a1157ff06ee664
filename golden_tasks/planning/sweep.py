"""A case's sweep: its axes (names and values) and the points they make, each a case of its own.

`Case(..., sweep={"M": pow2(16, 256), "dtype": [torch.float32, torch.bfloat16]})` verifies the case at
every combination of the values, in the order the axes are declared (the last varies fastest). A point is
named `<case>.<axis>-<value>...` (`gemm.M-64.dtype-bf16`): doit forbids '=' in a task name and shells
expand brackets, so an axis and its value are joined by '-' and the axes by '.'. Each point's specs are
the case's `specs` function called with the point's values by keyword; everything else is the case's.
"""
import inspect
import itertools
import re

from ..model.errors import SpecError

AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TEXT_VALUE = re.compile(r"[A-Za-z0-9_+-]+")  # a value that is text: no '.', which separates the axes


def pow2(first: int, last: int) -> list[int]:
    """The powers of two from `first` to `last`, both included, each a power of two: pow2(16, 256) is
    [16, 32, 64, 128, 256] (nvbench's `M[pow2]=[4:8]`)."""
    for value in (first, last):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise SpecError(f"pow2({first!r}, {last!r}): {value!r} is not a power of two")
    if first > last:
        raise SpecError(f"pow2({first!r}, {last!r}): the first is larger than the last")
    return [1 << e for e in range(first.bit_length() - 1, last.bit_length())]


def label(value: object) -> str | int | float | bool:
    """A point's value as its name and its rows show it (JSON): a number or a text as it is, a torch dtype
    by its short name (bf16, f32, i8)."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value
    text = str(value)
    if text.startswith("torch."):  # a dtype, named without importing torch here
        name = text.removeprefix("torch.")
        for long, short in (("bfloat", "bf"), ("float", "f"), ("uint", "u"), ("int", "i")):
            if name.startswith(long):
                return short + name.removeprefix(long)
        return name
    raise TypeError(f"{value!r} is not a number, a text or a torch dtype")


def _checked_axes(case: str, sweep: object, specs: object) -> dict[str, list]:
    """The axes of case `case`'s `sweep` (name -> values), or a SpecError naming the case and the axis."""
    if not isinstance(sweep, dict):
        raise SpecError(f"case {case!r}: sweep must map axis names to lists of values, got {sweep!r:.80}")
    axes = {}
    for axis, values in sweep.items():
        owner = f"case {case!r}: sweep axis {axis!r}"
        if not isinstance(axis, str) or not AXIS_NAME.fullmatch(axis):
            raise SpecError(f"case {case!r}: sweep axis name {axis!r} is not a name (letters, digits and '_')")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise SpecError(f"{owner}: expected a list of values (or a range, pow2(...)), got {values!r:.80}")
        values = list(values)
        if not values:
            raise SpecError(f"{owner}: has no values")
        labels = []
        for value in values:
            try:
                shown = label(value)
            except TypeError as exc:
                raise SpecError(f"{owner}: {exc}") from None
            if isinstance(shown, str) and not TEXT_VALUE.fullmatch(shown):
                raise SpecError(f"{owner}: value {value!r} is not a name (letters, digits, '_', '+' and '-')")
            labels.append(str(shown))
        if dupes := sorted({x for x in labels if labels.count(x) > 1}):
            raise SpecError(f"{owner}: the value {dupes[0]} is given more than once")
        axes[axis] = values
    if not callable(specs):
        raise SpecError(f"case {case!r}: a sweep's specs must be a function of its axes ({', '.join(axes)})")
    try:
        inspect.signature(specs).bind_partial(**dict.fromkeys(axes))
    except TypeError:
        raise SpecError(f"case {case!r}: specs takes no parameter for each sweep axis ({', '.join(axes)})") from None
    except ValueError:
        raise SpecError(f"case {case!r}: the signature of specs cannot be read") from None
    return axes


def point_name(case: str, point: dict) -> str:
    """The name of a point: `<case>.<axis>-<value>` for each axis."""
    return ".".join([case, *(f"{axis}-{label(value)}" for axis, value in point.items())])


def points(case: str, sweep: object, specs: object) -> list[dict]:
    """Every point of a sweep (axis -> value), in declaration order, the last axis fastest."""
    axes = _checked_axes(case, sweep, specs)
    return [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
