"""Planted control bugs (sim/search/plants.py): each is caught by an oracle over the named
scenarios, the scenario files and the swarm.

A plant changes the control plane the way a user's own change might, then the
named scenarios and the files of scenarios/files (seed 0) and the first SWARM_SEEDS
swarm seeds run with every oracle, stopping at the first run that fails the oracle
named for the bug (printed with ``pytest -s``); no scenario-specific check is asserted.
``sweep`` runs them all and counts, for the shares in docs/measurements.md (the plants
and their oracles: docs/verdicts.md).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles_core.profile import MilesProfile
from miles_core.scenario import SCENARIOS, Scenario, load_scenario_file
from sim.run import SimResult, run_scenario
from sim.search.plants import PLANTS, planted
from sim.search.swarm import swarm_scenario

SWARM_SEEDS = 100
SWARM_RUN = "swarm seed"
FILES = sorted((Path(__file__).parent / "files").glob("*.toml"))


def named_scenarios() -> list[Scenario]:
    """The library's scenarios and the files', each run at seed 0."""
    return [*SCENARIOS.values(), *map(load_scenario_file, FILES)]


def sweep(plant: str, swarm_seeds: int = SWARM_SEEDS) -> tuple[Counter[str], Counter[str]]:
    """(oracles failed over the named scenarios, over the swarm seeds), run by run: the
    shares for docs/measurements.md."""
    named: Counter[str] = Counter()
    swarm: Counter[str] = Counter()
    with planted(plant):
        for where, result in _runs(swarm_seeds, named=True):
            counts = swarm if where.startswith(SWARM_RUN) else named
            counts.update(k for k, v in result.verdicts.items() if v)
    return named, swarm


AUG2026_PLANTS = {"recovery_asked_while_starting"}
"""Plants in 31f1ca9's health monitor's recovery, which the today profile does not run (its
mini FT controller heals engines: issue 50 item 4): sought in runs under aug2026."""


def _runs(swarm_seeds: int, named: bool, aug2026: bool = False) -> Iterator[tuple[str, SimResult]]:
    """The named scenarios' runs (``named``), then the swarm seeds', one at a time (each
    under aug2026 if asked)."""

    def run(scenario: Scenario, seed: int) -> SimResult:
        if aug2026:
            loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
            scenario = dataclasses.replace(scenario, loop=loop)
        return run_scenario(scenario, seed)

    for scenario in named_scenarios() if named else ():
        yield f"{scenario.name} (seed 0)", run(scenario, 0)
    for seed in range(swarm_seeds):
        yield f"{SWARM_RUN} {seed}", run(swarm_scenario(seed), seed)


def first_catch(plant: str, oracle: str, named: bool = True) -> str | None:
    """Where ``oracle`` first fails with the plant in (the runs stop there), or None."""
    with planted(plant):
        for where, result in _runs(SWARM_SEEDS, named, plant in AUG2026_PLANTS):
            if result.verdicts[oracle]:
                return where
    return None


@pytest.mark.parametrize("bug", sorted(PLANTS))
def test_a_planted_bug_fails_its_oracle(bug: str) -> None:
    oracle = PLANTS[bug][1]
    where = first_catch(bug, oracle)
    print(f"\n{bug}: {oracle} first failed on {where}")
    assert where is not None, f"{bug} passed {oracle} everywhere"


def test_the_swarm_alone_catches_the_restart_before_stamp_bug() -> None:
    """The window was reachable only by hand; the swarm's drawn fault points reach it."""
    assert first_catch("stamp_by_engine_id", "update_order", named=False) is not None


@pytest.mark.parametrize("seed", range(12))
def test_no_sample_is_recorded_after_the_run_ended_when_an_abort_lands_at_its_end(
    seed: int,
) -> None:
    """Planted, the last update's version stamp aborts every request at the instant the run
    ends. The requests' samples belong to groups the run's end cancels, so they must end
    with them, not record SampleGenerated after RunEnded (end_state failed on swarm seeds
    1, 5 and 11 when a group's cancel left its sample tasks running). The plant's own
    oracle, requests_kept, is what may fail."""
    scenario = swarm_scenario(seed)
    if seed == 0:  # its lone engine, replaced mid-rollout, stalls today's miles (test_miles_cells)
        loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
        scenario = dataclasses.replace(scenario, loop=loop)
    with planted("version_update_aborts_all"):
        result = run_scenario(scenario, seed)
    replay = f"python -m sim run swarm --seed {seed} --plant version_update_aborts_all"
    assert not result.verdicts["end_state"], f"{result.failures()}\nreplay: {replay}"
