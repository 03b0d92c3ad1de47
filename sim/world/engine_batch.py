"""How a simulated engine batches generation, when the time model asks it to
(docs/generation.md): a cap on its running requests, with a first-come queue behind it,
and the decode law, under which every running request makes one token per decode step
and a step's time follows the batch.

Both are per engine process (a restart begins afresh) and off by default: an engine
without them keeps its per-request law (sim/world/engine.py ``SimEngine._decode``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque

from miles_core.scenario import TimeModel
from sim.world.engine_request import EngineRequest
from sim.world.runtime import SimRuntime, SimSignal

_DUE = 1e-6
"""Tokens a member may lack and still be woken with the member the timer was set for: the
float rounding of time to steps, never a real token."""


class Slots:
    """At most ``cap`` requests hold a running slot (SGLang's --max-running-requests, or what
    the KV pool holds at prompt + max_new_tokens each); the rest wait first come, first
    served. A paused engine admits none; a request frozen in place keeps its slot, one
    retracted goes to the back of the queue (SGLang's ``retract_all`` then
    ``_add_request_to_queue``), one aborted leaves it."""

    def __init__(self, rt: SimRuntime, cap: int) -> None:
        self.rt = rt
        self.cap = cap
        self.holders: dict[EngineRequest, None] = {}
        """The requests holding a slot, in the order they were admitted."""
        self.queue: deque[EngineRequest] = deque()

    def arrive(self, job: EngineRequest, paused: bool) -> None:
        """``job`` joins the back of the queue, and whoever fits is admitted."""
        self._enqueue(job)
        self.admit(paused)

    def _enqueue(self, job: EngineRequest) -> None:
        job.admitted = self.rt.signal()
        job.queued = True
        self.queue.append(job)

    def admit(self, paused: bool) -> None:
        """Admit from the front of the queue while a slot is free (none while paused)."""
        while not paused and self.queue and len(self.holders) < self.cap:
            job = self.queue.popleft()
            job.queued = False
            job.running = True
            self.holders[job] = None
            job.admitted.set_for_current_waiters()  # a job checks ``running`` before it waits

    def release(self, job: EngineRequest, paused: bool) -> None:
        """``job`` ended (done, failed, aborted): its slot or its place in the queue goes."""
        if job.running:
            job.running = False
            del self.holders[job]
            self.admit(paused)
        elif job.queued:
            job.queued = False
            self.queue.remove(job)

    def retract_all(self) -> None:
        """A retract pause: every slot holder goes to the back of the queue, in the order
        they were admitted."""
        retracted = list(self.holders)
        self.holders.clear()
        for job in retracted:
            job.running = False
            self._enqueue(job)

    def drop_all(self) -> None:
        """An abort of every request: every slot and every place in the queue goes."""
        for job in self.holders:
            job.running = False
        for job in self.queue:
            job.queued = False
        self.holders.clear()
        self.queue.clear()


class DecodeClock:
    """The decode law over one engine process's running batch: a step takes

        fixed + per_request x n + per_kv_token x (the n requests' context tokens)

    (at least ``floor``, the world's token pace) and makes one token for each of the n.

    Between two changes of the batch (a request joins, finishes, leaves) every member
    advances alike, and the context grows by n tokens a step, so the time of d steps is
    the integral of the step time over them: exact but for treating a step's context as
    growing smoothly within it (the sum of discrete steps differs by per_kv_token x n / 2
    a step, under 1 / prompt_tokens of the step; tests/test_generation_model.py bounds
    it). One timer, for the member due first, is set at each change: the events are per
    change of the batch, not per token nor per member.
    """

    def __init__(self, rt: SimRuntime, timing: TimeModel, floor: float) -> None:
        self.rt = rt
        self.fixed = timing.decode_step_fixed_seconds
        self.per_request = timing.decode_step_seconds_per_request
        self.per_kv_token = timing.decode_step_seconds_per_kv_token
        self.prompt = timing.prompt_tokens
        self.floor = floor
        self.since = rt.now()
        self.steps = 0.0
        """Steps made up to ``since`` (a member's tokens: steps less its offset)."""
        self.context = 0.0
        """The members' context tokens (prompt and tokens so far) at ``since``."""
        self.members: dict[EngineRequest, float] = {}
        """Each decoding request's offset: its tokens are ``steps`` less it."""
        self._due: list[tuple[float, int, EngineRequest]] = []
        """(the step a member is to be woken at, arrival order, the member); stale entries are
        skipped (a member that left, or was given another waking step)."""
        self._order = itertools.count()
        self._timer = 0
        """The live timer's number: a change of the batch sets a new one, and the old one
        does nothing when it fires."""

    # -- the law ---------------------------------------------------------------------------

    def _start(self) -> tuple[float, float]:
        """The step time at ``since`` and its growth per step (the members' new tokens)."""
        n = len(self.members)
        start = self.fixed + self.per_request * n + self.per_kv_token * self.context
        return start, self.per_kv_token * n

    def seconds_for(self, steps: float) -> float:
        """The time ``steps`` more steps take from ``since``, the batch unchanged."""
        start, growth = self._start()
        floor = self.floor
        if start >= floor:
            return steps * (start + growth * steps / 2)
        if not growth:
            return steps * floor
        flat = (floor - start) / growth  # steps at the floor before the law passes it
        if steps <= flat:
            return steps * floor
        rest = steps - flat
        return flat * floor + rest * (floor + growth * rest / 2)

    def steps_in(self, seconds: float) -> float:
        """The steps made in ``seconds`` from ``since``, the batch unchanged (seconds_for's
        inverse)."""
        start, growth = self._start()
        floor = self.floor
        if start >= floor:
            return _steps_of(seconds, start, growth)
        if not growth:
            return seconds / floor
        flat = (floor - start) / growth
        if seconds <= flat * floor:
            return seconds / floor
        return flat + _steps_of(seconds - flat * floor, floor, growth)

    # -- the batch -------------------------------------------------------------------------

    def _settle(self) -> None:
        """Bring ``steps`` and ``context`` up to now."""
        now = self.rt.now()
        if now == self.since:
            return
        if self.members:
            made = self.steps_in(now - self.since)
            self.steps += made
            self.context += len(self.members) * made
        self.since = now

    def join(self, job: EngineRequest, tokens: float) -> SimSignal:
        """``job`` decodes from its tokens so far; the signal is set when it has ``tokens``
        (it leaves the batch then). A member joining again is only given a new waking
        point."""
        self._settle()
        if job not in self.members:
            self.members[job] = self.steps - job.done
            self.context += self.prompt + job.done
        job.wake_tokens = tokens
        job.wake_step = self.members[job] + tokens
        job.woken = woken = self.rt.signal()
        heapq.heappush(self._due, (job.wake_step, next(self._order), job))
        self._schedule()
        return woken

    def leave(self, job: EngineRequest) -> None:
        """``job`` stops decoding (its process died); its tokens so far are kept."""
        self._settle()
        self._drop(job, self.steps - self.members[job])
        self._schedule()

    def stop_all(self) -> None:
        """Every member stops now (a pause, an abort): each keeps its tokens so far."""
        self._settle()
        for job, offset in self.members.items():
            job.done = min(job.total, self.steps - offset)
        self.members.clear()
        self.context = 0.0
        self._due.clear()
        self._timer += 1

    def _drop(self, job: EngineRequest, done: float) -> None:
        del self.members[job]
        job.done = min(job.total, done)
        self.context = self.context - self.prompt - done if self.members else 0.0

    def _schedule(self) -> None:
        """Set the timer for the member due first, under the batch as it is now."""
        due = self._due
        while due and not self._live(due[0]):
            heapq.heappop(due)
        self._timer += 1
        if not due:
            return
        timer, number = (
            self.rt.timer(self.seconds_for(max(0.0, due[0][0] - self.steps))),
            self._timer,
        )
        timer.event.callbacks.append(lambda _event: self._tick(number))

    def _live(self, entry: tuple[float, int, EngineRequest]) -> bool:
        step, _, job = entry
        return job in self.members and job.wake_step == step

    def _tick(self, number: int) -> None:
        """The timer for the member due first fired: wake it (and any due with it)."""
        if number != self._timer:  # the batch changed since it was set
            return
        self._settle()
        due = self._due
        first = True
        while due and (first or due[0][0] <= self.steps + _DUE or not self._live(due[0])):
            entry = heapq.heappop(due)
            if not self._live(entry):
                continue
            first = False
            job = entry[2]
            self._drop(job, job.wake_tokens)
            job.woken.set()
        self._schedule()


def _steps_of(seconds: float, start: float, growth: float) -> float:
    """Steps in ``seconds`` when a step takes ``start`` and grows by ``growth`` a step: the
    root of growth / 2 x d^2 + start x d = seconds, in the form that keeps its precision
    when growth is small."""
    return 2 * seconds / (start + math.sqrt(start * start + 2 * growth * seconds))
