"""A simulated rollout engine that keeps SGLang's semantics where they matter to the control
plane.

- Generation runs token by token in virtual time (lognormal length, decode time per
  token slowed by concurrency). A pause (``/pause_generation``) interrupts it by
  mode: ``abort`` ends the request aborted; ``retract`` frees its KV and requeues
  it, and when generation continues its KV is recomputed (a prefill of prompt and
  tokens so far) on the new weights; ``in_place`` freezes it on its KV, and later
  tokens come from the new weights attending to the old keys and values.
- Every response reports the weight version of each span of its tokens
  (SGLang's meta_info ``weight_versions``), and whether it kept old KV across a
  change of weights.
- ``/update_weight_version`` aborts every request in flight unless told
  ``abort_all_requests: false`` (SGLang's default is true).
- ``/flush_cache`` refuses while a request holds KV pages (a running or frozen
  one); retracted and queued ones hold none. It drops the prefix cache
  (``[sim] prefix_cache``): a prompt's KV, kept per process from the first
  request that computed it, and reused by later requests for the prompt
  (``shared``, as SGLang's radix cache: whatever weights computed it) or only under
  the same weights (``by_version``); each response names the weights of the KV it
  reused. Entries live until a flush or the process's end (no eviction). An SGLang before #31962
  (``[sim] flush_refuses_while_queued``) also refuses while any request waits.
- A hung engine (a fault) answers nothing until it is killed.
- Opt-in, how engines batch (docs/generation.md; sim/world/engine_batch.py): a cap on
  running requests (``max_running_requests``, or the KV pool's) with a first-come queue
  behind it, the decode law (a step's time follows the running batch), a charge for every
  prefill that the prefix cache saves, and a share of responses that run to the cap.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from miles_core.backend import (
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RequestRefused,
    SessionAlreadyOpen,
)
from miles_core.kinds import FaultPoint, PauseMode
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.schedule import FaultPoints
from sim.world.contents import held
from sim.world.engine_batch import DecodeClock, Slots
from sim.world.engine_request import EngineRequest
from sim.world.process import Mortal
from sim.world.runtime import SimRuntime, SimSignal


class EngineCluster(Protocol):
    """What a simulated engine sees of its cluster (sim/world/cluster.py's SimCluster)."""

    rt: SimRuntime
    world: WorldShape
    timing: TimeModel
    faults: FaultPoints
    poisoned: set[int]
    """Prompts longer than the engines' context (the poison_prompt fault)."""
    spans: dict[tuple[int | None, ...], tuple[int | None, ...]]
    """Each distinct list of a response's span versions, shared (SimCluster.spans)."""

    reads_weights: bool
    """Its engines keep content ids and answer stamps with them (contents.py)."""

    def control_reply(self) -> Awaitable[None]: ...


OVER_LONG = "the input is longer than the model's context length"
"""SGLang's refusal of an over-long prompt (the poison_prompt fault), answered at once."""

_NONE = object()
"""No entry in the prefix cache (None is a version: the initial weights)."""


class SimEngine(Mortal):
    """One engine slot; its process is replaced on restart."""

    def __init__(self, cluster: EngineCluster, engine_id: str) -> None:
        super().__init__(cluster.rt, engine_id)
        self.cluster = cluster
        self.id = engine_id
        self._lengths = cluster.rt.rng(f"{engine_id}.lengths")
        self._rewards = cluster.rt.rng(f"{engine_id}.rewards")
        """Looked up once: a stream is the same object for the whole run (rt.rng's contract)."""
        t = cluster.timing
        self._length_sigma = t.response_tokens_sigma
        self._length_mu = math.log(t.response_tokens_mean) - self._length_sigma**2 / 2
        """The response length's lognormal parameters (mean response_tokens_mean), worked out
        once: the cluster's timing is fixed for its run, and every request draws one."""
        self._cap = t.running_cap()
        """The most requests it runs at once (None: no cap), and whether its decode steps
        follow the batch: fixed for the run too."""
        self._batch_law = t.batch_law()
        self._fresh()

    def _fresh(self) -> None:
        """A new process's state: initial weights, no version, not paused."""
        self.version: int | None = None
        self.adapter: str | None = None
        self.paused = False
        self.hung = False
        self.unanswered: frozenset[str] = frozenset()
        """Control calls this process accepts and never answers (a hang_call fault)."""
        self.session_open = False
        """Between begin_update and end_update (SGLang's weight-update session)."""
        self.loaded: dict[int, int] = {}
        """Bucket index -> the version it was loaded from (contents.py; kept only when the
        cluster reads weights)."""
        self.lying = False
        """It answers loads with success and loads nothing (the lying_engine fault)."""
        self.in_flight = 0
        self.prefixes: dict[int | tuple[str, int], int | None] = {}
        """The prefix cache: prompt -> the weights that computed its KV; (namespace, prompt)
        under --namespaced-radix-cache (SGLang keys its radix tree by ``extra_key`` too)."""
        self.jobs: set[EngineRequest] = set()
        """Requests this process has admitted and not finished."""
        self._resumed: SimSignal = self.rt.signal()
        self._interrupt: SimSignal = self.rt.signal()
        self._interrupt_mode: PauseMode | None = None
        """What the last interrupt asked of running requests (None: abort them all)."""
        self._slots = None if self._cap is None else Slots(self.rt, self._cap)
        self._clock = (
            DecodeClock(self.rt, self.cluster.timing, self.cluster.world.engine_token_seconds)
            if self._batch_law
            else None
        )
        """The process's running slots and decode clock (engine_batch.py), when asked for."""

    def failure(self, reason: str) -> EngineFailure:
        return EngineFailure(self.id, reason)

    def check(self, incarnation: int) -> None:
        """Raise as a client would when the process it addresses is gone."""
        if incarnation != self.incarnation:
            raise self.failure(f"process {incarnation} was replaced by {self.incarnation}")
        if self.dead:
            raise self.failure("dead")

    def start(self) -> int:
        incarnation = super().start()
        self._fresh()
        return incarnation

    async def answer(self) -> None:
        """A hung process never answers; it fails once killed."""
        if self.hung:
            await self._death
            raise self.failure("killed while hung")

    async def never_answers(self, route: str) -> None:
        """A call this process accepted and will never answer; it fails once killed."""
        await self._death
        raise self.failure(f"killed with its {route} call unanswered")

    def _interrupt_all(self, mode: PauseMode | None) -> None:
        """Interrupt every request now: as SGLang's scheduler does before it answers, a pause
        that retracts or aborts has released their KV pages by the time it returns."""
        self._interrupt_mode = mode
        if mode is not PauseMode.IN_PLACE:
            for job in self.jobs:
                job.holds_pages = False
        if mode is None or mode is PauseMode.ABORT:
            for job in self.jobs:
                job.aborted = True
        if self._clock is not None:  # every member stops decoding, its tokens so far kept
            self._clock.stop_all()
        if self._slots is not None:
            if mode is None or mode is PauseMode.ABORT:
                self._slots.drop_all()
            elif mode is PauseMode.RETRACT:
                self._slots.retract_all()
        self._interrupt.set_for_current_waiters()  # replaced at once: no later waiter
        self._interrupt = self.rt.signal()

    # -- generation ------------------------------------------------------------------------

    async def generate(self, incarnation: int, request: GenerateRequest) -> GenerateResult:
        """Decode until done, through pauses (one coroutine for the whole request, not one
        more around its loop: a large run makes 512 requests a step)."""
        self.check(incarnation)
        if self.hung:
            await self.answer()
        if self.cluster.poisoned and request.prompt_id in self.cluster.poisoned:
            raise RequestRefused(self.id, OVER_LONG)
        timing = self.cluster.timing
        length = self._lengths.lognormvariate(self._length_mu, self._length_sigma)
        if timing.response_tokens_max:  # max_new_tokens: the tail is cut
            length = min(length, timing.response_tokens_max)
            fraction = timing.response_tokens_max_fraction
            if fraction and self._lengths.random() < fraction:  # it rambles to the cap
                length = timing.response_tokens_max
        namespace = request.kv_namespace  # its prefix-cache entry: by namespace too, if any
        key = request.prompt_id if namespace is None else (namespace, request.prompt_id)
        job = EngineRequest(length, self.rt.now(), self._death, key)
        job.recompute = timing.charge_every_prefill  # its first prefill, charged as a recompute
        job.start_version = request.start_weight_version
        self.jobs.add(job)
        slots, clock = self._slots, self._clock
        if slots is not None:
            slots.arrive(job, self.paused)
        try:
            while job.done < job.total:
                if slots is not None and not job.running and await self._wait_slot(job):
                    return self._result(job, aborted=True)  # abort_all while it queued
                if self.paused and await self._wait_paused(job):
                    return self._result(job, aborted=True)  # abort_all while it waited
                if job.death.is_set():  # its process was replaced while it waited to go on
                    raise self.failure("killed while the request waited")
                if self.hung:
                    await self.answer()
                job.on_weights(self.version)
                if clock is None:
                    interrupted = await self._decode(job)
                else:
                    interrupted = await self._decode_stepped(job, clock)
                if interrupted is None:
                    continue
                if job.aborted:
                    return self._result(job, aborted=True)
                mode = self._interrupt_mode
                job.recompute = mode is PauseMode.RETRACT
                if mode is PauseMode.IN_PLACE and self.paused and await self._wait_paused(job):
                    return self._result(job, aborted=True)
            if self.hung:
                await self.answer()
            return self._result(job, aborted=job.aborted)
        finally:
            self.jobs.discard(job)
            if slots is not None:
                slots.release(job, self.paused)

    async def _prefill(self, job: EngineRequest, interrupt: SimSignal) -> bool:
        """The KV of prompt and tokens so far, on these weights (a retracted request's, or with
        charge_every_prefill a first one, whose prompt part a reused prefix saves); True when
        an interrupt came first."""
        t = self.cluster.timing
        reused = self._prompt_kv(job)
        prompt = 0.0 if reused and t.charge_every_prefill else t.prompt_tokens
        prefill = (prompt + job.done) * t.prefill_seconds_per_token
        if prefill:
            outcome = await self.work(prefill, interrupt, death=job.death)
            if outcome == 1 and job.first:  # charge_every_prefill's first prefill
                raise self.failure("killed while computing a request's prompt KV")
            if outcome == 1:
                raise self.failure("killed while recomputing a retracted request's KV")
            if outcome == 2:
                return True
        job.recompute = False
        return False

    async def _decode(self, job: EngineRequest) -> bool | None:
        """Prefill (if retracted) and decode until done (None) or interrupted (True)."""
        t = self.cluster.timing
        interrupt = self._interrupt
        if job.recompute and await self._prefill(job, interrupt):
            return True
        per_token = self.token_seconds() * (1 + t.concurrency_slowdown * (self.in_flight + 1))
        seconds = (job.total - job.done) * per_token
        faults, strike = self.cluster.faults, False
        if job.first:
            job.first = False
            if not t.charge_every_prefill:  # else its prefill looked the prompt up
                self._prompt_kv(job)
            halfway = self.rt.now() + seconds / 2  # an after_time is judged then
            strike = faults.armed(FaultPoint.MID_GENERATION, by=halfway, engine=self.id)
        self.in_flight += 1
        job.holds_pages = True
        began, incarnation = self.rt.now(), self.incarnation
        if strike:  # a mid-generation kill strikes this process halfway, if the request gets
            outcome = await self.work(seconds / 2, interrupt, death=job.death)  # that far
            if outcome == 0:
                faults.fire(FaultPoint.MID_GENERATION, engine=self.id)
                outcome = await self.work(seconds / 2, interrupt, death=job.death)
        else:
            outcome = await self.work(seconds, interrupt, death=job.death)
        if self.incarnation == incarnation:  # a restart began a new count
            self.in_flight -= 1
        if outcome != 2:
            job.holds_pages = False  # finished or killed: its pages go
        if outcome == 1:
            raise self.failure("killed mid-generation")
        job.done = job.total if outcome == 0 else job.done + (self.rt.now() - began) / per_token
        return True if outcome == 2 else None

    async def _decode_stepped(self, job: EngineRequest, clock: DecodeClock) -> bool | None:
        """``_decode`` under the decode law: the request decodes in the clock's batch, its
        token time following the batch (a mid-generation kill strikes when it has made half
        of what it had left as it started)."""
        interrupt = self._interrupt
        if job.recompute and await self._prefill(job, interrupt):
            return True
        woken, strike, faults = clock.join(job, job.total), False, self.cluster.faults
        if job.first:
            job.first = False
            if not self.cluster.timing.charge_every_prefill:
                self._prompt_kv(job)
            half = (job.total - job.done) / 2
            halfway = self.rt.now() + clock.seconds_for(half)  # as the batch is now
            strike = faults.armed(FaultPoint.MID_GENERATION, by=halfway, engine=self.id)
            if strike:
                woken = clock.join(job, job.done + half)
        job.holds_pages = True
        outcome = await self._decoded(job, clock, woken, interrupt)
        if strike and outcome == 0:
            faults.fire(FaultPoint.MID_GENERATION, engine=self.id)
            outcome = await self._decoded(job, clock, clock.join(job, job.total), interrupt)
        if outcome != 2:
            job.holds_pages = False  # finished or killed: its pages go
        if outcome == 1:
            raise self.failure("killed mid-generation")
        return True if outcome == 2 else None

    async def _decoded(
        self, job: EngineRequest, clock: DecodeClock, woken: SimSignal, interrupt: SimSignal
    ) -> int:
        """Wait for the clock to wake ``job`` (0), its process's death (1) or an interrupt
        (2, which stopped the whole batch already)."""
        outcome = await self.rt.wait_any([woken, job.death, interrupt])
        if outcome == 1 and job in clock.members:
            clock.leave(job)
        return outcome

    async def _wait_slot(self, job: EngineRequest) -> bool:
        """Wait in the queue of a capped engine until admitted; True when an abort of every
        request ended it meanwhile."""
        while not job.running:
            woke = await self.rt.wait_any([job.admitted, job.death, self._interrupt])  # type: ignore[list-item]
            if woke == 1:
                raise self.failure("killed while the request waited in the queue")
            if job.aborted:
                return True
        return False

    def _prompt_kv(self, job: EngineRequest) -> bool:
        """A prefill's prompt KV: reused from the prefix cache where its policy allows (the
        weights that computed it recorded), else computed now and cached. True: reused."""
        policy = self.cluster.world.prefix_cache
        if policy == "off":
            return False
        cached = self.prefixes.get(job.prompt, _NONE)
        if cached is not _NONE and (policy == "shared" or cached == self.version):
            job.cached.append(cached)  # type: ignore[arg-type]
            return True
        self.prefixes[job.prompt] = self.version
        return False

    async def _wait_paused(self, job: EngineRequest) -> bool:
        """Wait while the engine is paused (a queued, retracted or frozen request); True when
        an abort of every request ended it meanwhile (whether the abort's signal or the
        resume's woke it first)."""
        while self.paused and not job.aborted:
            woke = await self.rt.wait_any([self._resumed, job.death, self._interrupt])
            if woke == 1:
                raise self.failure("killed while the request waited")
        return job.aborted

    def _result(self, job: EngineRequest, aborted: bool) -> GenerateResult:
        versions = tuple(job.spans) or (self.version,)
        versions = self.cluster.spans.setdefault(versions, versions)
        # by position, in field order: a type call with keywords builds a dict of them, and
        # this is once per request
        return GenerateResult(
            self.id,  # engine
            versions[-1],  # weight_version
            aborted,
            self._reward(),  # reward
            None,  # payload
            self.rt.now() - job.started,  # engine_seconds
            versions,
            job.kept_kv,
            tuple(job.cached),
        )

    def _reward(self) -> float:
        rate = self.cluster.timing.reward_success_rate
        draw = self._rewards.random()
        return draw if rate is None else float(draw < rate)

    # -- control -------------------------------------------------------------------------

    async def pause(self, mode: PauseMode, abort_below: int | None = None) -> None:
        """``abort_below`` (sglang #34185): a request that declared a start version strictly
        below it ends aborted, its KV freed; ``mode`` decides the rest."""
        if self.hung:
            await self.answer()
        if not self.paused:  # a second pause (a retried update) keeps the waiters' signal
            self.paused = True
            self._resumed = self.rt.signal()
        if abort_below is not None:
            for job in self.jobs:
                if job.start_version is not None and job.start_version < abort_below:
                    job.aborted = True  # it ends at the interrupt below, whatever it was doing
                    job.holds_pages = False
        self._interrupt_all(mode)

    async def resume(self) -> None:
        if self.hung:
            await self.answer()
        self.paused = False
        self._resumed.set_for_current_waiters()  # awaited only while paused: no later waiter
        if self._slots is not None:
            self._slots.admit(paused=False)

    async def flush_cache(self) -> None:
        if self.hung:
            await self.answer()
        holding = sum(job.holds_pages for job in self.jobs)
        if holding:
            raise RequestRefused(self.id, f"Cache not flushed: {holding} requests hold KV pages")
        if self.jobs and self.cluster.world.flush_refuses_while_queued:
            raise RequestRefused(
                self.id, f"Cache not flushed: {len(self.jobs)} requests wait in the queue"
            )
        self.prefixes.clear()

    async def begin_update(self) -> None:
        """SGLang refuses a second begin while a session is open."""
        if self.hung:
            await self.answer()
        if self.session_open:
            raise SessionAlreadyOpen(self.id, "a weight-update session is already open")
        self.session_open = True

    async def end_update(self) -> None:
        """SGLang refuses an end with no session open."""
        if self.hung:
            await self.answer()
        if not self.session_open:
            raise RequestRefused(self.id, "no weight-update session is open")
        self.session_open = False

    async def stamp(self, version: int, abort_all_requests: bool = True) -> str | None:
        """The id of the weights it holds, where the cluster reads weights (contents.py)."""
        if self.hung:
            await self.answer()
        self.version = version
        if abort_all_requests:  # SGLang's default: every request in flight ends, aborted
            self._interrupt_all(None)
        return held(self.loaded) if self.cluster.reads_weights else None

    def load_bucket(self, index: int, version: int) -> None:
        """A bucket of ``version`` arrived: loaded, unless this process lies (lying_engine)."""
        if not self.lying:
            self.loaded[index] = version

    def abort_all(self) -> None:
        """SGLang's ``/abort_request`` with ``abort_all``, sent to the server's address: every
        request in flight ends aborted (a hung process answers nothing)."""
        if not self.hung:
            self._interrupt_all(None)

    async def unload_adapter(self, adapter: str) -> None:
        """SGLang's ``/unload_lora_adapter``: refused for an adapter this process does not
        hold (``LoRAManager.unload_lora_adapter``: "LoRA adapter ... is not loaded")."""
        if self.hung:
            await self.answer()
        if self.adapter != adapter:
            raise RequestRefused(self.id, f"LoRA adapter {adapter} is not loaded")
        self.adapter = None

    def load_adapter(self, adapter: str) -> None:
        """The adapter's tensors arrived: loaded, unless this process holds that name already
        (SGLang refuses a duplicate adapter name; miles unloads first for that reason)."""
        if self.adapter == adapter:
            raise RequestRefused(self.id, f"LoRA adapter {adapter} is already loaded")
        self.adapter = adapter

    def token_seconds(self) -> float:
        """One token's decode time alone: the time model's, or the world's pace if slower."""
        return max(
            self.cluster.timing.decode_seconds_per_token, self.cluster.world.engine_token_seconds
        )

    async def health(self) -> None:
        """A health generate: one token's worth of time, if the engine answers at all. It is
        a request like any other (SGLang's /health_generate), so a paused engine schedules
        it only once resumed: a check that meets an update's pause waits for its end, and
        fails when the pause outlasts the check's timeout (why miles pauses its monitor
        around updates)."""
        if self.hung:
            await self.answer()
        while self.paused and not self.dead:
            if await self.rt.wait_any([self._resumed, self._death]) == 1:
                break
        await self.rt.sleep(self.token_seconds())
        if self.dead:
            raise self.failure("dead")


class EngineHandle:
    """Calls to one process of an engine; they fail once that process is gone.

    A control call takes the world's ``control_reply_seconds`` (one wait shared by every
    call made at that instant, ``SimCluster.control_reply``); the engine acts when it
    ends, if the process addressed is still the one running, as an HTTP call to a
    replaced server would fail. With no reply time, each method hands back the engine's
    own call to await (no coroutine of the handle's around each of a run's hundreds of
    thousands of control calls); a call to a gone process raises EngineFailure at once."""

    def __init__(self, engine: SimEngine, incarnation: int) -> None:
        self.engine = engine
        self.id = engine.id
        self.incarnation = incarnation

    def _check(self) -> SimEngine:
        self.engine.check(self.incarnation)
        return self.engine

    def _control(
        self, route: str | None, call: Callable[[SimEngine], Awaitable[Any]]
    ) -> Awaitable[Any]:
        """``call`` made on the process, unless it is gone (EngineFailure) or leaves
        ``route`` (the SGLang route, the name a hang_call fault takes) unanswered."""
        engine = self.engine
        if engine.incarnation != self.incarnation or engine.dead:  # _check's test, inline:
            engine.check(self.incarnation)  # every update makes six calls to each engine
        if route is not None and engine.unanswered and route in engine.unanswered:
            return engine.never_answers(route)
        if not engine.cluster.timing.control_reply_seconds:
            return call(engine)
        return self._after_reply(call)

    async def _after_reply(self, call: Callable[[SimEngine], Awaitable[Any]]) -> Any:
        await self.engine.cluster.control_reply()
        return await call(self._check())

    def pause(self, mode: PauseMode, abort_below: int | None = None) -> Awaitable[None]:
        return self._control("pause_generation", lambda engine: engine.pause(mode, abort_below))

    def resume(self) -> Awaitable[None]:
        return self._control("continue_generation", SimEngine.resume)

    def flush_cache(self) -> Awaitable[None]:
        return self._control("flush_cache", SimEngine.flush_cache)

    def begin_update(self) -> Awaitable[None]:
        return self._control(None, SimEngine.begin_update)

    def end_update(self) -> Awaitable[None]:
        return self._control(None, SimEngine.end_update)

    def stamp(self, version: int, abort_all_requests: bool = True) -> Awaitable[str | None]:
        """The id of the weights the engine holds where the cluster reads weights (the
        ``today`` profile: contents.py), else None."""
        return self._control(
            "update_weight_version", lambda engine: engine.stamp(version, abort_all_requests)
        )

    def unload_adapter(self, adapter: str) -> Awaitable[None]:
        return self._control(None, lambda engine: engine.unload_adapter(adapter))

    async def health(self) -> None:  # spawned as a task: a gone process fails inside it
        await self._check().health()
