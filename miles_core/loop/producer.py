"""The producer: prompts become groups of samples, groups go through the data buffer.

Where each decision is made:

- the producer's budget is max(1, async_max_concurrent_samples //
  n_samples_per_prompt) prompt groups, rollout_batch_size when that flag is unset
  (miles' FullyAsyncRolloutFn._max_in_flight_groups); by
  --rollout-submission-granularity (miles/rollout/submission_scheduler.py) a new
  group goes out when a whole group returns (group), or once n samples have
  finished, whichever groups they came from (sample, the fully-async default:
  ``SampleBackfillSubmission``, at most budget x n samples in flight); either way
  a group whose put the full buffer blocks keeps its room until the put lands (miles'
  ``_worker_loop`` stops submitting altogether while a put waits; here the rest of
  the budget keeps generating);
- a recycled prompt is generated again before a new one is drawn, as miles'
  ``RolloutDataSourceWithBuffer.get_samples`` takes its buffer first
  (miles/rollout/data_source.py);
- each sample goes to the engine the supervisor picks; a request whose engine
  fails ends its sample (the group is then aborted and goes to the unused
  handler); one the router fails is sent again --request-retry-interval later,
  to the engine picked then, up to --request-max-retries tries in all (miles'
  ``_post``: 60, 1 s apart), and after the last the run fails
  (RequestFailedError), as miles' worker dies with ``_post``'s error; one the
  engine refuses itself (a 400: an input longer than its context) ends its
  sample refused, the engine still in rotation, and its group is dropped
  (miles' ``_post`` would try it 60 times and fail the run);
- a full buffer blocks the put until a get makes space (backpressure): nothing
  accepted is lost;
- the consumer drains ``rollout_batch_size`` groups through the buffer at the
  ledger's published version; what the buffer refuses goes to the unused
  handler (retry recycles the prompt, drop drops it with its reason); the batch
  is then sorted by prompt (miles' _drain sorts by sample index), so its order
  does not depend on which group finished first;
- a sample records every version its tokens came from (a request an update
  retracted or froze has several), so staleness counts from the oldest;
- an answer under a version the control plane cannot trust (the router could
  not read it, or it is below the process's last stamp or beyond any version
  issued: miles_core.versions ``untrusted_version``) ends its sample out of
  sync, unused, and its engine is re-synced (supervision.py ``out_of_sync``).
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from miles_core.backend import (
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RequestRefused,
    RouterFailure,
    VersionOutOfSync,
)
from miles_core.buffer import Fate, Group, Sample, SampleStatus, Verdict
from miles_core.errors import RequestFailedError
from miles_core.events import (
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    GroupStarted,
    PromptDrawn,
    RequestRetried,
    SampleGenerated,
)
from miles_core.kinds import PutFate, SampleOutcome, SubmissionGranularity
from miles_core.loop.config import BATCH_MODES
from miles_core.loop.context import RunContext
from miles_core.loop.gate import ProducerGate
from miles_core.loop.supervision import EngineSupervisor
from miles_core.loop.version_rules import VersionRules, kv_namespace
from miles_core.pause_filter import declared_start
from miles_core.staleness_gate import StalenessPolicy
from miles_core.sync import Notifier, join_all
from miles_core.versions import untrusted_version


class PromptCursor:
    """The data cursor: hands out prompt ids in order and says which comes next (what a save
    holds of the data set: miles' ``sample_group_index``)."""

    def __init__(self, start: int = 0) -> None:
        self.position = start

    def __iter__(self) -> PromptCursor:
        return self

    def __next__(self) -> int:
        prompt = self.position
        self.position += 1
        return prompt


class Producer:
    def __init__(self, ctx: RunContext, engines: EngineSupervisor) -> None:
        self.ctx = ctx
        self.engines = engines
        self.batch: list[Group] = []
        """The batch being trained (held outside the buffer until its step commits)."""
        self._drained: list[Group] = []
        """The groups a drain has taken from the buffer so far: held by nobody else until it
        returns, so outstanding if the run ends while it waits for the rest."""
        self._prompts = PromptCursor()
        self._groups = itertools.count()
        self.recycled: deque[int] = deque()
        """Prompts waiting to be generated again, oldest first."""
        self._in_flight: dict[int, int] = {}  # group_id -> prompt_id
        self._blocked: dict[int, int] = {}
        self._samples_in_flight = 0
        """Samples submitted whose request has not ended (SampleBackfillSubmission's count)."""
        config = ctx.config
        self._backfill = config.submission_granularity is SubmissionGranularity.SAMPLE
        self._n = config.n_samples_per_prompt
        self._room = config.in_flight_groups * self._n
        """Samples in flight at most, under sample granularity."""
        self._arrived = Notifier(ctx.rt)
        self._space = Notifier(ctx.rt)
        self._progress = Notifier(ctx.rt)
        gated = config.staleness_policy is StalenessPolicy.GATE_SUBMISSION
        self.gate = ProducerGate(ctx) if gated else None
        self.rules = VersionRules(config)
        """miles' weight-version hygiene, under today (loop/version_rules.py)."""
        self._namespaced = config.radix_namespaced
        self._rollouts = 0
        """Batches asked for so far: the rollout id a namespace names."""
        self._namespace = kv_namespace(0) if self._namespaced else None
        self._namespaces: dict[int, str] = {}
        """Each group's prefix-cache namespace, as it was submitted (miles'
        ``stamp_kv_cache_namespace``): kept by its samples, retried ones included."""
        """AReaL's submission gate (--staleness-policy gate_submission), else None."""

    # -- generation ---------------------------------------------------------------------

    async def _generate_sample(self, group_id: int, prompt_id: int, index: int) -> Sample:
        try:  # one coroutine per request, not one more around it: 512 requests a step at 64x256
            ctx = self.ctx
            engines = self.engines
            namespace = self._namespaces.get(group_id)  # None unless --namespaced-radix-cache
            request = GenerateRequest(group_id, prompt_id, index, 0, namespace)  # by position
            declares = ctx.config.pause_abort_below_start_weight_version
            tries = 0
            while True:  # a try the router failed is sent again later, to the engine then picked
                picked = engines.pick_now() if ctx.engines.serving() else await engines.pick()
                engine, incarnation = picked
                engines.acquire(engine)
                sent = ctx.rt.now()
                if declares:  # the version published as it is sent (miles_core/pause_filter.py)
                    start = declared_start(ctx.config, ctx.ledger.current)
                    request = GenerateRequest(group_id, prompt_id, index, 0, namespace, start)
                stamp = engines.stamp_of(engine, incarnation)
                outcome, result, routing = SampleOutcome.ENGINE_FAILED, None, None
                refusal_status = SampleStatus.ABORTED
                broken = None  # miles' version rules (loop/version_rules.py): the run fails
                try:
                    result = await ctx.cluster.router.generate(engine, incarnation, request)
                    outcome = SampleOutcome.ABORTED if result.aborted else SampleOutcome.COMPLETED
                    if outcome is SampleOutcome.COMPLETED and result.incarnation is None:
                        broken = self.rules.spans(engine, incarnation, stamp, result)
                        if broken is None:
                            outcome = self._checked(engine, incarnation, stamp, result)
                        else:
                            outcome = SampleOutcome.OUT_OF_SYNC
                except VersionOutOfSync as mismatch:
                    outcome = SampleOutcome.OUT_OF_SYNC
                    broken = self.rules.unreadable(engine, incarnation, mismatch)
                    if broken is None:
                        engines.out_of_sync(engine, incarnation, mismatch.reason)
                except EngineFailure as failure:
                    engines.failed(engine, incarnation, failure.reason)
                except RequestRefused as refusal:
                    outcome, refusal_status = (
                        SampleOutcome.REFUSED,
                        self._refused(engine, incarnation, refusal),
                    )
                except RouterFailure as failure:
                    outcome, routing = SampleOutcome.ROUTER_FAILED, failure
                finally:
                    engines.release(engine)
                tries += 1
                if routing is None:
                    break
                if not await self._retry(request, engine, incarnation, sent, tries, routing):
                    break
            if result is not None and result.incarnation is not None:  # an orphan answered
                engine, incarnation = result.engine, result.incarnation
            self._record(request, engine, incarnation, sent, outcome, result)
            if broken is not None:
                raise broken
            if routing is not None:  # the last try failed too: miles' _post re-raises
                raise self._request_failed(request, tries, routing)
            if outcome is SampleOutcome.REFUSED:
                return Sample(index, (), refusal_status)
            if result is None or outcome is not SampleOutcome.COMPLETED:
                return Sample(index, (), SampleStatus.ABORTED)
            versions = result.versions or (result.weight_version,)
            # by position, in field order (a type call with keywords builds a dict of them)
            return Sample(
                index,
                versions,
                SampleStatus.COMPLETED,
                result.reward,
                result.kept_kv,
                result.payload,
            )
        finally:  # ended, failed or cancelled: its room is free (sample_done_callback)
            self._samples_in_flight -= 1
            if self._backfill and self._samples_in_flight == self._room - self._n:
                self._progress.notify()  # room for one more group just opened: wake run()

    def _checked(
        self, engine: str, incarnation: int, stamp: int | None, result: GenerateResult
    ) -> SampleOutcome:
        """COMPLETED, or OUT_OF_SYNC when the versions the process reported are not ones it
        can hold: its spans against the stamp it was resumed with when the request was sent,
        and the version it ended under against the stamp it was resumed with since (an answer
        arriving after a resume was generated after it)."""
        engines = self.engines
        reported = result.versions or (result.weight_version,)
        published = self.ctx.ledger.current
        why = untrusted_version(reported, stamp, published)
        now = engines.stamp_of(engine, incarnation)
        if why is None and now is not None and now != stamp:
            why = untrusted_version(reported[-1:], now, published)
        if why is None:
            return SampleOutcome.COMPLETED
        engines.out_of_sync(engine, incarnation, why)
        return SampleOutcome.OUT_OF_SYNC

    def _refused(self, engine: str, incarnation: int, refusal: RequestRefused) -> SampleStatus:
        """The engine refused the request itself (a 400: an input longer than its context):
        the request is at fault, not the engine, which stays in rotation; the sample is
        refused and its group dropped (``DataBuffer.put``). Taken for the engine's failure,
        one over-long prompt, recycled and sent to engine after engine, takes them all down
        in turn (NeMo-RL #3938)."""
        del engine, incarnation, refusal
        return SampleStatus.REFUSED

    def _record(
        self,
        request: GenerateRequest,
        engine: str,
        incarnation: int,
        sent: float,
        outcome: SampleOutcome,
        result: GenerateResult | None,
    ) -> None:
        """The request's last try, as SampleGenerated; none once the run has ended. Its group
        task was cancelled then, but a cancel reaches the group's sample tasks only when the
        group next runs, and an answer that arrived first would be recorded after RunEnded
        (CI saw it on the CPU backend: a sibling of the sample whose error ended the run)."""
        ctx = self.ctx
        if ctx.stopping:
            return
        ctx.history.append(  # built here, not through emit's keyword dict: once per request
            SampleGenerated(
                t=ctx.rt.now(),
                group_id=request.group_id,
                prompt_id=request.prompt_id,
                sample=request.sample,
                turn=0,
                engine=engine,
                incarnation=incarnation,
                version=result.weight_version if result else None,
                versions=result.versions if result else (),
                kept_kv=result.kept_kv if result else False,
                cached_versions=result.cached_versions if result else (),
                outcome=outcome,
                sent=sent,
                engine_seconds=result.engine_seconds if result else None,
            )
        )

    async def _retry(
        self,
        request: GenerateRequest,
        engine: str,
        incarnation: int,
        sent: float,
        tries: int,
        failure: RouterFailure,
    ) -> bool:
        """A try failed at the router: unless it was the last (--request-max-retries), record
        it and wait --request-retry-interval before the next (miles' ``_post``: 60 tries, 1 s
        apart), so that a router outage costs time, not groups, and never a hot loop."""
        ctx = self.ctx
        if tries >= ctx.config.request_max_retries:
            return False
        ctx.history.append(
            RequestRetried(
                t=ctx.rt.now(),
                group_id=request.group_id,
                prompt_id=request.prompt_id,
                sample=request.sample,
                engine=engine,
                incarnation=incarnation,
                attempt=tries,
                sent=sent,
                reason=failure.reason,
            )
        )
        await ctx.rt.sleep(ctx.config.request_retry_interval)
        return True

    def _request_failed(
        self, request: GenerateRequest, tries: int, failure: RouterFailure
    ) -> RequestFailedError:
        """What ends the run after a request's last try: miles' worker dies with the error of
        ``_post``, and the step with it (``FullyAsyncRolloutFn._next_group``)."""
        interval = self.ctx.config.request_retry_interval
        error = RequestFailedError(
            f"the request for sample {request.sample} of group {request.group_id} failed at "
            f"the router on all {tries} tries, {interval:g}s apart ({failure.reason}); raise "
            "--request-max-retries or --request-retry-interval to outlast longer outages"
        )
        error.__cause__ = failure
        return error

    async def _generate_group(self, group_id: int, prompt_id: int) -> bool:
        rt = self.ctx.rt
        n = self.ctx.config.n_samples_per_prompt
        tasks = [
            rt.spawn(self._generate_sample(group_id, prompt_id, i), f"g{group_id}s{i}", eager=True)
            for i in range(n)
        ]
        samples = await join_all(rt, tasks, "its group was cancelled")
        self._namespaces.pop(group_id, None)
        group = Group(group_id, prompt_id, tuple(samples))
        del self._in_flight[group_id]
        queued = await self._put(group)
        if self.gate is not None:
            self.gate.resolved(group_id, queued)
        self._progress.notify()
        return queued

    def _next_prompt(self) -> int:
        if self.recycled:
            return self.recycled.popleft()
        prompt = next(self._prompts)
        self.ctx.emit(PromptDrawn, prompt_id=prompt)
        return prompt

    def _start_group(self) -> Any:
        group_id, prompt_id = next(self._groups), self._next_prompt()
        self._in_flight[group_id] = prompt_id
        self._samples_in_flight += self._n
        if self._namespace is not None:
            self._namespaces[group_id] = self._namespace
        if self.gate is not None:
            self.gate.submitted(group_id)
        self.ctx.emit(GroupStarted, group_id=group_id, prompt_id=prompt_id)
        return self.ctx.spawn(self._generate_group(group_id, prompt_id), f"group-{group_id}")

    async def run(self) -> None:
        """fully_async: keep the budget of groups generating, for the whole run (under
        gate_submission, as far as the gate admits; the gate's counts: loop/gate.py)."""
        ctx, gate = self.ctx, self.gate
        budget = ctx.config.in_flight_groups
        if gate is not None:
            gate.armed()
        while not ctx.stopping:
            started = 0
            while self._has_room(budget) and (gate is None or gate.admits()):
                self._start_group()
                started += 1
            if gate is not None:
                gate.pass_ended(started, self._has_room(budget))
            await self._progress.wait()

    def _has_room(self, budget: int) -> bool:
        """Room for one more group (``has_capacity`` of miles' two submission schedulers)."""
        if self._backfill:
            return self._samples_in_flight + self._n <= self._room
        return len(self._in_flight) + len(self._blocked) < budget

    async def rollout(self, groups: int) -> None:
        """one_step_off and sync: generate until ``groups`` more groups are queued (aborted
        ones redone)."""
        queued = 0
        while queued < groups:
            tasks = [self._start_group() for _ in range(groups - queued)]
            queued += sum(bool(q) for q in await self.ctx.rt.wait_all(tasks))

    # -- the buffer ---------------------------------------------------------------------

    async def _put(self, group: Group) -> bool:
        """Put with backpressure; True when the group was queued for training. A blocked
        group holds its room in the budget (its samples' under sample granularity) until
        its put lands."""
        ctx = self.ctx
        try:
            while True:
                verdict = ctx.buffer.put(group)
                if verdict.fate is Fate.QUEUED:
                    ctx.emit(
                        GroupPut,
                        group_id=group.group_id,
                        prompt_id=group.prompt_id,
                        fate=PutFate.QUEUED,
                    )
                    self._arrived.notify()
                    return True
                if verdict.fate is not Fate.BLOCKED:
                    self._unused(verdict)
                    return False
                if group.group_id not in self._blocked:
                    self._blocked[group.group_id] = group.prompt_id
                    self._samples_in_flight += self._n
                    ctx.emit(
                        GroupPut,
                        group_id=group.group_id,
                        prompt_id=group.prompt_id,
                        fate=PutFate.BLOCKED,
                    )
                await self._space.wait()
        finally:
            if self._blocked.pop(group.group_id, None) is not None:
                self._samples_in_flight -= self._n

    def _unused(self, verdict: Verdict) -> None:
        group, reason = verdict.group, str(verdict.reason)
        if verdict.detail:
            reason = f"{reason}:{verdict.detail}"
        event = GroupRecycled if verdict.fate is Fate.RECYCLE else GroupDropped
        if verdict.fate is Fate.RECYCLE:
            self.recycled.append(group.prompt_id)
        self.ctx.emit(event, group_id=group.group_id, prompt_id=group.prompt_id, reason=reason)

    async def drain(self) -> list[Group]:
        """The next batch: ``rollout_batch_size`` groups the buffer lets through now."""
        ctx = self.ctx
        self.rules.rollout(ctx.ledger.current)  # miles' RolloutExecutor.get counts a rollout
        if self._namespaced:  # FullyAsyncRolloutFn.__call__: this train call's namespace
            self._namespace = kv_namespace(self._rollouts)
        self._rollouts += 1
        batch: list[Group] = []
        self._drained = batch
        if self.gate is not None:  # the consumer's version advances: the gate may open
            self.gate.drain_began()
            self._progress.notify()
        while len(batch) < ctx.config.rollout_batch_size:
            current = ctx.ledger.current
            verdicts = ctx.buffer.get(current)
            if verdicts:
                self._space.notify()
            for verdict in verdicts:
                group = verdict.group
                if verdict.fate is Fate.TRAIN:
                    ctx.emit(
                        GroupGot,
                        group_id=group.group_id,
                        prompt_id=group.prompt_id,
                        current_version=current,
                        staleness=verdict.staleness,
                    )
                    batch.append(group)
                else:
                    self._unused(verdict)
                    if self.gate is not None:
                        self.gate.refused_at_get()
            if not verdicts or verdicts[-1].fate is not Fate.TRAIN:
                if ctx.config.mode in BATCH_MODES:  # no producer: top the batch up now
                    await self.rollout(ctx.config.rollout_batch_size - len(batch))
                else:
                    self._progress.notify()  # recycled prompts may be regenerated now
                    await self._arrived.wait()
        batch.sort(key=lambda g: g.prompt_id)
        self._drained = []  # the caller holds it now, as the batch
        return batch

    # -- saves and resumes ----------------------------------------------------------------

    def saved(self) -> tuple[int, tuple[int, ...]]:
        """What a save holds of the data: the cursor (the next new prompt) and every prompt
        drawn and neither trained nor dropped (queued, recycled, generating, blocked, in a
        batch), sorted: they are generated again after a resume (miles_core.saves)."""
        return self._prompts.position, tuple(sorted(set(self.outstanding())))

    def restore(self, cursor: int, pending: tuple[int, ...]) -> None:
        """Continue a save's data: new prompts from ``cursor``, ``pending`` generated first, as
        recycled prompts are (miles' ``RolloutDataSource.load`` restores only the cursor)."""
        self._prompts = PromptCursor(cursor)
        self.recycled = deque(pending)

    # -- what is left at the end --------------------------------------------------------------

    def outstanding(self) -> tuple[int, ...]:
        """Prompts drawn but neither trained nor dropped: queued, in the batch or the one being
        drained, or generating."""
        held = [g.prompt_id for g in (*self.ctx.buffer.queued(), *self.batch, *self._drained)]
        waiting = [*self.recycled, *self._in_flight.values(), *self._blocked.values()]
        return tuple(sorted([*held, *waiting]))
