"""The Runtime protocol: the only way orchestration code touches time and concurrency.

The fully-async loop, the weight-update sequence and healing are written once
as ``async def`` coroutines that await nothing but what a Runtime hands out.
The simulator implements it over SimPy virtual time (sim/world/runtime.py); the real
backends over asyncio and Ray. Nothing here imports either.

Rules the orchestration code keeps, so that both worlds run it identically:

- time comes from ``rt.now()`` and passes through ``await rt.sleep(dt)``;
- concurrency is ``rt.spawn(coro, name[, eager])``, joined with ``await task``,
  ``rt.wait_any`` or ``rt.wait_all``, or ``rt.gather`` of coroutines; a task is
  stopped with ``task.cancel``, which raises Cancelled inside it at its current await;
- waiting for a condition is a ``rt.signal()``, set once;
- randomness comes from named streams ``rt.rng(name)``, each derived from the
  run's root seed, so adding a stream never shifts another one's draws.
"""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, Protocol, TypeVar

from miles_core.waits import WaitGraph

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Cancelled(Exception):
    """Raised inside a task at its current await when the task is cancelled."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Rng(Protocol):
    """A seeded random stream (a ``random.Random`` satisfies it)."""

    def random(self) -> float: ...
    def uniform(self, a: float, b: float) -> float: ...
    def expovariate(self, lambd: float) -> float: ...
    def lognormvariate(self, mu: float, sigma: float) -> float: ...
    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int: ...
    def choice(self, seq: Sequence[T]) -> T: ...
    def shuffle(self, x: list[Any]) -> None: ...


class Task(Protocol[T_co]):
    """A spawned coroutine; awaiting it gives its result or raises its exception."""

    name: str

    def done(self) -> bool: ...
    def cancel(self, reason: str) -> None: ...
    def __await__(self) -> Any: ...


class Signal(Protocol):
    """A one-shot event: awaiting it waits until ``set`` and gives the value."""

    def set(self, value: Any = None) -> None: ...
    def is_set(self) -> bool: ...
    def __await__(self) -> Any: ...


class Runtime(Protocol):
    def now(self) -> float:
        """Seconds since the run started (virtual in the simulator)."""
        ...

    def sleep(self, seconds: float) -> Awaitable[None]: ...

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, eager: bool = False) -> Task[T]:
        """Run ``coro`` concurrently. ``eager``: the spawner awaits it straight away (or
        awaits nothing in between that it relies on), so the task may run its first step
        now, before spawn returns; the simulator does, which spares it the start event of
        each of thousands of short calls. A real runtime may start it later."""
        ...

    def signal(self) -> Signal: ...

    def timer(self, seconds: float) -> Signal:
        """A signal that sets itself after ``seconds`` (for timeouts in wait_any)."""
        ...

    def wait_any(self, waitables: Sequence[Task[Any] | Signal]) -> Awaitable[int]:
        """Wait until one of them is done or set; gives the index of the first."""
        ...

    def wait_all(self, waitables: Sequence[Task[Any] | Signal]) -> Awaitable[list[Any]]:
        """Wait for all of them; gives their values in order (the first failure raises)."""
        ...

    def gather(
        self, coros: Sequence[Coroutine[Any, Any, T]], names: Sequence[str], reason: str
    ) -> Awaitable[list[T]]:
        """Run every coroutine at once (task ``names[i]`` each); gives their results in order.
        The first failure raises, and the coroutines still running are cancelled with
        ``reason``, as ``miles_core.sync.join_all`` does. The simulator takes each one's
        first step at once and makes a task only of one that then waits: most control calls
        answer without waiting, and an update calls every engine six times."""
        ...

    def rng(self, stream: str) -> Rng:
        """The named random stream; the same name always gives the same stream object."""
        ...

    def waits(self) -> WaitGraph:
        """Every unfinished task of the run and what it awaits (the wait-for graph of a run
        that stalled; miles_core.waits)."""
        ...
