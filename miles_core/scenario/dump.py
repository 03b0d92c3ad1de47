"""A Scenario as the TOML text of a scenario file (what ``--save-scenario`` writes).

Only what differs from the preset's world and the default loop is written, so a
saved scenario reads like a hand-written one. ``scenario_to_toml`` checks that the
text loads back to the same scenario, and says which setting a file cannot hold.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from miles_core.errors import ConfigError
from miles_core.scenario.limits import Limits
from miles_core.scenario.model import Expect, Scenario
from miles_core.scenario.presets import DEFAULT_LOOP, PRESETS

_RUN_FIELDS = ("seed", "scenario")
"""LoopConfig fields a run sets (not part of the scenario)."""


def _value(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(map(_value, value)) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    raise ConfigError("scenario", f"cannot write {value!r} to TOML", "use numbers and strings")


def _changed(value: Any, base: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        f.name: getattr(value, f.name)
        for f in dataclasses.fields(value)
        if f.name not in skip and getattr(value, f.name) != getattr(base, f.name)
    }


def _table(header: str, values: Mapping[str, Any]) -> list[str]:
    if not values:
        return []
    return ["", header, *(f"{k} = {_value(v)}" for k, v in values.items())]


def scenario_to_toml(scenario: Scenario) -> str:
    from miles_core.scenario.load import scenario_from_toml  # load imports this module's peers

    preset = PRESETS[scenario.preset]
    lines = [
        f"name = {_value(scenario.name)}",
        f"description = {_value(scenario.description)}",
        f"preset = {_value(scenario.preset)}",
    ]
    if scenario.expect != Expect():
        inner = ", ".join(
            f"{k} = {_value(v)}" for k, v in _changed(scenario.expect, Expect()).items()
        )
        lines.append(f"expect = {{ {inner} }}")
    if scenario.progress_window is not None:
        lines.append(f"progress_window = {_value(scenario.progress_window)}")
    if scenario.max_seconds is not None:
        lines.append(f"max_seconds = {_value(scenario.max_seconds)}")
    if scenario.until_witnessed is not None:
        lines.append(f"until_witnessed = {scenario.until_witnessed}")
    if scenario.liveness is not None:
        inner = ", ".join(
            f"{f.name} = {_value(getattr(scenario.liveness, f.name))}"
            for f in dataclasses.fields(scenario.liveness)
        )
        lines.append(f"liveness = {{ {inner} }}")
    lines += _table("[limits]", _changed(scenario.limits, Limits()))
    sim = _changed(scenario.world, preset.world) | _changed(scenario.timing, preset.timing)
    lines += _table("[sim]", sim)
    loop = _changed(scenario.loop, DEFAULT_LOOP, skip=_RUN_FIELDS)
    missing = sorted(k for k, v in loop.items() if v is None)
    if missing:
        raise ConfigError(
            f"[loop].{missing[0]}",
            "is unset (None) where the default loop sets it, and TOML has no null",
            "set it to a value, or leave the scenario in Python",
        )
    profile = loop.pop("miles_profile", None)
    lines += _table("[loop]", loop)
    if profile is not None:
        lines += _table("[miles]", {"profile": profile})
    for fault in scenario.faults:
        lines += _table("[[faults]]", fault.to_mapping())
    text = "\n".join(lines) + "\n"
    again = scenario_from_toml(text, "scenario_to_toml", scenario.name)
    run_free = dataclasses.replace(
        scenario,
        loop=dataclasses.replace(scenario.loop, seed=again.loop.seed, scenario=again.loop.scenario),
    )
    if again != run_free:
        raise ConfigError("scenario", "does not survive a round trip through TOML", "report this")
    return text
