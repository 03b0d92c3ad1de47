"""The world-neutral scenario layer: what to run, on what world, with which faults, ending how.

Both worlds import it (the simulator and the real backends); nothing here knows
how a world is built. See load.py for the file format and faults.py for the
fault types and their triggers.
"""

from __future__ import annotations

from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.faults import (
    AnyFault,
    AtTime,
    FaultSpec,
    make_fault,
    target_cell,
    target_engine,
)
from miles_core.scenario.files import load_scenario_file, save_scenario_file
from miles_core.scenario.library import SCENARIOS
from miles_core.scenario.load import scenario_from_mapping, scenario_from_toml
from miles_core.scenario.model import Expect, Scenario
from miles_core.scenario.presets import DEFAULT_LOOP, PRESETS, Preset
from miles_core.scenario.seeds import derive_seed
from miles_core.scenario.world import TimeModel, WorldShape


def find_scenario(name_or_file: str) -> Scenario:
    """A named scenario, or a scenario file's path."""
    if name_or_file in SCENARIOS:
        return SCENARIOS[name_or_file]
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.exists():
        return load_scenario_file(path)
    raise ConfigError(
        "scenario",
        f"unknown scenario {name_or_file!r}",
        "run 'python -m sim list' for the names, or pass a .toml file",
    )


__all__ = [
    "DEFAULT_LOOP",
    "PRESETS",
    "SCENARIOS",
    "AnyFault",
    "AtTime",
    "Expect",
    "FaultSpec",
    "Preset",
    "Scenario",
    "TimeModel",
    "WorldShape",
    "derive_seed",
    "find_scenario",
    "load_scenario_file",
    "make_fault",
    "save_scenario_file",
    "scenario_from_mapping",
    "scenario_from_toml",
    "scenario_to_toml",
    "target_cell",
    "target_engine",
]
