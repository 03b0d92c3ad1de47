"""A heartbeat round (``HeartbeatMonitor._round``): which cells answered in time, and one
wait per distinct reply (the simulator answers every healthy cell of a round with one)."""

from __future__ import annotations

from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

from miles_core.backend import CellFailure
from miles_core.loop.heartbeat import HeartbeatMonitor
from sim.runtime import SimRuntime


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
