"""Dataclasses from JSON objects, every field checked against its type hint.

config.json is read into frozen dataclasses (formats/engine_format.py). A
dataclass takes whatever it is given, so without this a string
``"max_batch_size": "8"`` would load and fail later, deep in a step. pydantic
would do this, but the host that runs engines installs four packages and this
takes forty lines: the types here are the few JSON can hold (int, float, str,
bool, None, lists, string-keyed objects, unions with None, Any).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class SchemaError(ValueError):
    """A JSON value that does not fit the field it is read into; the message names the field."""


def from_json(cls: type[T], data: Any, where: str = "") -> T:
    """``cls(**data)`` after checking ``data``'s keys and every value's type; ``where``: the object's dotted path."""
    if not isinstance(data, dict):
        raise SchemaError(f"{where or 'the top level'}: expected an object, got {_show(data)}")
    prefix = f"{where}." if where else ""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SchemaError(f"{prefix}{unknown[0]}: not a field of this engine format")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SchemaError(f"{prefix}{name}: missing")
            continue
        values[name] = _check(data[name], hints[name], f"{prefix}{name}")
    return cls(**values)


def _check(value: Any, hint: Any, where: str) -> Any:
    """``value`` as ``hint`` (a JSON list becomes a tuple for a tuple field), or SchemaError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _check(value, arg, where)
            except SchemaError:
                pass
        raise SchemaError(f"{where}: expected {_name(hint)}, got {_show(value)}")
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected {_name(hint)}, got {_show(value)}")
        items = [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected {_name(hint)}, got {_show(value)}")
        return {k: _check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        type(None): value is None,
    }.get(hint)
    if ok is None:
        raise TypeError(f"{where}: no JSON check for the type {hint!r}")  # a new field type: teach _check
    if not ok:
        raise SchemaError(f"{where}: expected {_name(hint)}, got {_show(value)}")
    return float(value) if hint is float else value


def _name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_name(a) for a in args)
    if origin in (list, tuple):
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}
        return f"a list of {plural.get(args[0], 'values')}"
    if origin is dict:
        return "an object"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null"}.get(hint, str(hint))


def _show(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    text = "null" if value is None else "true" if value is True else "false" if value is False else repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"the string {text}" if isinstance(value, str) else text
