"""Waiting for conditions with nothing but a Runtime: the condition-variable pattern.

A coroutine checks its predicate and, if it does not hold, awaits
``notifier.wait()``; whoever changes the state calls ``notify()``. Between the
check and the await there is no await, so no wake-up can be missed under
cooperative scheduling (SimPy or asyncio alike).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miles_core.runtime import Runtime, Signal, Task


class Notifier:
    """Wakes every coroutine waiting at the time of ``notify``."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._signal = rt.signal()

    def wait(self) -> Signal:
        return self._signal

    def notify(self) -> None:
        signal, self._signal = self._signal, self._rt.signal()
        signal.set()


class Lock:
    """Mutual exclusion between coroutines (weight updates and engine syncs)."""

    def __init__(self, rt: Runtime, name: str = "a lock") -> None:
        self._rt = rt
        self.name = name
        self._held = False
        self._holder = ""
        self._since = 0.0
        self._released = Notifier(rt)

    async def acquire(self, holder: str = "") -> None:
        """``holder``: who takes it, for the wait-for graph of a run that stalls on it."""
        while self._held:
            await self._released.wait()
        self._held, self._holder, self._since = True, holder, self._rt.now()

    def release(self) -> None:
        self._held = False
        self._released.notify()

    def wait_party(self) -> str:
        """How the wait-for graph names what a task blocked in ``acquire`` waits on."""
        if not self._held:
            return f"{self.name} (free)"
        return f"{self.name}, held by {self._holder or '?'} since t={self._since:.6g}"


async def join_all(rt: Runtime, tasks: Sequence[Task[Any]], reason: str) -> list[Any]:
    """Every task's result, in order (``rt.wait_all``). If the wait ends in an exception (the
    waiter was cancelled because the run ended, or a task crashed), the tasks still running
    are cancelled: none outlives its waiter to record on, or act for, a run that has ended
    (a group's samples did: SampleGenerated after RunEnded). Any exception, not only
    Cancelled: asyncio cancels with its own CancelledError."""
    try:
        return await rt.wait_all(tasks)
    except BaseException:
        for task in tasks:
            task.cancel(reason)  # a no-op for those that ended
        raise
