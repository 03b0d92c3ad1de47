"""A frozen dataclass from what a user wrote (a TOML table), checked key by key.

Every mistake is a ConfigError naming the key the way the user wrote it
(``[loop].steps``, ``faults[2].at``) and the fix: an unknown key, a table
where a value belongs, a string where a number belongs, a bool where an
integer belongs, an enum value that does not exist. Nothing is coerced: 8.0 is
not accepted for an integer, "8" is not accepted for a number.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, TypeVar

from miles_core.errors import ConfigError

T = TypeVar("T")


def unknown_keys_fix(
    unknown: list[Any], known: typing.Iterable[str], elsewhere: Mapping[str, str] | None = None
) -> str:
    """The fix for keys a table does not have: the key each one most likely meant (a miles
    flag written with dashes, a misspelling, a key of another section: ``elsewhere`` maps
    such keys to their section), then every key there is. Only said, never taken: the
    file still fails to load."""
    keys = sorted(known)
    elsewhere = elsewhere or {}
    meant = []
    for key in unknown:
        written = str(key)
        snake = written.replace("-", "_").lower()
        if snake in elsewhere:
            meant.append(f"{snake} belongs under {elsewhere[snake]}")
        elif snake in keys:
            meant.append(f"write {written!r} as {snake} (keys are snake_case)")
        elif close := difflib.get_close_matches(snake, [*keys, *elsewhere], n=1, cutoff=0.75):
            under = f", under {elsewhere[close[0]]}" if close[0] in elsewhere else ""
            meant.append(f"{written!r} may be {close[0]}{under}")
    said = "; ".join(meant)
    return f"{said}; use only {keys}" if said else f"use only {keys}"


def require_table(value: object, where: str, how: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, f"is {value!r}, not a table", how)
    return value


def check_value(hint: Any, value: Any, where: str) -> Any:
    """``value`` as the type ``hint`` names, or a ConfigError saying what was expected."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None and type(None) in options:
        return None
    problems = []
    for option in options:
        if option is type(None):
            continue
        try:
            return _check_one(option, value, where)
        except ConfigError as error:
            problems.append(error.fix)
    raise ConfigError(where, f"got {value!r}", " or ".join(problems))


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _check_one(hint: Any, value: Any, where: str) -> Any:
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        if isinstance(value, hint):
            return value
        choices = [e.value for e in hint]
        if isinstance(value, str) and value in choices:
            return hint(value)
        raise ConfigError(where, f"got {value!r}", _enum_fix(value, choices))
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(where, f"got {value!r}", "write true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(where, f"got {value!r}", "write an integer")
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and _finite(value):
            return float(value)
        raise ConfigError(where, f"got {value!r}", "write a finite number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(where, f"got {value!r}", "write a string in quotes")
    return value  # a type the user never writes directly (checked by its own class)


def _enum_fix(value: object, choices: list[str]) -> str:
    """The fix for a value an enum does not have: the one it most likely meant (as for a
    misspelled key, ``unknown_keys_fix``), then every one there is."""
    if isinstance(value, str):
        snake = value.replace("-", "_").lower()
        if close := difflib.get_close_matches(snake, choices, n=1, cutoff=0.75):
            return f"{value!r} may be {close[0]}; use one of {choices}"
    return f"use one of {choices}"


def _finite(value: float) -> bool:
    """Not inf or nan, and held by a float (TOML reads 400-digit integers; a float cannot)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def build(
    cls: Callable[..., T],
    data: Mapping[str, Any],
    where: str,
    base: T | None = None,
    rename: Callable[[str], str] = lambda name: name,
) -> T:
    """``cls(**data)`` (or ``replace(base, **data)``) with every key and value checked.

    ``where`` prefixes each key in errors (``[loop]`` gives ``[loop].steps``);
    ``rename`` maps the field name a constructor's own ConfigError used (e.g. a
    miles flag such as ``--rollout-batch-size``) back to the key the user wrote.
    """
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        raise ConfigError(where, f"unknown keys {unknown}", unknown_keys_fix(unknown, known))
    values = {k: check_value(hints[k], v, f"{where}.{k}") for k, v in data.items()}
    if base is None:  # a field with no default that the table left out (liveness = {})
        required = [
            f.name
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = [name for name in required if name not in values]
        if missing:
            raise ConfigError(f"{where}.{missing[0]}", "is missing", f"set {missing[0]}")
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)  # type: ignore[type-var]
    except ConfigError as error:
        key = rename(error.field)
        field = f"{where}.{key}" if key in known else f"{where} ({error.field})"
        raise ConfigError(field, error.problem, error.fix) from None
