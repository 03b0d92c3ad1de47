"""miles' mini FT controller (miles_core/loop/cell_controller.py): a stopped cell is resumed
after the resume delay and healed at the next refresh; a world that cannot start it is asked
again after miles' backoff; off, a killed cell stays out."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from miles_core.backend import CellFailure
from miles_core.cells import CellState
from miles_core.errors import ConfigError
from miles_core.events import (
    CellRestartAsked,
    CellStarted,
    CellStateChanged,
    HealEnded,
    QuorumChanged,
)
from miles_core.loop.config import LoopConfig
from miles_core.scenario import SCENARIOS
from miles_core.scenario.faults import make_fault
from sim.run import SimResult, run_scenario
from sim.world.cluster import SimCluster

NAME = "ft_controller_heals_a_killed_cell"


def of(result: SimResult, kind: type) -> list[Any]:
    return [e for e in result.history if isinstance(e, kind)]


def _stopped_at(result: SimResult, cell: int) -> float:
    return next(
        e.t for e in of(result, CellStateChanged) if e.cell == cell and e.new is CellState.STOPPED
    )


@pytest.mark.parametrize("seed", range(3))
def test_a_killed_cell_is_resumed_after_the_delay_and_healed(seed: int) -> None:
    result = run_scenario(SCENARIOS[NAME], seed)
    assert result.ok, result.failures()
    loop = result.scenario.loop
    stopped = _stopped_at(result, 1)
    (asked,) = of(result, CellRestartAsked)
    waited = asked.t - stopped
    delay, poll = loop.mini_ft_controller_resume_delay, loop.mini_ft_controller_poll_interval
    assert delay <= waited <= poll + delay, waited  # the next poll's look, then the delay
    started = [e for e in of(result, CellStarted) if e.cell == 1]
    assert [e.t for e in started] == [asked.t]  # the world made them when asked
    healed = [e for e in of(result, HealEnded) if e.dst_cell == 1 and e.ok]
    assert healed and healed[0].t >= asked.t
    assert of(result, QuorumChanged)[-1].members == (0, 1)


def test_without_the_controller_the_killed_cell_stays_out() -> None:
    scenario = SCENARIOS[NAME]
    off = dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, mini_ft_controller_enable=False)
    )
    result = run_scenario(off, 0)
    assert result.ok, result.failures()
    assert not of(result, CellRestartAsked) and not of(result, CellStarted)
    assert of(result, QuorumChanged)[-1].members == (0,)


def test_a_world_that_cannot_start_the_cell_is_asked_again_after_the_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """miles' ``_heal``: a failed heal waits 5 x 2^failures s (10, then 20) before the next."""
    refusals = 2
    started = SimCluster.start_cell

    def start_cell(self: SimCluster, index: int) -> None:
        nonlocal refusals
        if refusals:
            refusals -= 1
            raise CellFailure(index, "no GPUs free")
        started(self, index)

    monkeypatch.setattr(SimCluster, "start_cell", start_cell)
    result = run_scenario(SCENARIOS[NAME].with_run(steps=16, seed=0), 0)
    assert result.ok, result.failures()
    asked = [e.t for e in of(result, CellRestartAsked)]
    assert len(asked) == 3
    delay = result.scenario.loop.mini_ft_controller_resume_delay
    poll = result.scenario.loop.mini_ft_controller_poll_interval
    for gap, backoff in zip((asked[1] - asked[0], asked[2] - asked[1]), (10.0, 20.0), strict=True):
        assert backoff + delay <= gap <= backoff + delay + poll, (asked, gap)
    assert [e.t for e in of(result, CellStarted)] == [asked[2]]


def test_a_cell_started_another_way_during_the_delay_is_not_started_again() -> None:
    """The scenario's own start_cell comes while the controller waits its (long) delay: the
    controller finds the cell no longer stopped and asks nothing."""
    scenario = SCENARIOS[NAME]
    loop = dataclasses.replace(scenario.loop, mini_ft_controller_resume_delay=60.0)
    start = make_fault("start_cell", cell=1, point="step_begin", step=3)
    result = run_scenario(
        dataclasses.replace(scenario, loop=loop, faults=(*scenario.faults, start)), 0
    )
    assert result.ok, result.failures()
    assert len([e for e in of(result, CellStarted) if e.cell == 1]) == 1
    assert not of(result, CellRestartAsked)
    assert of(result, QuorumChanged)[-1].members == (0, 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("mini_ft_controller_poll_interval", 0.0), ("mini_ft_controller_resume_delay", -1.0)],
)
def test_bad_controller_settings_are_named(field: str, value: float) -> None:
    with pytest.raises(ConfigError) as raised:
        LoopConfig(steps=4, **{field: value})
    assert field in str(raised.value)


def test_a_cell_that_takes_time_to_start_is_reported_then_and_healed_after() -> None:
    scenario = SCENARIOS[NAME]
    slow = dataclasses.replace(
        scenario, timing=dataclasses.replace(scenario.timing, cell_start_seconds=7.0)
    )
    result = run_scenario(slow, 0)
    assert result.ok, result.failures()
    (asked,) = of(result, CellRestartAsked)
    assert asked.t - asked.suspended == result.scenario.loop.mini_ft_controller_resume_delay
    (started,) = [e for e in of(result, CellStarted) if e.cell == 1]
    assert started.t == pytest.approx(asked.t + 7.0)
    healed = [e for e in of(result, HealEnded) if e.dst_cell == 1 and e.ok]
    assert healed and healed[0].t >= started.t


def test_the_swarm_runs_the_controller_in_a_share_of_its_seeds_without_their_starts() -> None:
    from miles_core.kinds import FaultKind
    from sim.search.swarm import swarm_scenario

    on = [s for s in map(swarm_scenario, range(120)) if s.loop.mini_ft_controller_enable]
    assert 10 <= len(on) <= 50
    assert all(f.kind is not FaultKind.START_CELL for s in on for f in s.faults)
    assert any(f.kind is FaultKind.KILL_CELL for s in on for f in s.faults)
    live = [swarm_scenario(seed, liveness=True) for seed in range(40)]
    assert not any(s.loop.mini_ft_controller_enable for s in live)


def test_dropping_the_starts_renumbers_what_waits_on_a_fault_and_refuses_a_wait_on_one() -> None:
    from sim.search.swarm_controller import _without_starts

    kill = make_fault("kill_cell", cell=1, at=3.0)
    start = make_fault("start_cell", cell=1, at=5.0)
    after_kill = make_fault("kill_engine", engine="engine-1", after={"fault": 2, "seconds": 1.0})
    kept = _without_starts([start, start, kill, after_kill])
    assert kept is not None and [f.kind for f in kept] == ["kill_cell", "kill_engine"]
    assert kept[1].when.fault == 0  # type: ignore[union-attr]  # the kill's new place
    after_start = make_fault("kill_engine", engine="engine-1", after={"fault": 0})
    assert _without_starts([start, after_start]) is None
