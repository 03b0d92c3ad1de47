"""slow_start: an engine whose new processes take far longer to start than the health
monitor's patience. The monitor must wait for a recovery under way, not replace the
process being started; the plant that forgets it never gets the engine back, and the
fault's witness says so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import EngineRecoveryAsked, EngineStarted, FaultInjected, History
from miles_core.kinds import FaultKind
from miles_core.oracles.witnesses import fault_witness
from miles_core.probes import probes_hit
from miles_core.profile import MilesProfile
from miles_core.scenario import Scenario, load_scenario_file, make_fault
from miles_core.scenario.library import SCENARIOS
from miles_core.scenario.liveness import Liveness
from sim.run import run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios" / "files" / "ft_engine_starts_slowly.toml"


def _starts(history: object) -> list[tuple[float, float]]:
    """(asked, started) of each recovery of engine-1 that came up."""
    asked = [e.t for e in history if isinstance(e, EngineRecoveryAsked) and e.engine == "engine-1"]
    up = [e.t for e in history if isinstance(e, EngineStarted) and e.engine == "engine-1"]
    return [(max(a for a in asked if a <= t), t) for t in up if any(a <= t for a in asked)]


def test_the_monitor_waits_for_a_slow_start_and_the_engine_comes_back() -> None:
    scenario = load_scenario_file(FILE)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    asked = [e for e in result.history if isinstance(e, EngineRecoveryAsked)]
    assert [e.engine for e in asked] == ["engine-1"]  # asked once, then waited for
    ((began, came_up),) = _starts(result.history)
    assert came_up - began >= scenario.faults[0].seconds
    assert "slow_recovery_awaited" in probes_hit(result.history)


def test_a_monitor_that_asks_again_never_gets_the_engine_back() -> None:
    """31f1ca9's monitor (aug2026): today's recovers no engine (its FT controller does)."""
    scenario = load_scenario_file(FILE)
    aug2026 = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    with planted("recovery_asked_while_starting"):
        result = run_scenario(dataclasses.replace(scenario, loop=aug2026), 0)
    asked = [e for e in result.history if isinstance(e, EngineRecoveryAsked)]
    slow = next(e for e in result.history if isinstance(e, FaultInjected))
    closed = slow.t + slow.duration
    assert len([e for e in asked if e.t < closed]) > 2  # each ask replaced the start
    assert all(began >= closed for began, _ in _starts(result.history))  # none begun in it
    verdict = result.verdicts["fault_witness"]
    assert verdict is not None and "slow_start" in verdict.message
    assert "each was replaced before it could" in verdict.message


def test_a_start_begun_after_the_window_is_fast() -> None:
    """The window holds only the starts begun in it: a kill after it closed comes back at
    the world's usual pace, and the window that met no start passes as idle."""
    scenario = load_scenario_file(FILE)
    kill = make_fault("kill_engine", engine="engine-1", point="step_begin", step=4)
    slow = dataclasses.replace(scenario.faults[0], duration=1.0)
    result = run_scenario(dataclasses.replace(scenario, faults=(slow, kill)), 0)
    assert result.ok, result.failures()
    ((began, came_up),) = _starts(result.history)
    assert came_up - began < slow.seconds


def test_a_restart_set_off_by_the_slow_start_is_slowed() -> None:
    """``after = {fault = N}`` follows fault N's effect: the restart, at the same instant,
    finds the slow start in force (it was set off before the impairment acted once)."""
    slow = make_fault(
        "slow_start", engine="engine-1", seconds=7.0, duration=30.0, point="step_begin", step=1
    )
    restart = make_fault("restart_engine", engine="engine-1", after={"fault": 0})
    base = SCENARIOS["no_failure"]
    scenario = dataclasses.replace(base, faults=(slow, restart))
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    fired = [e.t for e in result.history if isinstance(e, FaultInjected)]
    up = [e.t for e in result.history if isinstance(e, EngineStarted) and e.engine == "engine-1"]
    assert fired[0] == fired[1] and up[0] - fired[1] >= 7.0


def test_the_witness_fails_a_slow_start_that_never_came_up() -> None:
    """Judged on a history alone: the same run cut before the start answered, with the
    start replaced by a later ask, fails; the unchanged run passes."""
    result = run_scenario(load_scenario_file(FILE), 0)
    history = list(result.history)
    assert fault_witness(History(history)) is None
    up = next(i for i, e in enumerate(history) if isinstance(e, EngineStarted) and e.t > 5)
    kept = [e for e in history[:up] if not isinstance(e, EngineStarted)]
    later = [e for e in history[up:] if not isinstance(e, EngineStarted)]
    verdict = fault_witness(History(kept + later))
    assert verdict is not None and "none of the 1 start(s)" in verdict.message


def test_liveness_allows_a_start_that_keeps_its_slow_pace() -> None:
    scenario = load_scenario_file(FILE)
    plain = dataclasses.replace(scenario, faults=(), liveness=Liveness(heal_step=3))
    slow = dataclasses.replace(scenario, liveness=Liveness(heal_step=3))
    assert slow.liveness_plan().seconds > plain.liveness_plan().seconds
    assert "slow start 5 s" in slow.liveness_plan().bound


@pytest.mark.parametrize(
    ("keys", "field", "fix"),
    [
        ({"seconds": 8.0, "duration": 60.0}, "engine", "engine id"),
        ({"engine": "engine-1", "duration": 60.0}, "seconds", "to each start"),
        ({"engine": "engine-1", "seconds": 0.0, "duration": 60.0}, "seconds", "seconds > 0"),
        ({"engine": "engine-1", "seconds": 8.0}, "duration", "how many seconds"),
    ],
)
def test_bad_keys_name_the_field_and_the_fix(keys: dict, field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_fault("slow_start", point="step_begin", step=1, **keys)
    assert f"slow_start).{field}" in str(error.value) and fix in str(error.value)


def test_a_slow_start_cannot_strike_inside_a_call() -> None:
    with pytest.raises(ConfigError, match="slow_start cannot strike at after_bucket"):
        make_fault(
            "slow_start",
            engine="engine-1",
            seconds=8.0,
            duration=9.0,
            point="after_bucket",
            bucket=0,
        )


def test_the_swarm_draws_slow_starts_that_set_off_their_kill() -> None:
    drawn: list[Scenario] = []
    for seed in range(400):
        scenario = swarm_scenario(seed)
        if any(f.kind is FaultKind.SLOW_START for f in scenario.faults):
            drawn.append(scenario)
    assert len(drawn) >= 5
    for scenario in drawn:
        for i, fault in enumerate(scenario.faults):
            if fault.kind is FaultKind.SLOW_START:  # the fault right after it refers to it
                follower = next(f for f in scenario.faults if getattr(f.when, "fault", None) == i)
                assert follower.kind in (FaultKind.KILL_ENGINE, FaultKind.RESTART_ENGINE)
                assert follower.engine == fault.engine
