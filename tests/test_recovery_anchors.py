"""The recovery-time rows (sim/timing/recovery_anchors.py, sim/timing/recovery_loops.py): each
loop's
closed form, the simulator's loops inside their closed forms at every phase, and the rows'
verdicts."""

from __future__ import annotations

import pytest

from miles_core.profile import MilesProfile
from sim.timing.recovery_anchors import predict_recovery
from sim.timing.recovery_loops import (
    HEARTBEAT_REFUSED,
    HEARTBEAT_UNANSWERED,
    MILES_RETRY,
    MONITOR_HUNG,
    MONITOR_KILLED,
    ROUTER_EVICTION,
    CheckerLoop,
    LoopCheck,
    RetryLoop,
    heartbeat_windows,
    loop_checks,
    monitor_windows,
    retry_window,
    today_killed_window,
)


@pytest.mark.parametrize(
    ("loop", "window"),
    [
        (ROUTER_EVICTION, (60.0, 90.0)),  # checks at phase, +30, +60: the third fails
        (HEARTBEAT_REFUSED, (20.0, 30.0)),
        (HEARTBEAT_UNANSWERED, (50.0, 60.0)),  # each miss waits its 10 s timeout
        (MONITOR_KILLED, (0.0, 30.0)),
        (MONITOR_HUNG, (30.0, 60.0)),
    ],
)
def test_a_checker_loops_window_from_miles_settings(loop: CheckerLoop, window: tuple) -> None:
    assert loop.window() == pytest.approx(window)


def test_the_retry_window_is_the_sleeps_and_the_failures() -> None:
    assert MILES_RETRY.window()[0] == pytest.approx(59 * 1.0 + 60 * 0.01)


def test_every_simulated_loop_lies_inside_its_closed_form_at_every_phase() -> None:
    """31f1ca9's rollout health monitor is checked under aug2026 (today has none: a killed
    engine waits for the mini FT controller's poll and resume delay, its own row here; today's
    hung engine has no closed form yet, see recovery_loops.today_killed_window)."""
    checks = loop_checks()
    assert len(checks) == 6
    for check in checks:
        assert check.inside, check
        low, high = check.closed_form
        spread = max(check.simulated) - min(check.simulated)
        # a third: the controller's polls keep the heartbeat's grid, so its window spreads
        # over the heartbeat's interval only, not over its own poll too
        assert spread >= (high - low) / 3, f"the phases did not spread over the interval: {check}"


def test_a_loop_with_other_settings_falls_outside_the_defaults_window() -> None:
    """The check can fail: a heartbeat condemning after 2 misses lands in its own window,
    which the default threshold's does not hold."""
    two = CheckerLoop(interval=10.0, check_seconds=0.0, threshold=2)
    simulated = heartbeat_windows(two)
    assert LoopCheck("2 misses", two.window(), simulated).inside
    assert not LoopCheck("2 misses", HEARTBEAT_REFUSED.window(), simulated).inside


def test_the_simulated_retry_gives_up_when_the_closed_form_says() -> None:
    assert retry_window() == pytest.approx(MILES_RETRY.window()[0], abs=0.1)
    short = RetryLoop(tries=10, interval=2.0, failure_seconds=0.5)
    assert retry_window(short) == pytest.approx(9 * 2.0 + 10 * 0.5, abs=0.1)


def test_the_rows_verdicts_and_the_miss_names_its_cause() -> None:
    rows = {r.row: r for r in predict_recovery()}
    assert rows["miles: a dead engine evicted from the router"].meets
    assert rows["miles: the generation retry gives up"].meets
    assert rows["miles: the heal waits suspended"].meets
    healthy = rows["miles: a killed cell still shows Healthy"]
    assert not healthy.meets
    assert "outside SimpleHealthChecker's loop" in healthy.cause
    assert all(r.cause == "" for r in rows.values() if r.meets)


def test_todays_killed_engine_waits_for_the_controllers_poll_and_delay() -> None:
    """Under today a killed engine's recovery is asked by the mini FT controller: its next
    poll (within 10 s) and the 10 s resume delay, not 31f1ca9's monitor round (0 to 30 s)."""
    assert today_killed_window() == pytest.approx((10.0, 20.0))
    simulated = monitor_windows(MONITOR_KILLED, MilesProfile.TODAY)
    assert LoopCheck("today", today_killed_window(), simulated).inside
    assert min(simulated) >= 10.0 - 0.5  # never before the resume delay
    aug = monitor_windows(MONITOR_KILLED)
    assert not LoopCheck("aug2026", today_killed_window(), aug).inside
