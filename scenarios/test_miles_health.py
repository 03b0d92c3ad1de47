"""Issue 50 item 4: the rollout side's health as miles now runs it (the today profile), and as
31f1ca9 ran it (aug2026), on scenarios/files/mini_ft_heals_a_hung_engine.toml.

Today (docs/miles-today-reading.md section 4): the checker (miles_core/loop/rollout_health.py,
miles' ``SimpleHealthChecker``) only publishes a status, unhealthy after
--rollout-health-check-failure-threshold failed checks (1); the mini FT controller
(miles_core/loop/rollout_cell_controller.py, miles' ``_MiniFTController``), on by default with
--use-fault-tolerance, suspends the engine at its next poll, resumes it resume_delay later,
and backs off min(5 x 2^n, 300) s after a failed heal. aug2026: the health monitor replaces
the engine at the failed check itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from miles_core.engines import EngineState
from miles_core.events import (
    EngineExited,
    EngineHealthChanged,
    EngineHealthFailed,
    EngineRecoveryAsked,
    EngineStarted,
    EngineStateChanged,
    EngineSuspended,
)
from miles_core.kinds import EngineHealth, RunStatus
from miles_core.loop.config import LoopConfig
from miles_core.profile import MilesProfile
from miles_core.scenario import Scenario, load_scenario_file
from sim.run import SimResult, run_scenario
from sim.world.cluster import SimCluster

FILE = Path(__file__).resolve().parent / "files" / "mini_ft_heals_a_hung_engine.toml"
TODAY, AUG2026 = MilesProfile.TODAY, MilesProfile.AUG2026


def scenario(profile: MilesProfile = TODAY, **loop: Any) -> Scenario:
    base = load_scenario_file(FILE)
    changed = dataclasses.replace(base.loop, miles_profile=profile, **loop)
    return dataclasses.replace(base, loop=changed)


def run(profile: MilesProfile = TODAY, **loop: Any) -> SimResult:
    result = run_scenario(scenario(profile, **loop), 0)
    assert result.ok, result.failures()
    assert result.report.status is RunStatus.COMPLETED
    return result


def of(result: SimResult, kind: type, engine: str = "engine-0") -> list[Any]:
    return [e for e in result.history if isinstance(e, kind) and e.engine == engine]


def _became(result: SimResult, status: EngineHealth) -> list[EngineHealthChanged]:
    return [e for e in of(result, EngineHealthChanged) if e.status is status]


def test_today_the_checker_only_publishes_and_the_controller_suspends_at_its_poll() -> None:
    result = run()
    loop = result.scenario.loop
    poll, delay = loop.mini_ft_controller_poll_interval, loop.mini_ft_controller_resume_delay
    failed = of(result, EngineHealthFailed)
    unhealthy = _became(result, EngineHealth.UNHEALTHY)
    # unhealthy after one failed check (the threshold's default, 1), at that check
    assert len(unhealthy) == 1 and unhealthy[0].failures == 1
    assert unhealthy[0].t == failed[0].t and unhealthy[0].incarnation == 0
    # the checker acted on nothing: the engine left rotation only at the controller's suspend
    [suspended] = of(result, EngineSuspended)
    down = [e for e in of(result, EngineStateChanged) if e.new is EngineState.DOWN]
    assert down[0].t == suspended.t and "suspended by the FT controller" in down[0].reason
    # at the controller's first poll (every poll seconds from 0) after the status was set
    assert unhealthy[0].t <= suspended.t < unhealthy[0].t + poll
    assert suspended.t / poll == pytest.approx(round(suspended.t / poll))
    assert suspended.incarnation == 0 and "1 failed health check" in suspended.reason
    # resumed resume_delay later: a new process, which serves after the next update
    [resumed] = of(result, EngineRecoveryAsked)
    assert resumed.t == pytest.approx(suspended.t + delay)
    [started] = of(result, EngineStarted)
    assert started.incarnation == 1 and started.t >= resumed.t
    serving = [e for e in of(result, EngineStateChanged) if e.new is EngineState.SERVING]
    assert serving and serving[0].incarnation == 1 and serving[0].t >= started.t
    assert "update" in serving[0].reason
    assert not of(result, EngineSuspended, "engine-1")  # the healthy engine is left alone


def test_aug2026_the_monitor_replaces_the_hung_engine_at_the_failed_check() -> None:
    result = run(AUG2026)
    [failed] = of(result, EngineHealthFailed)
    [asked] = of(result, EngineRecoveryAsked)
    assert asked.t == failed.t and "health check" in asked.reason
    assert not of(result, EngineSuspended) and not of(result, EngineHealthChanged)


def test_the_failure_threshold_counts_failed_checks_in_a_row() -> None:
    """Two failures in a row, checked every 0.5 s so that both come before the next update
    (which pauses the checker: a hang that an update finds is given up by the update's own
    deadline, --update-weight-engine-request-timeout)."""
    result = run(rollout_health_check_failure_threshold=2, rollout_health_check_interval=0.5)
    failed = of(result, EngineHealthFailed)
    [unhealthy] = _became(result, EngineHealth.UNHEALTHY)
    assert unhealthy.failures == 2
    assert len([f for f in failed if f.t <= unhealthy.t]) == 2 and failed[1].t == unhealthy.t
    assert of(result, EngineSuspended)[0].t >= unhealthy.t  # not after the first failure


def test_miles_default_poll_and_resume_delay() -> None:
    """miles' defaults (fault_tolerance.py 3c07fcdd): poll 10 s, resume delay 10 s."""
    result = run(mini_ft_controller_poll_interval=10.0, mini_ft_controller_resume_delay=10.0)
    [suspended] = of(result, EngineSuspended)
    [resumed] = of(result, EngineRecoveryAsked)
    assert suspended.t / 10.0 == pytest.approx(round(suspended.t / 10.0))
    assert resumed.t == pytest.approx(suspended.t + 10.0)


def test_a_resumed_process_that_dies_starting_backs_off_as_miles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """miles' ``_heal``: a failed heal waits 5 x 2^failures s (10, then 20) before the next;
    here a heal fails when the process it resumed dies while starting."""
    deaths = 2
    original = SimCluster._start_engine

    def start(self: SimCluster, engine_id: str) -> None:
        nonlocal deaths
        if deaths and engine_id == "engine-0":
            deaths -= 1
            engine = self.engines[engine_id]
            incarnation = engine.start()
            engine.kill()
            assert self.observer is not None
            self.observer.engine_exited(engine_id, incarnation, "died while starting")
            return
        original(self, engine_id)

    monkeypatch.setattr(SimCluster, "_start_engine", start)
    result = run()
    poll = result.scenario.loop.mini_ft_controller_poll_interval
    suspends = [e.t for e in of(result, EngineSuspended)]
    died = [e.t for e in of(result, EngineExited) if e.how == "died while starting"]
    assert len(suspends) == 3 and len(died) == 2, (suspends, died)
    for death, again, backoff in zip(died, suspends[1:], (10.0, 20.0), strict=True):
        assert death + backoff <= again < death + backoff + poll, (died, suspends)
    assert of(result, EngineSuspended)[1].reason == "down"
    assert [e.incarnation for e in of(result, EngineStarted)] == [3]


def test_explicitly_off_nothing_heals_the_engine_today() -> None:
    """--no-mini-ft-controller-enable with fault tolerance, today: the checker publishes the
    engine unhealthy and nothing restarts it (no other code restarts an engine)."""
    off = scenario(mini_ft_controller_enable=False)
    result = run_scenario(dataclasses.replace(off, until_witnessed=None), 0)  # none would come
    assert result.ok, result.failures()
    assert _became(result, EngineHealth.UNHEALTHY)
    assert not of(result, EngineSuspended) and not of(result, EngineRecoveryAsked)
    assert not of(result, EngineStarted)


def test_the_controller_resolves_on_with_fault_tolerance_today_only() -> None:
    on = LoopConfig(steps=1, use_fault_tolerance=True)
    assert on.mini_ft_controller_enable is None and on.mini_ft_controller_on
    assert not LoopConfig(steps=1).mini_ft_controller_on  # without fault tolerance
    assert not dataclasses.replace(on, miles_profile=AUG2026).mini_ft_controller_on
    assert not dataclasses.replace(on, mini_ft_controller_enable=False).mini_ft_controller_on
    explicit = LoopConfig(steps=1, miles_profile=AUG2026, mini_ft_controller_enable=True)
    assert explicit.mini_ft_controller_on
    # miles' rollout check defaults (3c07fcdd) and the trainer heartbeat threshold (3)
    assert on.rollout_health_check_failure_threshold == 1
    assert (on.rollout_health_check_interval, on.rollout_health_check_timeout) == (30.0, 30.0)
    assert on.heartbeat_failure_threshold == 3
