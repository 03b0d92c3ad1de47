"""kill_rank and fail_rank: faults on one rank of a cell of several (miles #1443: a rank
that raises with its process alive fails its cell, whose processes are killed at once)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.cells import CellState
from miles_core.errors import ConfigError
from miles_core.events import CellStateChanged, HealEnded
from miles_core.kinds import FaultKind
from miles_core.probes import probes_hit
from miles_core.scenario import load_scenario_file, make_fault
from miles_core.scenario.faults import RANK_FAILED
from sim.run import run_scenario
from sim.search.swarm import swarm_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios" / "files" / "rank_faults.toml"


def test_a_rank_that_raises_fails_its_cell_which_is_stopped_and_healed() -> None:
    result = run_scenario(load_scenario_file(FILE), 0)
    assert result.ok, result.failures()
    stopped = [
        e for e in result.history if isinstance(e, CellStateChanged) and e.new is CellState.STOPPED
    ]
    assert [e.cell for e in stopped] == [1, 1]
    assert stopped[0].reason.endswith(f"a rank raised in train: RuntimeError: {RANK_FAILED}")
    healed = [e.dst_cell for e in result.history if isinstance(e, HealEnded) and e.ok]
    assert healed == [1, 1]  # after each fault, rank by rank
    assert "sharded_cell_healed" in probes_hit(result.history)


def test_a_rank_the_cells_do_not_have_is_refused_naming_the_key() -> None:
    scenario = load_scenario_file(FILE)
    world = dataclasses.replace(scenario.world, gpus_per_cell=1)
    with pytest.raises(ConfigError) as error:
        dataclasses.replace(scenario, world=world)
    assert "faults[0] (fail_rank).rank" in str(error.value)
    assert "rank 1 does not exist in cells of 1 rank(s)" in str(error.value)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"kind": "fail_rank", "point": "step_begin"}, "fail_rank cannot strike at step_begin"),
        ({"kind": "kill_rank", "point": "step_begin", "rank": -1}, "pass a rank >= 0"),
        ({"kind": "kill_rank", "point": "step_begin", "rank": None}, "ranks count from 0"),
    ],
)
def test_bad_rank_faults_name_the_field_and_the_fix(keys: dict, message: str) -> None:
    data = {"cell": 1, "rank": 0, "step": 1} | keys
    if data["rank"] is None:
        del data["rank"]
    with pytest.raises(ConfigError, match=message):
        make_fault(**data)


def test_the_swarm_strikes_single_ranks_of_sharded_cells_and_they_pass() -> None:
    struck = 0
    for seed in range(300):
        scenario = swarm_scenario(seed)
        kinds = {f.kind for f in scenario.faults}
        if kinds & {FaultKind.KILL_RANK, FaultKind.FAIL_RANK}:
            assert scenario.world.gpus_per_cell > 1
            struck += 1
            result = run_scenario(scenario, seed)
            assert result.ok, f"seed {seed}: {result.failures()}"
    assert struck >= 5
