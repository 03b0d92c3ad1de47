"""An engine whose actor is lost while its server lives on, still in the router (miles #100):
the world's router sends it requests by least requests in flight; the control plane takes
a process out of the router, by its address, whenever it takes it out of rotation."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.events import EngineExited, OrphanRemoved, SampleGenerated
from miles_core.oracles.witnesses import fault_witness
from miles_core.probes import probes_hit
from miles_core.scenario import load_scenario_file, make_fault
from miles_core.scenario.library import SCENARIOS
from sim.run import run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios/files/orphan_engine_in_router.toml"


def _orphan_samples(history, engine: str, incarnation: int, since: float) -> list:
    return [
        e
        for e in history
        if isinstance(e, SampleGenerated)
        and (e.engine, e.incarnation) == (engine, incarnation)
        and e.t > since
        and not e.aborted
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_orphan_is_taken_out_of_the_router_as_its_actor_exit_is_reported(seed: int) -> None:
    result = run_scenario(load_scenario_file(FILE), seed)
    assert result.ok, result.failures()
    history = result.history
    exited = next(e for e in history if isinstance(e, EngineExited) and e.engine == "engine-1")
    removed = [e for e in history if isinstance(e, OrphanRemoved)]
    assert [(e.engine, e.incarnation, e.t) for e in removed] == [("engine-1", 0, exited.t)]
    assert not _orphan_samples(history, "engine-1", 0, exited.t)  # it served nothing after
    assert "orphan_removed_from_router" in probes_hit(history)


@pytest.mark.parametrize("seed", [0, 1])
def test_left_in_the_router_the_orphan_serves_stale_weights(seed: int) -> None:
    with planted("orphan_left_in_router"):
        result = run_scenario(load_scenario_file(FILE), seed)
    failed = {name for name, v in result.verdicts.items() if v is not None}
    assert {"published_weights", "monotonic_versions"} <= failed, failed
    assert "served version" in str(result.verdicts["published_weights"])
    exited = next(e for e in result.history if isinstance(e, EngineExited))
    assert _orphan_samples(result.history, "engine-1", 0, exited.t)  # the router used it
    assert not any(isinstance(e, OrphanRemoved) for e in result.history)


def test_without_fault_tolerance_the_orphan_is_still_removed_and_the_engine_stays_down() -> None:
    scenario = load_scenario_file(FILE)
    scenario = dataclasses.replace(
        scenario,
        until_witnessed=None,
        loop=dataclasses.replace(scenario.loop, use_fault_tolerance=False),
    )
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    assert [e.engine for e in result.history if isinstance(e, OrphanRemoved)] == ["engine-1"]


def test_an_orphan_fault_on_an_engine_with_no_process_changes_nothing_and_passes() -> None:
    base = SCENARIOS["no_failure"]
    faults = (
        make_fault("kill_engine", engine="engine-1", point="step_begin", step=1),
        make_fault("orphan_engine", engine="engine-1", point="step_begin", step=2),
    )
    result = run_scenario(dataclasses.replace(base, faults=faults), 0)
    assert fault_witness(result.history) is None
    assert not any(isinstance(e, OrphanRemoved) for e in result.history)


def test_the_witness_fails_a_lost_actor_that_left_no_server_behind() -> None:
    """An orphan fault whose world killed the server too (a kill) is not witnessed."""
    result = run_scenario(load_scenario_file(FILE), 0)
    history = [e for e in result.history if not isinstance(e, OrphanRemoved)]
    verdict = fault_witness(type(result.history)(history))
    assert verdict is not None and "left no server behind" in str(verdict)


def test_the_swarm_draws_orphans_in_fault_tolerance_seeds() -> None:
    drawn = [
        s
        for s in range(60)
        if any(f.kind.value == "orphan_engine" for f in swarm_scenario(s).faults)
    ]
    assert drawn
    assert all(swarm_scenario(s).loop.use_fault_tolerance for s in drawn)
