"""A recipe's values as TOML and ``--set`` write them: parsed (`parse_value`), checked against a `TrainConfig` field's
type hint (`matches_type`), the hint said in words (`describe_type`), a value shown as it is written (`show_value`)."""

from __future__ import annotations

import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any


def parse_value(text: str) -> Any:
    """A ``--set`` value: ``none``/``null`` (unset an optional field, which TOML cannot express), any TOML value
    (number, bool, string, array, inline table), else a bare string."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def matches_type(value: Any, hint: Any) -> bool:
    """Whether ``value``, as TOML gives it, fits the type hint ``hint`` (a list for a tuple, an int for a float)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if origin is tuple:
        inner = typing.get_args(hint)[0]
        return isinstance(value, tuple) and all(matches_type(v, inner) for v in value)
    if origin is Mapping or hint is Mapping:
        return isinstance(value, Mapping)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


_PLAIN = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "none"}
_PLURAL = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}


def describe_type(hint: Any) -> str:
    """A type hint in words: ``int | None`` → "an integer or none", ``tuple[int, ...]`` → "a list of integers"."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = list(dict.fromkeys(describe_type(arg) for arg in typing.get_args(hint)))
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]
    if origin is tuple:
        inner = typing.get_args(hint)[0]
        return f"a list of {_PLURAL.get(inner, describe_type(inner))}"
    if origin is Mapping or hint is Mapping:
        return "a table"
    if hint is Any:
        return "any value"
    return _PLAIN.get(hint, getattr(hint, "__name__", str(hint)))


def show_value(value: Any) -> str:
    """A value as it is written in a recipe or ``--set``: lists in brackets, ``true``/``false``, ``none``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {show_value(v)}" for k, v in value.items()) + "}"
    return repr(value)
