"""A driver hot restart (restart_driver; miles/utils/hot_restart.py at 14aca060): the driver
dies alone, a new one adopts the live cells and engines, and every step, version and prompt
goes through once; a new driver that adopts a stale state is caught by the resume oracle."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.event_index import select
from miles_core.events import (
    DriverAdopted,
    DriverRestarted,
    GroupTrained,
    StepCommitted,
    VersionPublished,
)
from miles_core.profile import MilesProfile
from miles_core.saves import SaveState
from miles_core.scenario.files import load_scenario_file
from miles_core.segments import timeline
from sim.run import SimResult, run_scenario
from sim.world import driver_restart

FILES = Path(__file__).parent / "files"
NAMES = ("restart_driver_mid_run", "restart_driver_in_update")


def _run(name: str, profile: MilesProfile | None = None) -> SimResult:
    scenario = load_scenario_file(FILES / f"{name}.toml")
    if profile is not None:
        loop = dataclasses.replace(scenario.loop, miles_profile=profile)
        scenario = dataclasses.replace(scenario, loop=loop)
    return run_scenario(scenario, 0)


def _failures(result: SimResult) -> str:
    return "\n".join(str(v) for v in result.verdicts.values() if v)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("profile", [MilesProfile.TODAY, MilesProfile.AUG2026])
def test_a_hot_restart_keeps_steps_versions_and_prompts_once(
    name: str, profile: MilesProfile
) -> None:
    result = _run(name, profile)
    assert not _failures(result), _failures(result)
    history = result.history
    assert len(select(history, DriverRestarted)) == 1
    assert len(select(history, DriverAdopted)) == 1
    kept, _ = timeline(history)
    steps = [e.step for _, e in select(kept, StepCommitted)]  # type: ignore[attr-defined]
    assert steps == list(range(result.scenario.loop.steps))
    versions = [e.version for _, e in select(kept, VersionPublished)]  # type: ignore[attr-defined]
    assert versions == list(range(1, len(steps) + 1))
    prompts = [e.prompt_id for _, e in select(kept, GroupTrained)]  # type: ignore[attr-defined]
    assert len(prompts) == len(set(prompts))


def test_the_new_driver_closes_the_window_the_dead_one_left_open() -> None:
    result = _run("restart_driver_in_update")
    [(_, adopted)] = select(result.history, DriverAdopted)
    assert isinstance(adopted, DriverAdopted)
    assert adopted.closed == adopted.engines == ("engine-0", "engine-1")
    assert adopted.resumed == adopted.engines  # paused by the dead driver's update
    assert (adopted.save_step, adopted.version, adopted.next_step) == (0, 1, 1)
    published_before = [
        e.version  # type: ignore[attr-defined]
        for seq, e in select(result.history, VersionPublished)
        if e.t < adopted.t
    ]
    assert published_before == [1]  # version 2 was loaded in part, never published


def test_a_new_driver_that_adopts_a_stale_state_is_caught(monkeypatch) -> None:
    """Planted: the trainer hands the new driver the state before its last publish, so the
    new driver publishes that version again. The timeline alone would hide it (it is cut at
    the adopted version); the resume oracle's adoption check does not."""
    original = driver_restart.SimDriverRestarts._hold

    def lagging(self: driver_restart.SimDriverRestarts, state: SaveState) -> None:
        previous = getattr(self, "_newest", None)
        self._newest = state  # type: ignore[attr-defined]
        if previous is not None:
            original(self, previous)

    monkeypatch.setattr(driver_restart.SimDriverRestarts, "_hold", lagging)
    result = _run("restart_driver_mid_run")
    violation = result.verdicts["resume"]
    assert violation is not None
    assert "adopted version 3" in violation.message
    assert "last version published before the driver died was 4" in violation.message


def test_a_hung_engine_does_not_hold_the_take_over() -> None:
    """Swarm seed 2580: the driver restarts while engine-3, hung, holds an update session
    open; the new driver's end_update to it never answered, so the adoption never ended and
    the run stalled with 0 of 12 steps. miles bounds the take-over (300 s) and leaves the
    engines that do not answer (miles_core.loop.adopt.TAKE_OVER_SECONDS)."""
    from miles_core.events import DriverAdopted
    from sim.search.swarm import swarm_scenario

    result = run_scenario(swarm_scenario(2580), 2580)
    assert result.ok, result.failures()
    assert any(isinstance(e, DriverAdopted) for e in result.history)
