"""Waiting for conditions with nothing but a Runtime: the condition-variable pattern.

A coroutine checks its predicate and, if it does not hold, awaits
``notifier.wait()``; whoever changes the state calls ``notify()``. Between the
check and the await there is no await, so no wake-up can be missed under
cooperative scheduling (SimPy or asyncio alike).
"""

from __future__ import annotations

from miles_core.runtime import Runtime, Signal


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

    def __init__(self, rt: Runtime) -> None:
        self._held = False
        self._released = Notifier(rt)

    async def acquire(self) -> None:
        while self._held:
            await self._released.wait()
        self._held = True

    def release(self) -> None:
        self._held = False
        self._released.notify()
