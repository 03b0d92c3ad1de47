"""``frozen_value``: a frozen dataclass with slots, built without a generic write per field.

A frozen dataclass's ``__init__`` sets each field with ``object.__setattr__(self,
name, value)``: a global and an attribute looked up, then a generic write that
finds the field's descriptor in the class by name, once per field. A 64x256 run
builds nearly three million such values (events, requests, results, samples),
and their ``__init__``s were about 8% of its time (py-spy, 400 steps). The one made here
calls each field's slot descriptor directly, found once when the class is made;
everything else is the dataclass's own: the signature, the defaults, equality,
``repr``, hashing, pickling and ``__post_init__``. Writes are refused with
``FrozenInstanceError``, to a field or any other name (``_refusals``).

Only fields with a plain default (or none) are set this way. A class with a
``default_factory`` or an ``init=False`` field keeps the dataclass's ``__init__``:
nothing here needs one, and what the dataclass does for them is not redone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen_value(*, kw_only: bool = False) -> Callable[[type[T]], type[T]]:
    """``@dataclass(frozen=True, slots=True, kw_only=kw_only)``, with the quicker ``__init__``."""

    def make(cls: type[T]) -> type[T]:
        made = dataclasses.dataclass(frozen=True, slots=True, kw_only=kw_only)(cls)
        init = _slot_init(made)
        if init is not None:
            made.__init__ = init  # type: ignore[misc]
        made.__setattr__, made.__delattr__ = _refusals(made)  # type: ignore[method-assign]
        return made

    return make


def _slot_init(cls: type) -> Callable[..., None] | None:
    """The class's ``__init__`` with each field set through its slot descriptor, or None
    where a field needs more than a value (a default factory, or no place in ``__init__``)."""
    fields = dataclasses.fields(cls)
    if any(f.default_factory is not dataclasses.MISSING or not f.init for f in fields):
        return None
    scope: dict[str, Any] = {}
    params: list[str] = []
    keyword_only = False
    for f in sorted(fields, key=lambda f: f.kw_only):  # the dataclass's order: keywords last
        if f.kw_only and not keyword_only:
            params.append("*")
            keyword_only = True
        param = f.name
        if f.default is not dataclasses.MISSING:
            scope[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        params.append(param)
        scope[f"_set_{f.name}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
    body = [f"    _set_{f.name}(self, {f.name})" for f in fields]
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"])
    exec(source, scope)  # as dataclasses makes its own __init__
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


def _refusals(cls: type) -> tuple[Callable[..., None], Callable[..., None]]:
    """The dataclass's ``__setattr__`` and ``__delattr__`` (FrozenInstanceError for a field,
    or for any name on the class itself), naming the class ``slots=True`` made: Python
    3.11's name the class as it was before, so a write to a name that is not a field raised
    ``TypeError: super(type, obj)`` instead."""
    fields = frozenset(f.name for f in dataclasses.fields(cls))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in fields:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in fields:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __setattr__, __delattr__
