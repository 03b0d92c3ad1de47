"""A scenario file (TOML) as a Scenario; every mistake a ConfigError in the file's own words.

    name = "my-crash"
    description = "cell 1 dies before the allreduce of step 2, comes back at step 5"
    preset = "small"              # optional: the world to start from (PRESETS)
    expect = { status = "completed" }   # or { status = "failed", error = "NoAliveCellError" }
    progress_window = 600.0       # optional: seconds within which steps must resume
                                  # (default: 600, or 4 nominal steps if that is longer)
    until_witnessed = 100         # optional: past [loop].steps, more steps while a fault
                                  # has not fired or had its effect yet, up to 100 in all
    [limits]                      # optional: raise a bound on the world, the run or the
    cells = 4096                  # faults where a larger run is meant (scenario/limits.py)
    [sim]                         # optional: the world's shape (num_cells, gpus_per_cell,
    num_cells = 3                 # num_engines, ...) and the simulator's time models
    [loop]                        # optional: LoopConfig fields
    steps = 10
    [[faults]]                    # any number; see miles_core.scenario.faults
    kind = "kill_cell"
    cell = 1
    point = "before_allreduce"
    step = 2

Nothing is coerced and nothing is guessed: an unknown key, section or value is
an error that names the key (``[loop].steps``, ``faults[0] (kill_cell).at``)
and says how to fix it. A file that sets no key at all is an error too (an empty
file would otherwise run the defaults and pass), and so is one nested deeper than
any scenario (``limits.MAX_DEPTH``).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from miles_core.errors import ConfigError
from miles_core.loop.config import FIELD_OF_FLAG, FIELD_OF_KEY, LoopConfig, field_name
from miles_core.scenario.faults import faults_from_list
from miles_core.scenario.fields import build, check_value, require_table, unknown_keys_fix
from miles_core.scenario.limits import LIMIT_KEYS, Limits, check_depth, depth_error, over
from miles_core.scenario.liveness import Liveness
from miles_core.scenario.model import Expect, Scenario
from miles_core.scenario.presets import DEFAULT_LOOP, PRESETS
from miles_core.scenario.world import SHAPE_KEYS, TIME_KEYS, TimeModel, WorldShape

TOP_KEYS = (
    "name",
    "description",
    "preset",
    "expect",
    "progress_window",
    "max_seconds",
    "until_witnessed",
    "liveness",
    "limits",
    "sim",
    "loop",
    "miles",
    "faults",
)


def scenario_from_toml(text: str, source: str, default_name: str = "custom") -> Scenario:
    """Parse a scenario file's text; ``source`` names it in errors (its path)."""
    import tomllib  # imported here: it brings datetime (for TOML dates); nothing reads a clock

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, f"is not valid TOML ({error})", "fix the syntax") from None
    except RecursionError:  # brackets nested hundreds deep: tomllib recurses per level
        raise depth_error(source) from None
    return scenario_from_mapping(data, source, default_name)


def scenario_from_mapping(
    data: Mapping[str, Any], source: str = "scenario", default_name: str = "custom"
) -> Scenario:
    """A scenario from the tables of a file (or a dict written the same way)."""
    data = require_table(data, source, "a scenario is a TOML document of keys and tables")
    _check_shape(data, source)
    unknown = sorted(set(data) - set(TOP_KEYS), key=str)
    if unknown:
        sections = dict.fromkeys(LIMIT_KEYS, "[limits]")
        sections |= dict.fromkeys([*LOOP_FIELDS, *FIELD_OF_KEY], "[loop]")
        sections |= dict.fromkeys(SHAPE_KEYS | TIME_KEYS, "[sim]")
        fix = unknown_keys_fix(unknown, TOP_KEYS, sections)
        raise ConfigError(source, f"unknown top-level keys {unknown}", fix)
    name = check_value(str, data.get("name", default_name), "name")
    description = check_value(str, data.get("description", ""), "description")
    preset_name = check_value(str, data.get("preset", "small"), "preset")
    if preset_name not in PRESETS:
        raise ConfigError(
            "preset", f"unknown preset {preset_name!r}", f"use one of {list(PRESETS)}"
        )
    preset = PRESETS[preset_name]
    limits, faults = _limits(data)
    world, timing = _sim_section(data.get("sim", {}), preset.world, preset.timing)
    loop_data = require_table(data.get("loop", {}), "[loop]", "write the loop's flags as [loop]")
    loop_keys = _loop_keys(loop_data) | _miles_keys(data.get("miles", {}), loop_data)
    loop = build(LoopConfig, loop_keys, "[loop]", base=DEFAULT_LOOP, rename=field_name)
    expect_data = require_table(
        data.get("expect", {}),
        "expect",
        'write it as expect = { status = "failed", error = "NoAliveCellError" }',
    )
    expect = build(Expect, expect_data, "expect", rename=lambda f: f.removeprefix("expect."))
    optional = {}
    for key in ("progress_window", "max_seconds"):
        if key in data:
            optional[key] = check_value(float, data[key], key)
    if "until_witnessed" in data:
        optional["until_witnessed"] = check_value(int, data["until_witnessed"], "until_witnessed")
    if "liveness" in data:
        table = require_table(
            data["liveness"], "liveness", "write it as liveness = { heal_step = 6, steps = 3 }"
        )
        optional["liveness"] = build(
            Liveness, table, "liveness", rename=lambda f: f.removeprefix("liveness.")
        )
    return Scenario(
        name=name,
        description=description,
        world=world,
        timing=timing,
        loop=loop,
        faults=faults_from_list(faults),
        expect=expect,
        preset=preset_name,
        limits=limits,
        **optional,
    )


def _check_shape(data: Mapping[str, Any], source: str) -> None:
    """Not empty (an empty file, or only comments, would run the defaults and pass), and no
    deeper than any scenario nests."""
    if not data:
        raise ConfigError(
            source,
            "is empty: it sets no key, so it would run the defaults and pass",
            "write the scenario's keys (python -m sim run --save-scenario FILE writes a "
            "complete one), or run a named scenario (python -m sim list)",
        )
    check_depth(data, source)


def _limits(data: Mapping[str, Any]) -> tuple[Limits, Any]:
    """[limits], read first: the faults are counted against it before any is read."""
    table = require_table(
        data.get("limits", {}), "[limits]", "write the raised bounds as a [limits] section"
    )
    limits = build(Limits, table, "[limits]")
    faults = data.get("faults", [])
    if isinstance(faults, list) and len(faults) > limits.faults:
        raise over("faults", "faults", len(faults), limits, "faults")
    return limits, faults


LOOP_FIELDS = frozenset(f.name for f in dataclasses.fields(LoopConfig))

RENAMED = {
    "in_flight_groups": (
        "async_max_concurrent_samples",
        "miles' flag counts samples, not groups: in_flight_groups = k is "
        "async_max_concurrent_samples = k x n_samples_per_prompt",
    ),
}
"""Keys of earlier versions of the format, and what replaced them."""


def _loop_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """[loop] with miles' spellings (``async_data_buffer_capacity_factor``) as the fields."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in RENAMED:
            new, why = RENAMED[key]
            raise ConfigError(f"[loop].{key}", f"was replaced by {new}", why)
        if isinstance(key, str) and "-" in key and f"--{key}" in FIELD_OF_FLAG:  # dashes and all
            snake = key.replace("-", "_")
            raise ConfigError(f"[loop].{key}", "is a flag written with dashes", f"write {snake}")
        name = FIELD_OF_KEY.get(key, key)
        if name in out:
            raise ConfigError(
                f"[loop].{key}", f"sets {name} a second time", "keep one spelling of the flag"
            )
        out[name] = value
    return out


MILES_KEYS = {"profile": "miles_profile"}
"""[miles]: which miles the loop follows (miles_core.profile) -> the LoopConfig field."""


def _miles_keys(data: Any, loop_data: Mapping[str, Any]) -> dict[str, Any]:
    """[miles] profile = "today" | "aug2026": the loop's miles_profile, set in one place."""
    data = require_table(data, "[miles]", 'write it as [miles] with profile = "today"')
    unknown = sorted(set(data) - set(MILES_KEYS), key=str)
    if unknown:
        raise ConfigError("[miles]", f"unknown keys {unknown}", f"use {sorted(MILES_KEYS)}")
    hints = typing.get_type_hints(LoopConfig)  # checked here, so a bad value names [miles]
    out = {
        MILES_KEYS[k]: check_value(hints[MILES_KEYS[k]], v, f"[miles].{k}") for k, v in data.items()
    }
    for field in out:
        if field in loop_data or field_name(field) in loop_data:
            raise ConfigError(
                f"[loop].{field}", "is set in [loop] and in [miles]", "keep [miles] profile"
            )
    return out


def _sim_section(data: Any, world: WorldShape, timing: TimeModel) -> tuple[WorldShape, TimeModel]:
    """[sim]: the world's shape and the simulator's time models, in one table."""
    data = require_table(data, "[sim]", "write the world's settings as a [sim] section")
    unknown = sorted(set(data) - SHAPE_KEYS - TIME_KEYS, key=str)
    if unknown:
        raise ConfigError(
            "[sim]", f"unknown keys {unknown}", unknown_keys_fix(unknown, SHAPE_KEYS | TIME_KEYS)
        )
    shape = {k: v for k, v in data.items() if k in SHAPE_KEYS}
    time = {k: v for k, v in data.items() if k in TIME_KEYS}
    return build(WorldShape, shape, "[sim]", base=world), build(
        TimeModel, time, "[sim]", base=timing
    )
