"""The Runtime protocol over SimPy: coroutines run in virtual time.

Each spawned coroutine is stepped by a SimPy process (the asimpy pattern):
every awaitable this runtime hands out yields a SimPy event from its
``__await__``; the process yields that event to SimPy and sends the event's
value (or throws its exception) back into the coroutine.

Determinism: the environment breaks ties between events scheduled for the
same instant and priority with a random key drawn from the root seed, not by
insertion order, so a schedule that only works in one interleaving of
simultaneous events fails for some seed instead of passing by accident. Every
named RNG stream is derived from (root seed, name) with sha256, so streams are
independent of each other and of PYTHONHASHSEED.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Coroutine, Generator, Sequence
from heapq import heappush
from typing import Any, TypeVar

import simpy
from simpy.core import EventPriority, SimTime
from simpy.events import NORMAL, Event

from miles_core.runtime import Cancelled

T = TypeVar("T")


def derive_seed(root: int, stream: str) -> int:
    """A 64-bit seed for ``stream``, stable across processes and Python versions."""
    digest = hashlib.sha256(f"{root}:{stream}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class Livelock(RuntimeError):
    """Virtual time stopped advancing: events keep firing at one instant."""


class SeededEnvironment(simpy.Environment):
    """A SimPy environment whose simultaneous events are ordered by the seed.

    It also refuses to process more than ``max_events_per_instant`` events at one
    virtual instant: a zero-delay retry loop would otherwise spin forever.
    """

    def __init__(self, seed: int, max_events_per_instant: int = 200_000) -> None:
        super().__init__()
        self._tiebreak = random.Random(derive_seed(seed, "simpy.tiebreak"))
        self._limit = max_events_per_instant
        self._instant = -1.0
        self._at_instant = 0
        self.processed = 0
        """Events processed so far (the simulator's throughput is measured in these)."""

    def step(self) -> None:
        super().step()
        self.processed += 1
        if self._now != self._instant:
            self._instant, self._at_instant = self._now, 0
        else:
            self._at_instant += 1
            if self._at_instant > self._limit:
                raise Livelock(
                    f"livelock at t={self._now}: {self._limit} events without time advancing "
                    "(a zero-delay retry loop?)"
                )

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: SimTime = 0) -> None:
        key = (self._tiebreak.getrandbits(32), next(self._eid))
        heappush(self._queue, (self._now + delay, priority, key, event))


class _Wait:
    """Awaitable over one SimPy event."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.event)


class SimTask:
    """A coroutine driven by a SimPy process."""

    def __init__(self, env: simpy.Environment, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.name = name
        self._coro = coro
        self._cancel_reason: str | None = None
        self.process = env.process(self._drive())

    def _drive(self) -> Generator[Event, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                event = self._coro.throw(error) if error is not None else self._coro.send(value)
            except StopIteration as stop:
                return stop.value
            if not isinstance(event, Event):
                raise TypeError(
                    f"task {self.name!r} awaited {event!r}; orchestration code may await only "
                    "what the Runtime hands out"
                )
            try:
                value, error = (yield event), None
            except simpy.Interrupt as interrupt:
                value, error = None, Cancelled(str(interrupt.cause))
            except GeneratorExit:  # the run ended with this task still waiting
                self._coro.close()
                raise
            except Exception as failure:  # the awaited event failed: raise it in the task
                value, error = None, failure

    def done(self) -> bool:
        return self.process.triggered

    def cancel(self, reason: str) -> None:
        """Raise Cancelled(reason) inside the task at its current await (no-op when done)."""
        if not self.process.triggered and self.process.is_alive:
            self._cancel_reason = reason
            self.process.defused = True  # a cancelled task nobody awaits is not a crash
            self.process.interrupt(reason)

    def result(self) -> Any:
        if not self.process.processed and not self.process.triggered:
            raise RuntimeError(f"task {self.name!r} is still running")
        if not self.process.ok:
            raise self.process.value
        return self.process.value

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.process)


class SimSignal:
    def __init__(self, env: simpy.Environment, event: Event | None = None) -> None:
        self.event = env.event() if event is None else event

    def set(self, value: Any = None) -> None:
        if not self.event.triggered:
            self.event.succeed(value)

    def is_set(self) -> bool:
        return self.event.triggered

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.event)


def _awaited(waitables: Sequence[SimTask | SimSignal]) -> list[Event]:
    """The events behind ``waitables``, defused: the waiter receives the first failure;
    a later failure among them has been waited for too and must not crash the run."""
    events = [w.process if isinstance(w, SimTask) else w.event for w in waitables]
    for event in events:
        event.defused = True
    return events


class SimRuntime:
    """Runtime over a SeededEnvironment; ``run`` drives a root coroutine to completion."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.env = SeededEnvironment(seed)
        self._streams: dict[str, random.Random] = {}

    def now(self) -> float:
        return float(self.env.now)

    def sleep(self, seconds: float) -> _Wait:
        if seconds < 0:
            raise ValueError(f"sleep needs seconds >= 0, got {seconds}")
        return _Wait(self.env.timeout(seconds))

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> SimTask:
        return SimTask(self.env, coro, name)

    def signal(self) -> SimSignal:
        return SimSignal(self.env)

    def timer(self, seconds: float) -> SimSignal:
        if seconds < 0:
            raise ValueError(f"timer needs seconds >= 0, got {seconds}")
        return SimSignal(self.env, self.env.timeout(seconds))

    def wait_any(self, waitables: Sequence[SimTask | SimSignal]) -> _Index:
        events = _awaited(waitables)
        return _Index(self.env.any_of(events), events)

    def wait_all(self, waitables: Sequence[SimTask | SimSignal]) -> _Values:
        events = _awaited(waitables)
        return _Values(self.env.all_of(events), events)

    def rng(self, stream: str) -> random.Random:
        if stream not in self._streams:
            self._streams[stream] = random.Random(derive_seed(self.seed, stream))
        return self._streams[stream]

    def run(self, main: Coroutine[Any, Any, T], until: float | None = None) -> T:
        """Run ``main`` as a task until it finishes (or virtual time ``until``); give its result.

        Raises RuntimeError naming the blocked tasks when nothing is left to
        happen but ``main`` has not finished: a deadlock in virtual time.
        """
        task = self.spawn(main, "main")
        stop = (
            task.process
            if until is None
            else self.env.any_of([task.process, self.env.timeout(until)])
        )
        try:
            self.env.run(until=stop)
        except Livelock:
            raise
        except RuntimeError as error:
            if "No scheduled events left" in str(error) or not task.done():
                raise RuntimeError(
                    f"deadlock at t={self.env.now}: task 'main' is waiting but no event is "
                    "scheduled"
                ) from error
            raise
        if not task.done():
            raise TimeoutError(f"main did not finish by t={until}")
        return task.result()


class _Index:
    def __init__(self, condition: Event, events: list[Event]) -> None:
        self.condition, self.events = condition, events

    def __await__(self) -> Generator[Event, Any, int]:
        fired = yield self.condition
        return next(i for i, event in enumerate(self.events) if event in fired)


class _Values:
    def __init__(self, condition: Event, events: list[Event]) -> None:
        self.condition, self.events = condition, events

    def __await__(self) -> Generator[Event, Any, list[Any]]:
        fired = yield self.condition
        return [fired[event] for event in self.events]
