"""When the engine health monitor checks (``EngineHealthMonitor.run``), against miles'
``RolloutHealthMonitor._health_monitor_loop`` (miles/utils/health_monitor.py): while
paused it looks for its resume every 0.5 s; after each resume (and at the start) it waits
the first wait, checks every engine, then waits an interval. So with a first wait of 0 the
check goes out at once, and after a resume within 0.5 s of it, not at the next interval.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from miles_core.engines import EngineState
from miles_core.loop.health import EngineHealthMonitor
from sim.world.runtime import SimRuntime


def _check_times(
    first_wait: float, interval: float, until: float, pause: tuple[float, float] | None = None
) -> list[float]:
    """When a one-engine monitor checked, up to ``until``; paused (an update) from
    ``pause[0]`` to ``pause[1]`` when given. Checks answer at once."""
    rt = SimRuntime(seed=0)
    ctx = SimpleNamespace(
        rt=rt,
        config=SimpleNamespace(
            today=False,  # 31f1ca9's monitor (aug2026); today's: scenarios/test_miles_health.py
            rollout_health_check_first_wait=first_wait,
            rollout_health_check_interval=interval,
        ),
        engines=SimpleNamespace(ids=("engine-0",), state=lambda engine: EngineState.SERVING),
        monitor_paused=0,
        stopping=False,
    )
    monitor = EngineHealthMonitor.__new__(EngineHealthMonitor)  # only what run reads
    monitor.ctx = ctx  # type: ignore[assignment]
    checked: list[float] = []

    async def check(engine: str) -> None:
        checked.append(rt.now())

    monitor._check = check  # type: ignore[method-assign]

    async def main() -> None:
        begin, end = pause if pause is not None else (until, until)
        if not begin:
            ctx.monitor_paused += 1  # paused before it starts
        rt.spawn(monitor.run(), "engine-health-monitor")
        if begin:
            await rt.sleep(begin)
            ctx.monitor_paused += 1
        await rt.sleep(end - begin)
        ctx.monitor_paused -= 1
        await rt.sleep(until - rt.now())
        ctx.stopping = True

    rt.run(main(), until=until + 1.0)
    return [t for t in checked if t <= until]


def test_without_a_first_wait_the_first_check_goes_out_at_once() -> None:
    """As miles' test_health_checker.py::test_check_fn_called_after_first_interval (the same
    order of first wait, check, interval)."""
    assert _check_times(first_wait=0.0, interval=10.0, until=25.0) == [0.0, 10.0, 20.0]


def test_a_first_wait_delays_the_first_check() -> None:
    """As miles' test_first_wait_delays_first_check: first_wait=300, interval=10."""
    assert _check_times(first_wait=300.0, interval=10.0, until=325.0) == [300.0, 310.0, 320.0]


@pytest.mark.parametrize(
    ("first_wait", "pause", "expected"),
    [
        # started paused (miles starts its monitor paused and resumes it when the engines
        # are onloaded): the first check comes at the first 0.5-s look after the resume
        (0.0, (0.0, 12.2), [12.5, 22.5, 32.5]),
        # paused across the tick at 20: found paused there, resumed at 23.2, checked at 23.5
        (0.0, (10.5, 23.2), [0.0, 10.0, 23.5, 33.5]),
        # the same with a first wait of 5 after the start and after the resume
        (5.0, (16.0, 33.2), [5.0, 15.0, 38.5, 48.5]),
    ],
)
def test_after_a_resume_the_check_follows_the_first_wait_not_the_next_interval(
    first_wait: float, pause: tuple[float, float], expected: list[float]
) -> None:
    """Modelled on miles' test_resume_triggers_first_wait_again, for the loop of
    ``RolloutHealthMonitor._health_monitor_loop``. The check used to wait for the monitor's
    next interval tick after the resume (20.0, 30.0 and 40.0 in the three cases)."""
    assert _check_times(first_wait, 10.0, expected[-1] + 5.0, pause) == expected
