"""One typed reading of config values: every section of a run config (``model``, ``data``, ``training``, the
visual backbone, the detector's options) is a dataclass whose field annotations say what each value takes, and
:func:`from_section` / :func:`check_mapping` read a user's mapping through them.

What an annotation can say (standard :mod:`typing`, resolved with ``get_type_hints(include_extras=True)``):

* ``int``, ``float``, ``bool``, ``str``, ``None`` and unions of them (``float | None``); ``Any`` takes anything;
* ``Literal["a", "b"]``: one of the values;
* ``list[T]``, ``dict[K, V]``: checked element by element (an element's key is named: ``data.objectives.mlm``,
  ``data.sources[1].weight``);
* a dataclass: a mapping of its fields, read by :func:`from_section` (nested sections);
* ``Annotated[T, Range(ge=0)]`` bounds a number (``Range(gt=0)``, ``Range(ge=0, lt=1)``, ...);
  ``Annotated[T, Takes("...")]`` words what the field takes (an example that works, e.g. ``{mlm: 1}``);
  ``Annotated[dict, AsMapping(Cls)]`` a mapping checked as the dataclass ``Cls`` but kept as a mapping (a model
  config's ``visual_backbone``, stored as given in ``config.json``).

How YAML's values are read: YAML 1.1 (PyYAML) reads ``1e-4`` (no dot) as a string, so a number written as a string
is taken for an ``int`` / ``float`` field; an ``int`` takes a float only when it is whole (1.5 is no count of
steps); a ``bool`` takes only ``true`` / ``false`` (``ture``, ``1``, ``"yes"`` are refused); a ``str`` takes a
number as its text (``data.shards=2024``) but no boolean, except that a ``Literal`` of words reads YAML's unquoted
``no`` / ``off`` (False) as ``"no"`` and ``yes`` / ``on`` as ``"yes"`` where those are among its values.

Every refusal is a :class:`ConfigValueError` (a ``ValueError``), one line naming the key, what it got and what it
takes: ``data.objectives must be a mapping of objective name to weight, e.g. {mlm: 1, nsp: 1}, got ['mlm', 'nsp']``;
an unknown key: ``unknown training config key(s) ['max_stepz']; valid keys are [...]``.

Standard library only; nothing here imports vlbert or detectors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import numbers
import types
import typing
from typing import Annotated, Any, Literal, Union, get_args, get_origin


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a number field (``Annotated[float, Range(gt=0)]``): ``ge`` <= x, ``gt`` < x, x <= ``le``,
    x < ``lt`` (None = unbounded on that side). NaN is in no range."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies in the range."""
        if isinstance(x, float) and math.isnan(x):
            return False
        return (
            (self.ge is None or x >= self.ge)
            and (self.gt is None or x > self.gt)
            and (self.le is None or x <= self.le)
            and (self.lt is None or x < self.lt)
        )

    def text(self) -> str:
        """``>= 1``, ``> 0``, ``in [0, 1)``, ..."""
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        return f"{'<=' if self.le is not None else '<'} {high[:-1]}" if high else ""


@dataclasses.dataclass(frozen=True)
class Takes:
    """What a field takes, in words, replacing the description made from its type (``Annotated[dict[str, float],
    Takes("a mapping of objective name to weight, e.g. {mlm: 1, nsp: 1}")]``)."""

    text: str


@dataclasses.dataclass(frozen=True)
class AsMapping:
    """A mapping checked as the dataclass ``cls`` (its field types, its ``__post_init__``) and kept as the mapping
    given, its values converted (``Annotated[dict, AsMapping(VisualBackboneConfig)]``)."""

    cls: type


class ConfigValueError(ValueError):
    """A config value of the wrong type or out of range: ``<key> must be <what it takes>, got <value>``.

    Attributes: key (the dotted key), value (what it got), takes (what it takes, in words)."""

    def __init__(self, key: str, value: Any, takes: str):
        self.key, self.value, self.takes = key, value, takes
        super().__init__(f"{key} must be {takes}, got {value!r}")


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """The ``__init__`` fields of the dataclass ``cls`` -> their resolved annotations (``Annotated`` kept)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _required(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]


def _article(text: str) -> str:
    return ("an " if text[:1] in "aeiou" else "a ") + text


def describe(tp: Any) -> str:
    """What the annotation ``tp`` takes, in words ("an int >= 1", "null or a float > 0", "one of 'stop', 'skip'")."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        meta = args[1:]
        takes = next((m.text for m in meta if isinstance(m, Takes)), None)
        if takes:
            return takes
        mapping = next((m.cls for m in meta if isinstance(m, AsMapping)), None)
        base = describe(mapping if mapping is not None else args[0])
        bounds = " ".join(m.text() for m in meta if isinstance(m, Range))
        return f"{base} {bounds}".strip()
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        text = " or ".join(describe(a) for a in members)
        return f"null or {text}" if len(members) < len(args) else text
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        return f"a list, each {describe(args[0])}" if args else "a list"
    if origin is dict:
        return f"a mapping of {describe(args[0])} to {describe(args[1])}" if args else "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping of {', '.join(field_types(tp))}"
    names = {
        int: "an int",
        float: "a float",
        bool: "a bool (true or false)",
        str: "a string",
        dict: "a mapping",
        list: "a list",
        type(None): "null",
        Any: "any value",
    }
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _number(value: Any) -> float | None:
    """``value`` as a float where it is a number or a number's text (not a bool), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):  # numpy's numbers too
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def check_value(value: Any, tp: Any, key: str) -> Any:
    """``value`` read as the annotation ``tp`` says (see the module docstring), converted where YAML gives another
    spelling of the same value (``"1e-4"`` -> 1e-4, ``10.0`` -> 10 for an int).

    Raises:
        ConfigValueError: not of the type (an element's key named where an element is wrong), or out of range.
        ValueError: a nested section's unknown key or its own ``__post_init__`` refusal.
    """
    origin = get_origin(tp)
    if origin is Annotated:
        return _check_annotated(value, tp, key)
    if origin in (Union, types.UnionType):
        return _check_union(value, tp, key)
    if origin is Literal:
        return _check_literal(value, tp, key)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigValueError(key, value, describe(tp))
        element = get_args(tp)[0] if get_args(tp) else Any
        return [check_value(v, element, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        return _check_dict(value, tp, key)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigValueError(key, value, describe(tp))
        return from_section(tp, value, key)
    return _check_plain(value, tp, key)


def _check_annotated(value: Any, tp: Any, key: str) -> Any:
    """:func:`check_value` of ``Annotated[T, ...]``: ``value`` read as T (or, with ``AsMapping(Cls)``, a mapping
    checked as ``Cls``), then its ``Range`` bounds; a refusal of the value itself says what the field takes."""
    base, meta = get_args(tp)[0], get_args(tp)[1:]
    mapping = next((m.cls for m in meta if isinstance(m, AsMapping)), None)
    try:
        if mapping is not None:
            if not isinstance(value, dict):
                raise ConfigValueError(key, value, describe(tp))
            out = check_mapping(mapping, value, key)
            mapping(**out)  # the section's own rules (__post_init__)
        else:
            out = check_value(value, base, key)
    except ConfigValueError as e:
        if e.key == key:  # this value (not one of its elements): say what the field takes, in its words
            raise ConfigValueError(key, e.value, describe(tp)) from None
        raise
    for m in meta:
        if isinstance(m, Range) and not m.contains(out):
            raise ConfigValueError(key, out, describe(tp))  # the number read ("-1e-4" -> -0.0001)
    return out


def _check_union(value: Any, tp: Any, key: str) -> Any:
    """:func:`check_value` of a union (``float | None``): the first member that takes ``value``."""
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    members = [a for a in args if a is not type(None)]
    got = value
    for member in members:
        try:
            return check_value(value, member, key)
        except ConfigValueError as e:
            if len(members) == 1 and e.key != key:
                raise  # an element of the one kind it can be: name the element
            got = e.value  # (a number read from its text where a range refused it)
    raise ConfigValueError(key, got, describe(tp))


def _check_literal(value: Any, tp: Any, key: str) -> Any:
    """:func:`check_value` of ``Literal[...]``: the option ``value`` equals once read as that option's type;
    YAML 1.1's unquoted no/off (False) and yes/on (True) as ``"no"`` / ``"yes"`` where those are options."""
    args = get_args(tp)
    for option in args:
        with contextlib.suppress(ConfigValueError):
            if check_value(value, type(option), key) == option:
                return option
    if isinstance(value, bool) and ("no" if not value else "yes") in args:
        return "no" if not value else "yes"
    raise ConfigValueError(key, value, describe(tp))


def _check_dict(value: Any, tp: Any, key: str) -> dict:
    """:func:`check_value` of ``dict`` / ``dict[K, V]``: a mapping, its keys and values checked one by one."""
    if not isinstance(value, dict):
        raise ConfigValueError(key, value, describe(tp))
    args = get_args(tp)
    if not args:
        return dict(value)
    return {check_value(k, args[0], f"{key} (a key)"): check_value(v, args[1], f"{key}.{k}") for k, v in value.items()}


def _read_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _read_int(value: Any) -> int | None:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _read_float(value: Any) -> float | None:
    number = _number(value)
    if number is None:
        return None
    return number if isinstance(value, str) else value  # a whole number stays as written (weights {mlm: 1})


def _read_str(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


#: The plain types :func:`check_value` converts: each reader gives the value read, or None for a refusal.
_READERS = ((bool, _read_bool), (int, _read_int), (float, _read_float), (str, _read_str))


def _check_plain(value: Any, tp: Any, key: str) -> Any:
    """:func:`check_value` of a plain annotation: ``Any``, ``None``, bool / int / float / str (:data:`_READERS`),
    another class (an instance of it); any other annotation (a Callable, a TypeVar) takes the value as given."""
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise ConfigValueError(key, value, "null")
    for plain, read in _READERS:
        if tp is plain:
            out = read(value)
            if out is None:
                raise ConfigValueError(key, value, describe(tp))
            return out
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigValueError(key, value, describe(tp))
    return value


def check_mapping(cls: type, values: Any, section: str) -> dict[str, Any]:
    """The given keys of ``values`` (a config section) checked and converted as the dataclass ``cls``'s fields say;
    missing keys are left to the dataclass's defaults.

    Raises:
        ConfigValueError: ``values`` is not a mapping, or a value of the wrong type or out of range.
        ValueError: an unknown key (the valid keys listed).
    """
    hints = field_types(cls)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigValueError(section, values, f"a mapping of {section} fields ({', '.join(hints)})")
    unknown = sorted((k for k in values if k not in hints), key=str)
    if unknown:
        what = section if "." in section else f"{section} config"  # "training config", "model.visual_backbone"
        raise ValueError(f"unknown {what} key(s) {unknown}; valid keys are {sorted(hints)}")
    return {k: check_value(v, hints[k], f"{section}.{k}" if section else k) for k, v in values.items()}


def from_section(cls: type, values: Any, section: str):
    """The dataclass ``cls`` built from a config section (``values``: a mapping, None = the defaults), every value
    read by :func:`check_value`; then the class's own ``__post_init__`` rules run.

    Raises:
        ConfigValueError, ValueError: see :func:`check_mapping`; a required field missing; the class's own.
    """
    given = check_mapping(cls, values, section)
    missing = [name for name in _required(cls) if name not in given]
    if missing:
        raise ValueError(f"{section} needs {', '.join(missing)} (its fields: {', '.join(field_types(cls))})")
    return cls(**given)


def check_fields(obj: Any, section: str) -> None:
    """Check (and convert in place) every field of the dataclass instance ``obj`` as its annotation says: for
    configs built in Python rather than from a file (their ``validate``).

    Raises:
        ConfigValueError, ValueError: as :func:`check_value`.
    """
    for name, tp in field_types(type(obj)).items():
        value = getattr(obj, name)
        converted = check_value(value, tp, f"{section}.{name}")
        if converted is not value and converted != value or type(converted) is not type(value):
            object.__setattr__(obj, name, converted)


__all__ = [
    "Range",
    "Takes",
    "AsMapping",
    "ConfigValueError",
    "field_types",
    "describe",
    "check_value",
    "check_mapping",
    "from_section",
    "check_fields",
]
