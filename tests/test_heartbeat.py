"""A heartbeat round (``HeartbeatMonitor._round``): which cells answered in time, and one
wait per distinct reply (the simulator answers every healthy cell of a round with one)."""

from __future__ import annotations

from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

import pytest

from miles_core.backend import CellFailure
from miles_core.loop.heartbeat import HeartbeatMonitor
from sim.world.runtime import SimRuntime


class _Cells:
    """Cells 0..n-1: the healthy ones answer after a second, with one shared wait or one
    each; a muted one never answers; a dead one refuses at once, as Ray does."""

    def __init__(
        self, rt: SimRuntime, muted: set[int], shared: bool, dead: frozenset[int] = frozenset()
    ) -> None:
        self.rt, self.muted, self.shared, self.dead = rt, muted, shared, dead
        self._reply: Any = None

    def cell(self, index: int) -> Any:
        return SimpleNamespace(heartbeat=lambda: self._heartbeat(index))

    def _heartbeat(self, index: int) -> Awaitable[None]:
        if index in self.dead:
            return self._refused(index)
        if index in self.muted:
            return self.rt.sleep(1e9)
        if not self.shared:
            return self.rt.sleep(1.0)
        if self._reply is None:
            self._reply = self.rt.sleep(1.0)
        return self._reply

    async def _refused(self, index: int) -> None:
        raise CellFailure(index, "dead: the heartbeat was refused")


def _round(
    cells: list[int], muted: set[int], shared: bool, dead: frozenset[int] = frozenset()
) -> tuple[list[bool], list[str], float]:
    """The round's answers, the tasks it spawned, and when it ended."""
    rt = SimRuntime(seed=0)
    spawned: list[str] = []
    spawn = rt.spawn

    def recording_spawn(coro: Any, name: str, eager: bool = False) -> Any:
        spawned.append(name)
        return spawn(coro, name, eager)

    rt.spawn = recording_spawn  # type: ignore[method-assign]
    monitor = HeartbeatMonitor.__new__(HeartbeatMonitor)  # only what _round reads
    cluster = _Cells(rt, muted, shared, dead)
    config = SimpleNamespace(heartbeat_timeout=5.0)
    monitor.ctx = SimpleNamespace(rt=rt, cluster=cluster, config=config)  # type: ignore[assignment]

    async def main() -> tuple[list[bool], float]:
        answered = await monitor._round(cells)
        return answered, rt.now()

    answered, ended = rt.run(main(), until=100.0)
    return answered, [n for n in spawned if n != "main"], ended


def test_cells_sharing_one_reply_are_waited_for_by_one_task() -> None:
    answered, spawned, ended = _round([0, 1, 2, 3, 4], muted={3}, shared=True)
    assert answered == [True, True, True, False, True]
    assert spawned == ["heartbeat-0", "heartbeat-3"]  # the shared reply, and the muted cell's
    assert ended == 5.0  # the muted cell held the round to its timeout


def test_distinct_replies_each_get_their_own_task_as_in_a_real_world() -> None:
    answered, spawned, ended = _round([0, 1, 2], muted=set(), shared=False)
    assert answered == [True, True, True]
    assert spawned == ["heartbeat-0", "heartbeat-1", "heartbeat-2"]
    assert ended == 1.0  # every cell answered: the round ends then, not at its timeout


def test_a_refused_heartbeat_is_a_miss_at_once_not_after_the_timeout() -> None:
    """A dead process's heartbeat is refused (Ray raises for a dead actor at once): the
    round counts it missed as soon as the others answered, as miles counts a raised check
    (``test_rpc_error_propagates_as_unhealthy``); it neither crashes the checker nor holds
    the round to its timeout."""
    answered, _, ended = _round([0, 1, 2], muted=set(), shared=True, dead=frozenset({1}))
    assert answered == [True, False, True]
    assert ended == 1.0


# --- when rounds go out: ``HeartbeatMonitor.run`` -------------------------------------------


def _round_times(
    first_wait: float, interval: float, until: float, pause: tuple[float, float] | None = None
) -> list[float]:
    """When each round of a 2-cell checker began (every cell answers at once), up to
    ``until``; paused from ``pause[0]`` to ``pause[1]`` when given (a reconfiguration:
    ``heartbeat_resumes`` goes up at its end)."""
    rt = SimRuntime(seed=0)
    ctx = SimpleNamespace(
        rt=rt,
        config=SimpleNamespace(heartbeat_failure_threshold=3, heartbeat_first_wait=first_wait),
        cells=SimpleNamespace(num_cells=2, alive=lambda: (0, 1)),
        heartbeats_paused=0,
        heartbeat_resumes=0,
        stopping=False,
    )
    monitor = HeartbeatMonitor.__new__(HeartbeatMonitor)  # only what run reads
    monitor.ctx = ctx  # type: ignore[assignment]
    began: list[float] = []

    async def answered(cells: list[int]) -> list[bool]:
        began.append(rt.now())
        return [True] * len(cells)

    monitor._round = answered  # type: ignore[method-assign]

    async def main() -> None:
        rt.spawn(monitor.run(interval), "heartbeat-monitor")
        if pause is not None:
            await rt.sleep(pause[0])
            ctx.heartbeats_paused += 1
            await rt.sleep(pause[1] - pause[0])
            ctx.heartbeats_paused -= 1
            ctx.heartbeat_resumes += 1
        await rt.sleep(until - rt.now())
        ctx.stopping = True

    rt.run(main(), until=until + 1.0)
    return [t for t in began if t <= until]


def test_without_a_first_wait_the_first_round_goes_out_at_once() -> None:
    """Ported from miles' tests/fast/utils/test_health_checker.py::
    test_check_fn_called_after_first_interval: with first_wait=0 the first check runs as
    soon as the checker starts, then one every interval (``SimpleHealthChecker._loop``
    sleeps first_wait, checks, then sleeps interval). It used to wait an interval first."""
    assert _round_times(first_wait=0.0, interval=10.0, until=25.0) == [0.0, 10.0, 20.0]


def test_a_first_wait_delays_the_first_round() -> None:
    """Ported from miles' test_first_wait_delays_first_check: first_wait=300, interval=10."""
    assert _round_times(first_wait=300.0, interval=10.0, until=325.0) == [300.0, 310.0, 320.0]


@pytest.mark.parametrize(
    ("first_wait", "pause", "expected"),
    [
        (100.0, (111.0, 112.0), [100.0, 110.0, 220.0, 230.0]),
        (0.0, (0.5, 12.0), [0.0, 20.0, 30.0]),
    ],
)
def test_after_a_resume_the_next_round_waits_the_first_wait(
    first_wait: float, pause: tuple[float, float], expected: list[float]
) -> None:
    """Modelled on miles' test_resume_triggers_first_wait_again: a pause and resume between
    rounds; the pending interval sleep ends first, then the first wait, then the round (with
    no first wait, at that tick). A round due while paused is skipped."""
    assert _round_times(first_wait, 10.0, expected[-1] + 5.0, pause) == expected
