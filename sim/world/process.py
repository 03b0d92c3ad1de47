"""A simulated component's processes, shared by cells and engines: a kill interrupts their
work in progress at once, and a start replaces them (a new incarnation)."""

from __future__ import annotations

from collections.abc import Awaitable

from sim.world.runtime import SimRuntime, SimSignal


class Mortal:
    """Shared by cells and engines: processes that a kill interrupts and a start replaces."""

    def __init__(self, rt: SimRuntime, name: str) -> None:
        self.rt = rt
        self.name = name
        self.dead = False
        self.incarnation = 0
        self._death: SimSignal = rt.signal()

    def wait_party(self) -> str:
        """How the wait-for graph names this component when a task waits on it."""
        state = "dead" if self.dead else "hung" if getattr(self, "hung", False) else "alive"
        unanswered = sorted(getattr(self, "unanswered", ()))
        if unanswered and not self.dead:
            state += f", {', '.join(unanswered)} unanswered"
        return f"{self.name} process {self.incarnation} ({state})"

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            self._death.set()

    def start(self) -> int:
        """New processes (killing the old ones first): the new incarnation."""
        self.kill()
        self.incarnation += 1
        self.dead = False
        self._death = self.rt.signal()
        return self.incarnation

    def work(
        self, seconds: float, *interrupts: SimSignal, death: SimSignal | None = None
    ) -> Awaitable[int]:
        """Take ``seconds``; 0 when done, 1 when killed, 2+i when interrupts[i] fired.

        ``death``: the death of the process the work belongs to (default: the current one),
        so that work of a replaced process ends with it. The wait itself is returned (no
        coroutine around it: every request and every send makes one)."""
        return self.rt.timer_or(seconds, (self._death if death is None else death, *interrupts))
