"""Today's miles, issue 50 item 5: the weight-update FIFO ticket lock (miles/utils/
distributed_lock.py ``StoreTicketLock``, 4d412b5a; protocols/broadcast.py ``send_bucket``,
069a4115) fails closed and has no lease, so a rank that raises holding it and lives on stalls
every later broadcast of its cell: liveness mode finds it and the wait-for graph names the
holder (scenarios/files/field_bugs/lock_held_by_a_raised_rank.toml)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import BucketReceived, RunEnded, TasksWaiting, UpdateAborted
from miles_core.kinds import RunStatus
from miles_core.profile import MilesProfile
from miles_core.scenario import load_scenario_file, scenario_from_mapping
from sim.run import SimResult, run_scenario

FILE = Path(__file__).resolve().parent / "files" / "field_bugs" / "lock_held_by_a_raised_rank.toml"


def _failed(result: SimResult) -> set[str]:
    return {name for name, verdict in result.verdicts.items() if verdict is not None}


def test_a_rank_that_raised_holding_the_lock_stalls_the_cell_and_is_named() -> None:
    result = run_scenario(load_scenario_file(FILE), seed=0)
    assert _failed(result) == {"end_state", "liveness"}
    (ended,) = [e for e in result.history if isinstance(e, RunEnded)]
    assert ended.status is RunStatus.STALLED
    root = [e for e in result.history if isinstance(e, TasksWaiting)][-1].root
    assert "'update_weights-cell-0'" in root
    assert "cell 0's weight-update lock (process 0): ticket" in root
    assert "held by rank 1, which raised holding it" in root
    assert "waiting: ticket" in root and "(rank 0)" in root


def test_without_the_fault_the_same_world_meets_liveness() -> None:
    scenario = dataclasses.replace(load_scenario_file(FILE), faults=())
    result = run_scenario(scenario, seed=0)
    assert _failed(result) == set()
    assert any(isinstance(e, BucketReceived) for e in result.history)


def test_a_short_collective_timeout_fails_the_cell_over_and_the_run_goes_on() -> None:
    """Outside liveness mode, with the collective waiting 20 s: the engines wait out rank 0,
    which waits for the held ticket, the cell is named and the update fails over."""
    scenario = load_scenario_file(FILE)
    loop = dataclasses.replace(scenario.loop, update_weight_collective_timeout=20.0)
    scenario = dataclasses.replace(scenario, loop=loop, liveness=None)
    result = run_scenario(scenario, seed=0)
    assert _failed(result) == set()
    aborted = [e for e in result.history if type(e).__name__ == "UpdateAborted"]
    assert any(
        a.component == "cell-0"
        and "waited for cell 0's weight-update lock" in a.reason
        and "held by rank 1" in a.reason
        for a in aborted
    )


def test_the_fault_needs_today_and_several_ranks() -> None:
    scenario = load_scenario_file(FILE)
    aug = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    with pytest.raises(ConfigError, match="ticket lock only today"):
        run_scenario(dataclasses.replace(scenario, loop=aug), seed=0)
    one = dataclasses.replace(scenario.world, gpus_per_cell=1)
    rank0 = tuple(dataclasses.replace(f, rank=0) for f in scenario.faults)
    with pytest.raises(ConfigError, match="more than one pipeline stage"):
        run_scenario(dataclasses.replace(scenario, world=one, faults=rank0), seed=0)


def test_an_engine_dying_mid_broadcast_does_not_leave_the_lock_held() -> None:
    """A peer engine's death ends the broadcast on every rank; miles kills the cell whose
    actors raised (kill_on_failure), lock and store with it, so the retry meets a free lock.
    Failed closed instead, the retry on the same cell waited out the collective timeout."""
    data = {
        "name": "engine dies mid-broadcast, cells of two ranks",
        "sim": {"gpus_per_cell": 2},
        "loop": {"steps": 4, "use_fault_tolerance": True},
        "faults": [
            {"kind": "kill_engine", "engine": "engine-1", "point": "after_bucket", "bucket": 0,
             "after_step": 1},
        ],
    }  # fmt: skip
    result = run_scenario(scenario_from_mapping(data, "lock"), 0)
    assert result.ok, result.failures()
    held = [e for e in result.history if isinstance(e, UpdateAborted) and "lock" in e.reason]
    assert not held, held
    assert result.history[-1].t < 600  # not the 1,800 s collective timeout
