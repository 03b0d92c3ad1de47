"""The Runtime protocol over SimPy: coroutines run in virtual time.

Each spawned coroutine is stepped by SimPy event callbacks (the asimpy
pattern): every awaitable this runtime hands out yields a SimPy event from its
``__await__``; the task registers itself as a callback of that event and, when
SimPy processes it, sends the event's value (or throws its exception) back into
the coroutine.

A task is scheduled exactly as a ``simpy.Process`` would be: an urgent start
event, one completion event, an urgent interruption event per cancel; a
wait_any/wait_all is scheduled exactly as SimPy's AnyOf/AllOf. The SimPy events
are the same, in the same order, so a run is event for event the run that
SimPy's own Process and Condition classes would give; only the Python plumbing
around them is thinner (a task is a callback, not a generator driving a
generator, and a condition does not build a ConditionValue nobody reads).

Determinism: the environment breaks ties between events scheduled for the
same instant and priority with a pseudo-random key drawn from the root seed, not by
insertion order, so a schedule that only works in one interleaving of
simultaneous events fails for some seed instead of passing by accident. The key
depends on the instant and on how many events were scheduled for it before, not
on events for other instants: one more fault at time t leaves the run before t
as it was. Every
named RNG stream is derived from (root seed, name) with sha256, so streams are
independent of each other and of PYTHONHASHSEED.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Coroutine, Generator, Sequence
from heapq import heappop, heappush
from inspect import iscoroutine
from typing import Any, TypeVar

import simpy
from simpy.core import EmptySchedule, EventPriority, SimTime, StopSimulation
from simpy.events import NORMAL, PENDING, URGENT, Event, Timeout
from simpy.exceptions import Interrupt

from miles_core.runtime import Cancelled
from miles_core.scenario.seeds import derive_seed
from miles_core.sync import join_all
from miles_core.waits import TaskWait, WaitGraph, await_frames, describe_frames, graph_of, party_of

T = TypeVar("T")


class Livelock(RuntimeError):
    """Virtual time stopped advancing: events keep firing at one instant."""


class Deadlock(RuntimeError):
    """Nothing is scheduled, yet the main task has not finished: everything waits."""


class RunInterrupted(BaseException):
    """The run was asked to stop from outside (``SimRuntime.interrupt_soon``: Ctrl-C), and
    stopped between two events. Not an Exception: no task takes it for its own failure."""


def _interrupted(event: Event) -> None:
    raise RunInterrupted("interrupted between two events")


def _copy(error: BaseException) -> BaseException:
    """A fresh copy of a failure for one receiver (SimPy's rule: tracebacks stay apart).

    An exception that cannot be rebuilt from its args is passed on as it is."""
    try:
        copy = type(error)(*error.args)
    except Exception:
        return error
    copy.__cause__ = error
    return copy


class SeededEnvironment(simpy.Environment):
    """A SimPy environment whose simultaneous events are ordered by the seed.

    It also refuses to process more than ``max_events_per_instant`` events at one
    virtual instant: a zero-delay retry loop would otherwise spin forever.

    Queue entries are flat ``(time, priority, tiebreak, eid, event)`` tuples: the
    same order as SimPy's ``(time, priority, (tiebreak, eid), event)`` without a
    nested tuple per event. The hottest producers of events (task starts and ends,
    sleeps, signals, conditions) push that same entry themselves rather than call
    ``schedule``: the entries, and so the order and every tie, are the same.
    """

    def __init__(self, seed: int, max_events_per_instant: int = 200_000) -> None:
        super().__init__()
        self._salt = derive_seed(seed, "simpy.tiebreak")
        self._ties: dict[SimTime, int] = {}
        """later time -> events scheduled for it so far (see ``_tie``)."""
        self._ties_now = 0
        """Events scheduled for the current instant so far (most are: ``_tie_now``)."""
        self._limit = max_events_per_instant
        self._instant = -1.0
        self._at_instant = 0
        self._active_task: SimTask | None = None
        self.processed = 0
        """Events processed so far (the simulator's throughput is measured in these)."""

    def step(self) -> None:
        """One event: SimPy's step, with the event count and the livelock guard."""
        self._process(1)

    def run(self, until: SimTime | Event | None = None) -> Any:
        """SimPy's ``run``, whose loop processes events without a method call per event.

        A run processes millions of events; SimPy's loop calls ``step`` for each,
        and that call alone was a tenth of a large run's time. The order, the
        count and the guards are ``step``'s.
        """
        if until is not None and not isinstance(until, Event):
            return super().run(until)  # a time: SimPy's own path (it steps through ours)
        if until is not None:
            if until.callbacks is None:
                return until.value
            until.callbacks.append(StopSimulation.callback)
        try:
            self._process(-1)
        except StopSimulation as stop:
            return stop.args[0]
        except EmptySchedule:
            if until is not None:
                raise RuntimeError(
                    f'No scheduled events left but "until" event was not triggered: {until}'
                ) from None
        return None

    def _process(self, count: int) -> None:
        """Process ``count`` events (-1: until something raises)."""
        queue, limit = self._queue, self._limit
        instant, at, processed = self._instant, self._at_instant, self.processed
        try:
            while count:
                count -= 1
                try:
                    now, _, _, _, event = heappop(queue)
                except IndexError:
                    raise EmptySchedule from None
                if now != self._now:  # the count for the new instant, kept while it was later
                    self._ties_now = self._ties.pop(now, 0)
                self._now = now
                callbacks, event.callbacks = event.callbacks, None
                try:
                    for callback in callbacks:
                        callback(event)
                except StopSimulation:
                    event.callbacks = callbacks[callbacks.index(callback) + 1 :]
                    self.schedule(event, EventPriority(-1))
                    raise
                if not event._ok and not hasattr(event, "_defused"):
                    raise _copy(event._value)  # a failure nobody waited for crashes the run
                processed += 1
                if now != instant:
                    instant, at = now, 0
                else:
                    at += 1
                    if at > limit:
                        raise Livelock(
                            f"livelock at t={now}: {limit} events without time advancing "
                            "(a zero-delay retry loop?)"
                        )
        finally:
            self._instant, self._at_instant, self.processed = instant, at, processed

    def _tie(self, at: SimTime) -> int:
        """The tie-break of the next event scheduled for time ``at``: drawn from the seed, the
        time and how many events were scheduled for that time before it. So events for
        other times never shift it: a fault added at time t leaves every tie before t as it
        was (one stream for all events did: one more timer drawn at the start changed the
        order of every simultaneous event after it)."""
        if at == self._now:
            return self._tie_now()
        ties = self._ties
        n = ties.get(at, 0)
        ties[at] = n + 1
        return hash((self._salt, at, n))

    def _tie_now(self) -> int:
        """``_tie`` for the current instant, without the dict: most events are for now."""
        n = self._ties_now
        self._ties_now = n + 1
        return hash((self._salt, self._now, n))

    def schedule(self, event: Event, priority: EventPriority = NORMAL, delay: SimTime = 0) -> None:
        at = self._now + delay
        heappush(self._queue, (at, priority, self._tie(at), next(self._eid), event))


class _Sleep(Timeout):
    """A SimPy timeout that can be awaited directly.

    Built without Timeout's and the scheduler's calls (the delay is checked by
    whoever hands one out): a run makes hundreds of thousands. The queue entry
    is ``SeededEnvironment.schedule``'s.
    """

    def __init__(self, env: SeededEnvironment, delay: SimTime) -> None:
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        at = env._now + delay
        heappush(env._queue, (at, NORMAL, env._tie(at), next(env._eid), self))

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self)


_STARTED = Event.__new__(Event)
"""What an eager task's first step is sent: an event processed already, with no value."""
_STARTED.callbacks, _STARTED._ok, _STARTED._value = None, True, None


class SimTask:
    """A coroutine stepped by the callbacks of the events it awaits.

    ``event`` is its completion: it succeeds with the coroutine's return value or
    fails with its exception, scheduled as a ``simpy.Process`` schedules itself.
    """

    __slots__ = ("_coro", "_env", "_in_spawn", "_since", "_started", "_target", "event", "name")

    def __init__(
        self, env: SeededEnvironment, coro: Coroutine[Any, Any, Any], name: str, eager: bool
    ) -> None:
        self.name = name
        self._coro = coro
        self._env = env
        self._started = False
        self._since = env._now
        """When it began its current wait (the wait-for graph's "since")."""
        self.event = done = Event.__new__(Event)  # Event(env), without the call
        done.env, done.callbacks = env, []
        self._in_spawn = eager
        if eager:  # its first step now, inside the spawner: no start event
            self._target = _STARTED
            self._step(_STARTED)
            self._in_spawn = False
        else:  # SimPy's Initialize: urgent, so a cancel cannot overtake it
            self._target = start = Event.__new__(Event)
            start.env, start.callbacks, start._ok, start._value = env, [self._step], True, None
            heappush(env._queue, (env._now, URGENT, env._tie_now(), next(env._eid), start))

    def _step(self, event: Event) -> None:
        """Send the event's outcome into the coroutine; run it to its next real wait."""
        env, coro = self._env, self._coro
        outer, env._active_task = env._active_task, self  # an eager spawn or a finish nests
        self._started = True
        while True:
            error: BaseException | None = None
            if not event._ok:
                error = _thrown(event)
                if not isinstance(error, Exception):  # a stop (OracleStop, Ctrl-C): the task
                    self._finish(False, error)  # ends with it, outside the try below: passing
                    break  # it on raises again when nobody awaits this task, and that must
                    # leave this step, not finish the task a second time
            try:
                target = coro.send(event._value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self._finish(True, stop.value)
                break
            except BaseException as error:
                self._finish(False, error)
                break
            if not isinstance(target, Event):
                self._finish(
                    False,
                    TypeError(
                        f"task {self.name!r} awaited {target!r}; orchestration code may await "
                        "only what the Runtime hands out"
                    ),
                )
                break
            callbacks = target.callbacks
            if callbacks is not None:  # not processed yet: wait for it
                callbacks.append(self._step)
                self._target = target
                self._since = env._now
                break
            event = target  # already processed: go on with its outcome at once
        env._active_task = outer

    def _finish(self, ok: bool, value: Any) -> None:
        """The task's end reaches its waiters now, as the end of its step (not one more event
        later): a task's end is most of a run's events otherwise. The run's own stop waits
        for the event, as SimPy schedules it."""
        done, env = self.event, self._env
        done._ok, done._value = ok, value
        callbacks = done.callbacks
        if self._in_spawn:  # it ended in its eager first step: nobody awaits it yet
            if ok:
                done.callbacks = None  # processed: awaiting it goes on at once
            else:  # its waiter gets the failure as an event; with none, the run crashes
                heappush(env._queue, (env._now, NORMAL, env._tie_now(), next(env._eid), done))
        elif StopSimulation.callback in callbacks:
            heappush(env._queue, (env._now, NORMAL, env._tie_now(), next(env._eid), done))
        else:
            _process_now(done, callbacks)

    def _interrupt(self, interruption: Event) -> None:
        """SimPy's Interruption: take the task off its target and throw Cancelled into it."""
        if self.event._value is not PENDING:
            return  # it ended meanwhile
        target = self._target
        target.callbacks.remove(self._step)
        if isinstance(target, _Condition):  # its waiter left: a task it waits on that fails
            target._defused = True  # later (a killed job's engine dies) has crashed no one
        if self._started:
            self._step(interruption)
        else:  # never ran: it fails with the interrupt, as an unstarted simpy.Process does
            _close_unstarted(self._coro)
            self._finish(False, _copy(interruption._value))

    def done(self) -> bool:
        return self.event._value is not PENDING

    def cancel(self, reason: str) -> None:
        """Raise Cancelled(reason) inside the task at its current await (no-op when done)."""
        if self.event._value is not PENDING:
            return
        env = self._env
        if env._active_task is self:
            raise RuntimeError("A process is not allowed to interrupt itself.")
        self.event._defused = True  # a cancelled task nobody awaits is not a crash
        interruption = Event(env)
        interruption.callbacks.append(self._interrupt)
        interruption._ok, interruption._value = False, Interrupt(reason)
        interruption._defused = True
        env.schedule(interruption, URGENT)

    def result(self) -> Any:
        done = self.event
        if done._value is PENDING:
            raise RuntimeError(f"task {self.name!r} is still running")
        if not done._ok:
            raise done._value
        return done._value

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.event)


def _thrown(event: Event) -> BaseException:
    """What a failed event throws into the task that awaited it: Cancelled for a cancel, else
    a copy of the failure (the event is defused: its waiter received it)."""
    event._defused = True
    failure = event._value
    if isinstance(failure, Interrupt):
        return Cancelled(str(failure.cause))
    return _copy(failure)


def _close_unstarted(coro: Coroutine[Any, Any, Any]) -> None:
    """Close a coroutine that never ran, and the coroutines handed to it to await (a wrapper
    such as RunContext's guard is given one): those will never be awaited either, and
    would each warn so when collected."""
    frame = coro.cr_frame
    handed = [v for v in frame.f_locals.values() if iscoroutine(v)] if frame is not None else []
    coro.close()
    for inner in handed:
        inner.close()


def _process_now(event: Event, callbacks: list[Any]) -> None:
    """Process a triggered event at once, inside the step that triggered it: what
    ``SeededEnvironment._process`` does with a queued one, the crash check included."""
    event.callbacks = None
    for callback in callbacks:
        callback(event)
    if not event._ok and not hasattr(event, "_defused"):
        raise _copy(event._value)  # a failure nobody waited for crashes the run


_TAKEN = object()
"""What a _Stepped holds once its first step has been handed on."""


class _Stepped:
    """A coroutine whose first step was taken already (``SimRuntime.gather``): its first
    ``send`` hands back what that step yielded, or raises what it raised; then it is the
    coroutine itself. So the task made of it is the eager task that step would have been."""

    __slots__ = ("_coro", "_first", "_raised")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any, raised: bool) -> None:
        self._coro, self._first, self._raised = coro, first, raised

    @property
    def cr_frame(self) -> Any:
        return self._coro.cr_frame

    def send(self, value: Any) -> Any:
        first = self._first
        if first is _TAKEN:
            return self._coro.send(value)
        self._first = _TAKEN
        if self._raised:
            raise first
        return first

    def throw(self, error: BaseException) -> Any:
        return self._coro.throw(error)

    def close(self) -> None:
        self._coro.close()


class SimSignal:
    __slots__ = ("event",)

    def __init__(self, env: SeededEnvironment, event: Event | None = None) -> None:
        if event is None:
            event = Event.__new__(Event)  # Event(env), without the call
            event.env, event.callbacks = env, []
        self.event = event

    def set(self, value: Any = None) -> None:
        """Succeed with ``value`` unless already set (``Event.succeed``, inlined)."""
        event = self.event
        if event._value is PENDING:
            event._ok, event._value = True, value
            env = event.env
            heappush(env._queue, (env._now, NORMAL, env._tie_now(), next(env._eid), event))

    def set_for_current_waiters(self) -> None:
        """``set()`` for a signal that nobody begins to wait on once it is set (its owner
        replaces it, or waits on it only in a state that setting it ends). With no waiter
        it is processed now, not queued to be popped with nothing to do; its tie is drawn
        all the same, so every other event keeps its place. An update's pause and resume
        each set one on every engine, most of them with no request waiting."""
        event = self.event
        if event._value is not PENDING:
            return
        if event.callbacks:
            self.set()
            return
        event._ok, event._value, event.callbacks = True, None, None
        env = event.env
        env._tie_now()
        next(env._eid)

    def is_set(self) -> bool:
        return self.event._value is not PENDING

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self.event)


class _Condition(Event):
    """SimPy's AnyOf / AllOf minus the ConditionValue, decided without an event of its own.

    Its value is what the awaiting code wants: for any, the index of the first
    of its events (in list order) already processed; for all, every value. It is
    processed the moment it is decided, inside the callback of the event that
    decided it, so its waiter goes on in that step; SimPy would queue it as one
    more event, and every wait would cost two. Decided while it is built (one of
    its events has been processed already), it is processed at once, and the
    await goes on without waiting.
    """

    def __init__(self, env: SeededEnvironment, events: list[Event], any_: bool) -> None:
        self.env = env
        # the events behind the waitables, defused: the waiter receives the first failure;
        # a later failure among them has been waited for too and must not crash the run
        self._events = events
        self._any = any_
        self._count = 0
        if not events:  # SimPy: an empty condition triggers at once
            self.callbacks = []
            if any_:  # no first one to name (SimPy's path raised at the await too)
                self._ok, self._value = False, RuntimeError("wait_any of no waitables")
                self._defused = True
            else:
                self._ok, self._value = True, []
            env.schedule(self)
            return
        self.callbacks = None  # while it is built, a check only records the outcome
        for event in events:
            event._defused = True
        for event in events:
            callbacks = event.callbacks
            if callbacks is None:
                self(event)
                if self._value is not PENDING:
                    break
            else:  # the condition is its events' callback itself: no bound method to make,
                callbacks.append(self)  # and found again by identity when it is decided
        if self._value is PENDING:
            self.callbacks = [_decided]
        else:
            _decided(self)

    def __call__(self, event: Event) -> None:
        """One of its events was processed: decide, if that decides it."""
        if self._value is not PENDING:
            return
        self._count += 1
        if not event._ok:
            event._defused = True
            self._ok, self._value = False, event._value
            if isinstance(event._value, Cancelled | Interrupt):  # as SimTask.cancel: a task
                self._defused = True  # cancelled (before it started, too) is no crash when
                # nobody awaits this (its waiter left: a killed job's tasks all go at once)
        elif self._any or self._count == len(self._events):
            self._ok, self._value = True, None
        else:
            return
        if self.callbacks is not None:
            _process_now(self, self.callbacks)

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self)


def _decided(condition: _Condition) -> None:
    """A condition's first callback when it is processed: off its other events' callbacks,
    and its value (a function, not a method: a condition holding its own bound method in
    its callbacks would be a reference cycle until it is decided)."""
    events = condition._events
    _unhook(condition, events)
    if not condition._ok:
        return
    if condition._any:
        for i, sub in enumerate(events):
            if sub.callbacks is None:
                condition._value = i
                break
    else:
        condition._value = [sub._value for sub in events]


def _unhook(waiter: Event, events: list[Event]) -> None:
    """Take a decided wait off the callbacks of its events that still hold it (one being
    processed, or processed already, holds none)."""
    for sub in events:
        callbacks = sub.callbacks
        if callbacks:
            try:  # noqa: SIM105 (suppress() is a context manager: slower, on a hot path)
                callbacks.remove(waiter)
            except ValueError:
                pass


class _TimerOr(Event):
    """``_Condition`` for any of a new timer and some signals, decided by the first of them
    processed (its value: 0 for the timer, 1 + i for ``signals[i]``).

    Every simulated request's decode and every train step waits on one (590 a step at
    64x256), so it is ``_Condition``'s any-path with what cannot happen here left out:
    a timer and a signal never fail, so there is no failure to pass on or defuse, and the
    event that decides it is the one whose callback runs (any event before it in the
    list that had been processed would have decided it first). The events, the order of
    the callbacks on the signals and the ties are ``_Condition``'s.
    """

    def __init__(
        self, env: SeededEnvironment, seconds: SimTime, signals: Sequence[SimSignal]
    ) -> None:
        self.env = env
        self._ok = True
        self._events = events = [_Sleep(env, seconds)]
        events[0].callbacks.append(self)
        for i, signal in enumerate(signals, 1):
            event = signal.event
            callbacks = event.callbacks
            if callbacks is None:  # set and processed already: decided now, by it, and
                self._value = i  # processed (nobody waits on it yet): an await goes on at once
                self.callbacks = None
                _unhook(self, events)
                return
            events.append(event)
            callbacks.append(self)
        self.callbacks = []

    def __call__(self, event: Event) -> None:
        """One of its events was processed: that one decides it."""
        if self._value is not PENDING:
            return
        self._value = self._events.index(event)
        _unhook(self, self._events)
        _process_now(self, self.callbacks)

    def __await__(self) -> Generator[Event, Any, Any]:
        return (yield self)


def _awaited(event: Event, ends: dict[int, str], since: float) -> tuple[str, tuple[str, ...]]:
    """What a task's target event is, and the tasks whose ends it is (``since``: when the
    task began the wait, which is when a timer it awaits was started)."""
    name = ends.get(id(event))
    if name is not None:
        return f"task '{name}'", (name,)
    if isinstance(event, _Sleep):
        return f"a timer until t={since + event._delay:.6g}", ()
    if isinstance(event, _Condition | _TimerOr):
        parts = [_awaited(sub, ends, since) for sub in event._events]
        tasks = tuple(t for _, ts in parts for t in ts)
        kind = "all" if isinstance(event, _Condition) and not event._any else "the first"
        return f"{kind} of ({', '.join(text for text, _ in parts)})", tasks
    return "a signal", ()


def _task_wait(task: SimTask, ends: dict[int, str]) -> TaskWait:
    frames = await_frames(task._coro)
    awaits, on = _awaited(task._target, ends, task._since)  # a timer was made as it waited
    return TaskWait(
        task=task.name,
        where=describe_frames(frames),
        awaits=awaits,
        on_tasks=on,
        party=party_of(frames),
        since=float(task._since),
    )


class SimRuntime:
    """Runtime over a SeededEnvironment; ``run`` drives a root coroutine to completion."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.env = SeededEnvironment(seed)
        self._streams: dict[str, random.Random] = {}

    def now(self) -> float:
        return float(self.env._now)

    def sleep(self, seconds: float) -> _Sleep:
        if seconds < 0:
            raise ValueError(f"sleep needs seconds >= 0, got {seconds}")
        return _Sleep(self.env, seconds)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str, eager: bool = False) -> SimTask:
        return SimTask(self.env, coro, name, eager)

    def signal(self) -> SimSignal:
        return SimSignal(self.env)

    def timer(self, seconds: float) -> SimSignal:
        if seconds < 0:
            raise ValueError(f"timer needs seconds >= 0, got {seconds}")
        return SimSignal(self.env, _Sleep(self.env, seconds))

    def wait_any(self, waitables: Sequence[SimTask | SimSignal]) -> _Condition:
        return _Condition(self.env, [w.event for w in waitables], True)

    def wait_all(self, waitables: Sequence[SimTask | SimSignal]) -> _Condition:
        return _Condition(self.env, [w.event for w in waitables], False)

    def timer_or(self, seconds: float, signals: Sequence[SimSignal]) -> _TimerOr:
        """``wait_any([timer(seconds), *signals])`` without a signal around the timer: the
        simulated components' work (every request's decode, every train step) is this."""
        if seconds < 0:
            raise ValueError(f"timer needs seconds >= 0, got {seconds}")
        return _TimerOr(self.env, seconds, signals)

    async def gather(
        self, coros: Sequence[Coroutine[Any, Any, T]], names: Sequence[str], reason: str
    ) -> list[Any]:
        """Each coroutine's first step now, in order, as eager tasks would take it; one that
        returned needs no task, one that waits (or raised) becomes the eager task its step
        began, with the same events. An update's control calls mostly answer at once, and a
        task each (six calls to each of 256 engines a step) cost 3% of a large run's
        instructions (callgrind, 64x256)."""
        results: list[Any] = [None] * len(coros)
        waiting: list[SimTask] = []
        at: list[int] = []
        env = self.env
        for i, coro in enumerate(coros):
            try:
                first, raised = coro.send(None), False
            except StopIteration as stop:
                results[i] = stop.value
                continue
            except BaseException as error:
                first, raised = error, True
            waiting.append(SimTask(env, _Stepped(coro, first, raised), names[i], True))  # type: ignore[arg-type]
            at.append(i)
        if waiting:
            for i, value in zip(at, await join_all(self, waiting, reason), strict=True):
                results[i] = value
        return results

    def waits(self) -> WaitGraph:
        """Every task of this run that has not finished, what it awaits and since when (the
        wait-for graph of a stalled run). Found through the collector, not a registry: a
        run spawns hundreds of thousands of tasks and asks this at most once."""
        tasks = [
            o
            for o in gc.get_objects()
            if type(o) is SimTask and o._env is self.env and not o.done() and o._started
        ]
        ends = {id(task.event): task.name for task in tasks}
        return graph_of(_task_wait(task, ends) for task in tasks)

    def interrupt_soon(self) -> None:
        """Make ``run`` raise RunInterrupted before the next event: what a Ctrl-C handler calls.

        Safe inside a signal handler, which runs between two lines of whatever step was
        running: it only pushes an event to the queue (a heappush, atomic for the
        interpreter) that comes before every other, and the step in progress ends as usual.
        Raising at that line instead left tasks half-finished (one finished twice, and the
        run was reported as a crash of the control plane)."""
        env = self.env
        stop = Event.__new__(Event)
        stop.env, stop.callbacks, stop._ok, stop._value = env, [_interrupted], True, None
        heappush(env._queue, (env._now, EventPriority(-1), 0, next(env._eid), stop))

    def rng(self, stream: str) -> random.Random:
        rng = self._streams.get(stream)
        if rng is None:
            rng = self._streams[stream] = random.Random(derive_seed(self.seed, stream))
        return rng

    def run(self, main: Coroutine[Any, Any, T], until: float | None = None) -> T:
        """Run ``main`` as a task until it finishes (or virtual time ``until``); give its result.

        Raises Deadlock when nothing is left to happen but ``main`` has not finished,
        Livelock when virtual time stops advancing, TimeoutError at ``until``, and
        RunInterrupted when ``interrupt_soon`` was called. A task
        that failed with nobody awaiting it raises its own exception (a copy whose
        ``__cause__`` is the original, with its traceback), never a deadlock.
        """
        task = self.spawn(main, "main")
        stop = (
            task.event if until is None else self.env.any_of([task.event, Timeout(self.env, until)])
        )
        try:
            self.env.run(until=stop)
        except RunInterrupted:  # pushed at the instant the handler saw, which may be before
            self.env._now = max(self.env._now, self.env._instant)  # the event then in hand
            raise
        except RuntimeError as error:
            if type(error) is RuntimeError and str(error).startswith("No scheduled events left"):
                raise Deadlock(
                    f"deadlock at t={self.env.now}: task 'main' is waiting but no event is "
                    "scheduled"
                ) from None
            raise
        finally:
            self._close_never_started()
        if not task.done():
            raise TimeoutError(f"main did not finish by t={until}")
        return task.result()

    def _close_never_started(self) -> None:
        """The run is over: a task still waiting for its first step never runs. Its
        coroutine (and one handed to it) is closed, not left to warn when collected that
        it was never awaited."""
        for entry in self.env._queue:
            for callback in entry[-1].callbacks or ():
                task = getattr(callback, "__self__", None)
                if isinstance(task, SimTask) and not task._started and not task.done():
                    _close_unstarted(task._coro)
