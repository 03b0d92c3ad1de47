"""miles_core's Runtime over asyncio: the same orchestration coroutines, in wall-clock time.

The simulator drives them in virtual time; here ``rt.now()`` is the event
loop's monotonic clock since the run began and ``rt.sleep`` really sleeps.
Awaiting a task or a signal is shielded, as in the simulator: cancelling the
waiter never cancels what it waits for (asyncio would otherwise propagate the
cancellation into a shared signal and wake every other waiter with an error).
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections.abc import Coroutine, Generator, Sequence
from typing import Any, TypeVar

from miles_core.runtime import Cancelled
from miles_core.scenario.seeds import derive_seed
from miles_core.sync import join_all
from miles_core.waits import TaskWait, WaitGraph, await_frames, describe_frames, graph_of, party_of

T = TypeVar("T")


class AioTask:
    def __init__(self, task: asyncio.Task[Any], name: str) -> None:
        self.name = name
        self.task = task
        task.add_done_callback(_consume)

    def done(self) -> bool:
        return self.task.done()

    def cancel(self, reason: str) -> None:
        self.task.cancel(reason)

    def __await__(self) -> Generator[Any, None, Any]:
        # a generator of its own (not the coroutine's wrapper, which hides its frames): the
        # wait-for graph finds the awaited task in this frame
        return (yield from _result(self.task).__await__())


class AioSignal:
    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def set(self, value: Any = None) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def is_set(self) -> bool:
        return self.future.done()

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.shield(self.future).__await__()


def _consume(task: asyncio.Task[Any]) -> None:
    """A failure nobody awaits is not logged as 'never retrieved': the history records it."""
    if not task.cancelled():
        task.exception()


async def _result(task: asyncio.Task[Any]) -> Any:
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.cancelled():  # the awaited task was cancelled, not the waiter
            raise Cancelled(f"task {task.get_name()} was cancelled") from None
        raise


def _future(w: AioTask | AioSignal) -> asyncio.Future[Any]:
    return w.task if isinstance(w, AioTask) else w.future


class AsyncioRuntime:
    """Runtime for one run on the running event loop; seeded streams as in the simulator."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._streams: dict[str, random.Random] = {}
        self._spawned: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()
        """The tasks of this run (the wait-for graph's), not the loop's others."""

    def now(self) -> float:
        return self._loop.time() - self._started

    async def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"sleep needs seconds >= 0, got {seconds}")
        await asyncio.sleep(seconds)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, eager: bool = False) -> AioTask:
        """``eager`` is allowed, not required (asyncio's eager tasks came in Python 3.12):
        the task starts at the loop's next turn either way."""
        task = self._loop.create_task(coro, name=name)
        self._spawned.add(task)
        return AioTask(task, name)

    def signal(self) -> AioSignal:
        return AioSignal(self._loop.create_future())

    def timer(self, seconds: float) -> AioSignal:
        if seconds < 0:
            raise ValueError(f"timer needs seconds >= 0, got {seconds}")
        signal = self.signal()
        self._loop.call_later(seconds, signal.set)
        return signal

    async def wait_any(self, waitables: Sequence[AioTask | AioSignal]) -> int:
        futures = [_future(w) for w in waitables]
        await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
        return next(i for i, f in enumerate(futures) if f.done())

    async def wait_all(self, waitables: Sequence[AioTask | AioSignal]) -> list[Any]:
        futures = [_future(w) for w in waitables]
        if futures:
            await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
        for w, f in zip(waitables, futures, strict=True):  # the first failure raises
            if f.done() and (f.cancelled() or f.exception() is not None):
                return [await w]  # raises, through the same path as awaiting it alone
        return [f.result() for f in futures]

    async def gather(
        self, coros: Sequence[Coroutine[Any, Any, T]], names: Sequence[str], reason: str
    ) -> list[Any]:
        """A task for each coroutine, joined: asyncio may not step a coroutine outside its
        own task (a timeout inside it would cancel the caller's)."""
        tasks = [self.spawn(coro, name) for coro, name in zip(coros, names, strict=True)]
        return await join_all(self, tasks, reason)

    def rng(self, stream: str) -> random.Random:
        if stream not in self._streams:
            self._streams[stream] = random.Random(derive_seed(self.seed, stream))
        return self._streams[stream]

    def waits(self) -> WaitGraph:
        """Every task of the control plane on this loop that has not finished and what it
        awaits (the wait-for graph of a stalled or interrupted run). asyncio keeps no time
        of when a task began its wait, so ``since`` is left unknown here."""
        tasks = [t for t in self._spawned if not t.done()]
        names = {id(t): t.get_name() for t in tasks}
        out = []
        for task in tasks:
            frames = await_frames(task.get_coro())
            where = describe_frames(frames)
            on = _awaited_tasks(frames, names)
            awaits = ", ".join(f"task '{n}'" for n in on) or _innermost(task)
            out.append(TaskWait(task.get_name(), where, awaits, on, party_of(frames)))
        return graph_of(out)


def _awaited_tasks(frames: Sequence[Any], names: dict[int, str]) -> tuple[str, ...]:
    """The tasks the innermost frames hold to await (a task, or a list of them)."""
    found: list[str] = []
    for frame in reversed(frames[-3:]):
        for value in frame.f_locals.values():
            items = value if isinstance(value, list | tuple) else (value,)
            for item in items:
                inner = getattr(item, "task", item)  # an AioTask holds its asyncio task
                name = names.get(id(inner))
                if name is not None and name not in found:
                    found.append(name)
        if found:
            break
    return tuple(found)


def _innermost(task: asyncio.Task[Any]) -> str:
    """What asyncio says the task is blocked on (a future, a Ray call's, an HTTP reply's)."""
    waiter = getattr(task, "_fut_waiter", None)
    return "a future" if waiter is None else type(waiter).__name__
