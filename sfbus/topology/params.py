"""Typed conversion of plain YAML data into parameter dataclasses.

Leaf checks are strict (a YAML ``"3"`` is not an int, ``true`` is not an int, an int is a fine
float, and so is a float an int where it is one exactly: ``1e6``). Numbers are what every reader
can take: an int fits in 64 bits, a float is finite (a NaN timeout would compare false with
everything and silently switch its check off), and ``Annotated[..., Range(low, high)]`` bounds
one. Containers, unions and nested dataclasses are walked here rather than handed whole to
``msgspec.convert`` so that an error names the exact sub-path (``layers[2]``), unknown keys in a
nested dataclass are refused with a suggestion, and ``Literal`` misses get a "did you mean".
Types this module does not know fall back to ``msgspec.convert(..., strict=True)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import msgspec

from sfbus.topology.yaml_source import KeyPath


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds (inclusive) a number parameter must lie within, as ``Annotated`` metadata:
    ``Annotated[float, Range(0.01, 1e7)]``."""

    low: float
    high: float

    def check(self, value: float, path: KeyPath) -> None:
        """Raise :class:`ParamError` unless ``value`` lies within the bounds."""
        if not self.low <= value <= self.high:
            raise ParamError(f"expected a number in {self.low:g}..{self.high:g}, got "
                             f"{describe_value(value)}", path)


Interval = Annotated[float, Range(0.01, 1e7)]
"""Seconds between the ticks of a timer: under 10 ms a timer floods its process (and its
peers) with work, over 1e7 s (four months) it never ticks in a run."""

Seconds = Annotated[float, Range(0.0, 1e7)]
"""A duration (a timeout, a window, a period that 0 may switch off): over 1e7 s (four months) it
never ends in a run, and the waits that take it overflow (a thread's wait near 9e9 s)."""


class ParamError(Exception):
    """A value does not fit its declared type; ``path`` is relative to the mapping converted.

    ``source`` says which mapping the offending value came from (``"given"``, ``"fallback"``), or
    ``"missing"`` when a required field has no value anywhere. ``at_key`` marks errors about the
    key itself (an unknown name) rather than its value.
    """

    def __init__(self, message: str, path: KeyPath = (), *, source: str = "given",
                 at_key: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.source = source
        self.at_key = at_key


def suggest(name: str, options: Sequence[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``options``, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(options), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def type_name(tp: Any) -> str:
    """A short human name for a type annotation: ``int``, ``list[int]``, ``'a' or 'b'``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None) or tp is None:
        return "None"
    if origin is Literal:
        shown = [repr(a) for a in args]
        return " or ".join(shown) if len(shown) <= 2 else "one of " + ", ".join(shown)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(tp, "__name__", str(tp))


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (raises TypeError if unresolvable)."""
    try:
        hints = typing.get_type_hints(cls, include_extras=True)  # keep Range bounds
    except Exception as error:  # a NameError in a forward reference is the class author's bug
        raise TypeError(f"cannot resolve the field types of {cls.__qualname__}: {error}") from None
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def required_fields(cls: type) -> set[str]:
    """Names of the dataclass's init fields that have no default."""
    return {f.name for f in dataclasses.fields(cls) if f.init
            and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def build_dataclass(cls: type, given: Mapping[str, Any],
                    fallback: Mapping[str, Any] | None = None, *, noun: str = "field",
                    owner: str = "") -> Any:
    """Instantiate dataclass ``cls``: each field from ``given``, else ``fallback``, else default.

    Unknown keys of ``given`` are errors; keys of ``fallback`` no field uses are ignored.
    Raises :class:`ParamError` (paths relative to ``given``/``fallback``).
    """
    fallback = fallback or {}
    types_ = field_types(cls)
    of = f" of {owner}" if owner else ""
    for key in given:
        if key not in types_:
            raise ParamError(f"unknown {noun} '{key}'{of}{suggest(key, list(types_))}", (key,),
                             at_key=True)
    kwargs: dict[str, Any] = {}
    source_of: dict[str, str] = {}
    required = required_fields(cls)
    for name, tp in types_.items():
        if name in given:
            source, value = "given", given[name]
        elif name in fallback:
            source, value = "fallback", fallback[name]
        elif name in required:
            raise ParamError(f"missing required {noun} '{name}' ({type_name(tp)}){of}",
                             source="missing")
        else:
            continue
        try:
            kwargs[name] = convert(value, tp, (name,))
        except ParamError as error:
            error.source = source
            raise
        source_of[name] = source
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as error:  # __post_init__ checks of the class itself
        # A check that names a field first ("num_splits must be >= 1") points at that field.
        first = str(error).split(" ", 1)[0]
        if first in source_of:
            raise ParamError(str(error), (first,), source=source_of[first]) from None
        raise ParamError(f"invalid {cls.__qualname__}: {error}") from None
    except ArithmeticError as error:  # a check the class forgot, e.g. a division by a zero field
        raise ParamError(f"invalid {cls.__qualname__}: {type(error).__name__}: {error}") from None


def convert(value: Any, tp: Any, path: KeyPath = ()) -> Any:
    """Check ``value`` against annotation ``tp`` and return it converted (lists to tuples, ...)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if tp is None or tp is type(None):
        return _expect(value is None, None, value, tp, path)
    if origin is typing.Annotated:
        result = convert(value, args[0], path)
        for bound in (a for a in args[1:] if isinstance(a, Range)):
            bound.check(result, path)
        return result
    if origin is Literal:
        # Compare types too: True == 1 but a YAML 'true' is not the literal 1.
        if any(value == a and type(value) is type(a) for a in args):
            return value
        hint = suggest(value, [a for a in args if isinstance(a, str)]) if isinstance(
            value, str) else ""
        raise ParamError(f"expected {type_name(tp)}, got {describe_value(value)}{hint}", path)
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, args, tp, path)
    if tp is bool:
        return _expect(isinstance(value, bool), value, value, tp, path)
    if tp is int:
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)  # 1e6
        _expect(isinstance(value, int) and not isinstance(value, bool), value, value, tp, path)
        if not -2**63 <= value < 2**63:
            raise ParamError(f"expected an int of at most 64 bits, got {describe_value(value)}",
                             path)
        return value
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _expect(ok, None, value, tp, path)
        if not math.isfinite(value):
            raise ParamError(f"expected a finite float, got {describe_value(value)}", path)
        return float(value)
    if tp is str:
        return _expect(isinstance(value, str), value, value, tp, path)
    if tp in (list, tuple, dict):
        origin, args = tp, ()
    if origin in (list, tuple, Sequence, typing.Sequence):
        return _convert_sequence(value, origin, args, tp, path)
    if origin in (dict, Mapping, typing.Mapping):
        if not isinstance(value, dict):
            raise ParamError(f"expected {type_name(tp)}, got {describe_value(value)}", path)
        key_tp, value_tp = args or (Any, Any)
        return {convert(k, key_tp, (*path, k)): convert(v, value_tp, (*path, k))
                for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ParamError(f"expected a mapping for {tp.__qualname__}, got "
                             f"{describe_value(value)}", path)
        try:
            return build_dataclass(tp, value)
        except ParamError as error:
            error.path = (*path, *error.path)
            raise
    try:
        return msgspec.convert(value, tp, strict=True)
    except msgspec.ValidationError as error:
        raise ParamError(f"expected {type_name(tp)}: {error}", path) from None
    except TypeError:
        raise ParamError(f"unsupported parameter type {type_name(tp)}", path) from None


def _convert_union(value: Any, args: tuple[Any, ...], tp: Any, path: KeyPath) -> Any:
    options = [a for a in args if a is not type(None)]
    if value is None and len(options) < len(args):
        return None
    if len(options) == 1:
        # Optional[X]: report X's own, more precise error.
        try:
            return convert(value, options[0], path)
        except ParamError as error:
            inner = f"expected {type_name(options[0])}, "
            if error.path == path and error.message.startswith(inner):
                error.message = f"expected {type_name(tp)}, " + error.message[len(inner):]
                error.args = (error.message,)
            raise
    for option in options:
        try:
            return convert(value, option, path)
        except ParamError:
            continue
    raise ParamError(f"expected {type_name(tp)}, got {describe_value(value)}", path)


def _convert_sequence(value: Any, origin: Any, args: tuple[Any, ...], tp: Any,
                      path: KeyPath) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ParamError(f"expected {type_name(tp)}, got {describe_value(value)}", path)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ParamError(f"expected {type_name(tp)} ({len(args)} items), got "
                             f"{len(value)} items", path)
        pairs = enumerate(zip(value, args, strict=True))
        return tuple(convert(v, a, (*path, i)) for i, (v, a) in pairs)
    item_tp = args[0] if args else Any
    items = [convert(v, item_tp, (*path, i)) for i, v in enumerate(value)]
    # Frozen params stay hashable: a Sequence annotation gets a tuple, like tuple[X, ...].
    return items if origin is list else tuple(items)


def _expect(ok: bool, result: Any, value: Any, tp: Any, path: KeyPath) -> Any:
    if not ok:
        raise ParamError(f"expected {type_name(tp)}, got {describe_value(value)}", path)
    return result


def describe_value(value: Any) -> str:
    """``str 'abc'``, ``int 3``, ``a list``: the type and a short repr of a bad value."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"
