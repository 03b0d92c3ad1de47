"""The weight-update group kept across updates, made afresh only where miles makes it
(miles_core/update_connections.py): miles #1444's staleness mark is what lets a cell that
becomes the updater again drop a group naming an engine process that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_core.backend import EngineFailure
from miles_core.events import UpdateAborted, UpdateBegan, UpdateGroupConnected
from miles_core.probes import probes_hit
from miles_core.scenario import TimeModel, WorldShape, load_scenario_file
from miles_core.scenario.library import SCENARIOS
from miles_core.transfer import plan_buckets
from miles_core.update_connections import ConnectReason, UpdateConnections
from sim.run import run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario
from sim.world.cluster import SimCluster
from sim.world.runtime import SimRuntime

FILE = (
    Path(__file__).resolve().parents[1]
    / "scenarios"
    / "files"
    / "update_group_kept_across_failover.toml"
)
ENGINES = {"engine-0": 0, "engine-1": 0}


def _connected(cell: int = 0) -> UpdateConnections:
    connections = UpdateConnections()
    connections.connected(cell, ENGINES)
    return connections


def test_a_group_is_kept_until_miles_would_make_it_afresh() -> None:
    connections = UpdateConnections()
    assert connections.has_new_engines  # every engine is new as the run begins
    assert connections.reason_to_connect(0, ENGINES, True) is ConnectReason.FIRST
    connections.connected(0, ENGINES)
    assert not connections.has_new_engines  # consumed by the cell that connected
    assert connections.reason_to_connect(0, ENGINES, False) is None
    assert connections.reason_to_connect(1, ENGINES, False) is ConnectReason.FIRST


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: c.engines_created(), ConnectReason.NEW_ENGINES),
        (lambda c: c.reconfigured((0, 1)), ConnectReason.STALE),
        (lambda c: c.member_failed(0), ConnectReason.MEMBER_FAILED),
        (lambda c: c.cell_replaced(0), ConnectReason.FIRST),
    ],
    ids=["new_engines", "reconfigured", "member_failed", "cell_replaced"],
)
def test_each_cause_makes_the_group_afresh_once(change, reason) -> None:
    connections = _connected()
    change(connections)
    assert connections.reason_to_connect(0, ENGINES, connections.has_new_engines) is reason
    connections.connected(0, ENGINES)
    assert connections.reason_to_connect(0, ENGINES, connections.has_new_engines) is None


def test_a_group_for_other_engines_cannot_carry_the_update() -> None:
    connections = _connected()
    only_one = {"engine-1": 0}
    assert connections.reason_to_connect(0, only_one, False) is ConnectReason.OTHER_ENGINES


def test_the_flag_another_cell_consumed_leaves_this_cells_group_as_it_was() -> None:
    """miles' one has_new_engines for the whole run: cell 1 connecting clears it for cell 0,
    whose group names the old processes (what only the staleness mark repairs)."""
    connections = _connected(0)
    connections.engines_created()
    connections.connected(1, {"engine-0": 0, "engine-1": 1})
    assert connections.reason_to_connect(0, ENGINES, connections.has_new_engines) is None
    assert connections.group(0) == ENGINES


def test_a_run_without_faults_connects_once_and_keeps_the_group() -> None:
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.ok, result.failures()
    connects = [e for e in result.history if isinstance(e, UpdateGroupConnected)]
    updates = [e for e in result.history if isinstance(e, UpdateBegan)]
    assert len(updates) > 3
    assert [(e.updater, e.reason) for e in connects] == [(0, ConnectReason.FIRST)]


def test_the_cell_that_updates_again_makes_its_stale_group_afresh() -> None:
    result = run_scenario(load_scenario_file(FILE), 0)
    assert result.ok, result.failures()
    connects = [
        (e.updater, e.reason, dict(zip(e.engines, e.incarnations, strict=True)))
        for e in result.history
        if isinstance(e, UpdateGroupConnected)
    ]
    # cell 1 connected the first process while cell 0 was down, and again at the end
    first, restarted = {"engine-0": 0}, {"engine-0": 1}
    assert connects[0] == (0, ConnectReason.FIRST, first)
    assert (1, ConnectReason.FIRST, first) in connects
    assert (0, ConnectReason.NEW_ENGINES, restarted) in connects
    assert connects[-1] == (1, ConnectReason.STALE, restarted)
    assert "stale_update_group_renewed" in probes_hit(result.history)


def test_without_the_staleness_mark_the_kept_group_fails_the_run() -> None:
    with planted("connection_kept_after_reconfigure"):
        result = run_scenario(load_scenario_file(FILE), 0)
    assert result.verdicts["end_state"], "the planted #1444 bug passed end_state"
    (aborted,) = [e for e in result.history if isinstance(e, UpdateAborted)][-1:]
    assert aborted.component == "cell-1"
    assert "names engine-0's process 0" in aborted.reason


@pytest.mark.parametrize(
    ("connected", "restart_cell", "named"),
    [
        (None, False, "engine-0"),
        ({"engine-0": 0, "engine-1": 1}, False, "engine-1"),
        (ENGINES, True, "engine-0"),
    ],
    ids=["never_connected", "other_process", "cell_replaced"],
)
def test_the_simulated_world_sends_only_over_the_group_its_cell_made(
    connected: dict[str, int] | None, restart_cell: bool, named: str
) -> None:
    """The world reports its own state: a bucket for a process the cell's group was not made
    for (or a group whose cell processes are gone) fails, naming the engine."""
    rt = SimRuntime(0)
    cluster = SimCluster(rt, WorldShape(num_engines=2), TimeModel())
    bucket = plan_buckets(cluster.units, 1 << 40)[0]

    async def main() -> EngineFailure:
        if connected is not None:
            await cluster.transport.connect(0, 0, connected)
        if restart_cell:
            cluster.cells[0].start()
        try:
            await cluster.transport.send_bucket(0, 0, bucket, ENGINES)
        except EngineFailure as failure:
            return failure
        raise AssertionError("the bucket went out over no group")

    failure = rt.run(main())
    assert "is not in cell 0's weight-update group" in failure.reason
    assert failure.engine == named


def test_the_swarms_updater_round_trip_finds_the_planted_bug() -> None:
    """The swarm's round trip of the updater (cell 0 down, back, an engine restarted, down
    again) reaches the #1444 sequence on its own: 36 of 1,000 seeds, the first at 17."""
    with planted("connection_kept_after_reconfigure"):
        for seed in range(100):
            if run_scenario(swarm_scenario(seed), seed).verdicts["end_state"]:
                return
    raise AssertionError("no swarm seed of 100 found connection_kept_after_reconfigure")
