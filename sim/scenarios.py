"""The scenarios the simulator runs: the named ones, scenario files, and the swarm.

Named scenarios and the file format are world-neutral (miles_core.scenario);
the swarm draws its scenarios with seeded random streams, so it lives here.
"""

from __future__ import annotations

from miles_core.scenario import (
    PRESETS,
    SCENARIOS,
    Scenario,
    load_scenario_file,
    scenario_from_toml,
)
from miles_core.scenario import find_scenario as find_named_or_file
from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS, swarm_scenario


def find_scenario(name_or_file: str, seed: int = 0) -> Scenario:
    """A named scenario, a swarm drawn from ``seed``, or a scenario file's path."""
    if name_or_file in (SWARM, SWARM_TOTAL_LOSS):
        return swarm_scenario(seed, total_loss=name_or_file == SWARM_TOTAL_LOSS)
    return find_named_or_file(name_or_file)


__all__ = [
    "PRESETS",
    "SCENARIOS",
    "find_scenario",
    "load_scenario_file",
    "scenario_from_toml",
]
