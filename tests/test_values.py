"""frozen_value: the same class a frozen slots dataclass is, with an __init__ that sets slots."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_core.backend import GenerateRequest, GenerateResult
from miles_core.buffer import Sample
from miles_core.errors import ConfigError
from miles_core.events import _REGISTRY, PromptDrawn
from miles_core.values import frozen_value

_NAMES = ["a", "b", "c", "d", "e"]


def _made(spec: list[tuple[bool, bool]], decorate: object) -> type | str:
    """A class with fields a, b, ... (each: has a default, is keyword-only), or the
    TypeError the decorator refused it with."""
    namespace: dict[str, object] = {"__annotations__": {}}
    for name, (default, field_kw_only) in zip(_NAMES, spec, strict=False):
        namespace["__annotations__"][name] = "int"  # type: ignore[index]
        if default or field_kw_only:
            namespace[name] = dataclasses.field(
                default=len(name) * 7 if default else dataclasses.MISSING,
                kw_only=field_kw_only,
            )
    try:
        return decorate(type("Twin", (), namespace))  # type: ignore[operator, no-any-return]
    except TypeError as error:  # a field without a default after one with
        return str(error)


def _outcome(cls: type, args: tuple[int, ...], kwargs: dict[str, int]) -> object:
    try:
        made = cls(*args, **kwargs)
    except TypeError as error:
        return ("TypeError", str(error))
    return {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}


@given(
    spec=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=0, max_size=5),
    kw_only=st.booleans(),
    args=st.lists(st.integers(0, 9), max_size=6),
    keywords=st.dictionaries(st.sampled_from([*_NAMES, "z"]), st.integers(0, 9)),
)
def test_any_call_gives_what_the_plain_dataclass_gives(
    spec: list[tuple[bool, bool]], kw_only: bool, args: list[int], keywords: dict[str, int]
) -> None:
    """Positional and keyword arguments, defaults, keyword-only fields, missing, extra and
    repeated arguments: the same fields, or the same TypeError (the class named alike)."""
    fast = _made(spec, frozen_value(kw_only=kw_only))
    plain = _made(spec, dataclasses.dataclass(frozen=True, slots=True, kw_only=kw_only))
    if isinstance(plain, str) or isinstance(fast, str):
        assert fast == plain  # refused by both, alike
        return
    assert _outcome(fast, tuple(args), keywords) == _outcome(plain, tuple(args), keywords)


def test_every_event_and_hot_value_sets_its_fields_through_its_slots() -> None:
    """The ``__init__`` of each event class and of the per-request values is frozen_value's:
    it names only slot setters (and ``__post_init__``), not ``object.__setattr__``."""
    classes = [*_REGISTRY.values(), Sample, GenerateRequest, GenerateResult]
    assert len(classes) >= 40
    for cls in classes:
        names = set(cls.__init__.__code__.co_names)
        assert "__setattr__" not in names, cls
        expected = {f"_set_{f.name}" for f in dataclasses.fields(cls)}
        assert expected <= names, cls
        assert cls.__dictoffset__ == 0, cls  # slots: no dict beside each value


def test_it_stays_frozen_equal_hashable_and_picklable() -> None:
    result = GenerateResult("e0", 3, False, 0.5, None, 1.25, (2, 3), True)
    assert (result.engine, result.versions, result.kept_kv) == ("e0", (2, 3), True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.reward = 1.0  # type: ignore[misc]
    twin = GenerateResult("e0", 3, False, 0.5, "other payload", 1.25, (2, 3), True)
    assert result == twin and hash(result) == hash(twin)  # payload: compare=False
    assert pickle.loads(pickle.dumps(result)) == result
    assert dataclasses.replace(result, reward=1.0).reward == 1.0


def test_post_init_still_checks_what_it_checked() -> None:
    with pytest.raises(ConfigError, match=r"sample 4\.weight_versions"):
        Sample(4, (-1,))
    assert Sample(4, (2,)).weight_versions == (2,)


def test_a_default_factory_keeps_the_dataclass_init() -> None:
    @frozen_value()
    class WithFactory:
        items: list[int] = dataclasses.field(default_factory=list)

    first, second = WithFactory(), WithFactory()
    assert first.items == [] and first.items is not second.items
    assert "__setattr__" in WithFactory.__init__.__code__.co_names


@pytest.mark.parametrize("name", ["group_id", "not_a_field"])
def test_a_write_or_delete_of_any_name_is_refused_as_frozen(name: str) -> None:
    """Python 3.11's frozen slots dataclass raised TypeError for a name that is not a field."""
    for value in (GenerateRequest(1, 2, 3), PromptDrawn(t=0.0, prompt_id=1)):
        with pytest.raises(dataclasses.FrozenInstanceError, match=repr(name)):
            setattr(value, name, 5)
        with pytest.raises(dataclasses.FrozenInstanceError, match=repr(name)):
            delattr(value, name)
