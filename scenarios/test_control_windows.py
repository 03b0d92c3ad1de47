"""The windows an engine control call's round trip opens, reached by a fault at a time.

With ``control_reply_seconds`` the update's pause, stamp and resume take time, as
miles' HTTP calls to SGLang do. An update then spans time between its start and
its first bucket (``paused``) and between its last bucket and the resume
(``stamping``, the restart-before-stamp window), so a fault drawn at a time can
land in either, not only a fault at the named point ``after_bucket``.
"""

from __future__ import annotations

import dataclasses

import pytest

from miles_core.coverage import coverage_cells, phase_windows
from miles_core.events import EngineGivenUp, UpdateAborted, VersionPublished
from miles_core.profile import MilesProfile
from miles_core.scenario import SCENARIOS, Scenario
from miles_core.scenario.faults import make_fault
from sim.run import run_scenario
from sim.search.plants import planted

REPLY = 0.05


def _world(reply: float) -> Scenario:
    base = SCENARIOS["no_failure"]
    timing = dataclasses.replace(base.timing, control_reply_seconds=reply)
    world = dataclasses.replace(base.world, num_engines=2)
    return dataclasses.replace(base, timing=timing, world=world)


def _restart_in_window(phase: str, k: int, offset: float) -> Scenario:
    """engine-1 restarted ``offset`` seconds into the k-th span of ``phase`` of the run
    without it (the run with it is the same up to that moment)."""
    scenario = _world(REPLY)
    windows = phase_windows(run_scenario(scenario, 0).history, phase)
    start, end = windows[k]
    assert start + offset < end
    restart = make_fault("restart_engine", engine="engine-1", at=start + offset)
    return dataclasses.replace(scenario, faults=(restart,))


def test_with_calls_that_answer_at_once_the_windows_are_closed() -> None:
    history = run_scenario(_world(0.0), 0).history
    assert phase_windows(history, "paused") == []
    assert phase_windows(history, "stamping") == []


def test_with_a_round_trip_the_windows_open_once_an_update() -> None:
    result = run_scenario(_world(REPLY), 0)
    updates = sum(isinstance(e, VersionPublished) for e in result.history)
    for phase in ("paused", "stamping"):
        windows = phase_windows(result.history, phase)
        assert len(windows) == updates
        assert all(end - start >= REPLY for start, end in windows)


@pytest.mark.parametrize(("phase", "offset"), [("stamping", 0.005), ("paused", 0.06)])
def test_a_restart_at_a_time_in_the_window_is_survived(phase: str, offset: float) -> None:
    scenario = _restart_in_window(phase, 2, offset)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    assert f"restart_engine@at_time:{phase}" in {c.key() for c in coverage_cells(result.history)}
    # the update under way did not publish with the replaced process: today's miles gave up
    # that process alone (EngineGivenUp) and went on; miles at 31f1ca9 tried it all again
    given_up = [e for e in result.history if isinstance(e, EngineGivenUp)]
    assert [e.engine for e in given_up] == ["engine-1"], given_up
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    old = run_scenario(dataclasses.replace(scenario, loop=loop), 0)
    assert old.ok, old.failures()
    aborted = [e for e in old.history if isinstance(e, UpdateAborted)]
    assert any("replaced" in e.reason for e in aborted), aborted


@pytest.mark.parametrize("offset", [0.001, 0.005, REPLY - 0.001])
def test_a_restart_at_a_time_before_the_stamp_catches_stamping_by_engine_id(
    offset: float,
) -> None:
    """The restart-before-stamp bug reached by a time, not only by the point after the last
    bucket: the updater's rank 0 answers a round trip before it stamps, and a stamp that
    goes to whatever process serves the engine id then reaches the new, empty process."""
    scenario = _restart_in_window("stamping", 2, offset)
    with planted("stamp_by_engine_id"):
        result = run_scenario(scenario, 0)
    violation = result.verdicts["update_order"]
    assert violation is not None and "received 0 of" in str(violation), result.failures()
    assert run_scenario(scenario, 0).ok  # the control plane as it is stamps the old process
