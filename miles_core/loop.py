"""The training loop, written once against a Runtime and a Cluster.

Two modes: fully_async (miles' fully-async rollout: a producer keeps generating,
weight updates abort what is in flight) and one_step_off (batch k+1 is
generated while step k trains; the update waits for both).

Where each decision is made:

- the producer keeps up to ``in_flight_groups`` prompt groups generating; a
  recycled prompt is regenerated before a new one is drawn;
- each sample goes to the live, synced engine with the fewest requests in
  flight (ties broken by the "router" random stream); an engine that fails a
  call is taken out of rotation until it is restarted and synced;
- the consumer drains ``rollout_batch_size`` groups through the data buffer at
  the ledger's published version;
- the step runs on every alive cell after the cell group's refresh (quorum,
  heals); the group's verdict retries or commits it;
- the weight update runs on the first alive cell in the order of
  miles_core.weight_update; a cell failure fails over to the next alive cell
  with the same reserved version; an engine failure drops that engine and
  retries; a restarted engine serves only after an update (or a sync of the
  published version, started as soon as it is up) stamped it; a sync never
  overlaps a step between its train and its update, when the trainer's weights
  are already newer than the published version;
- a run resumed from a checkpoint (a restored ledger) continues its version
  sequence, and every engine is synced to that version before it serves;
- with heartbeat_interval set, N missed heartbeats in a row fail a cell
  (paused during updates and healing, as miles' checker is); a failed cell's
  processes are stopped, so a false suspicion cannot leave a zombie.

Every action is recorded in the event history, stamped with ``rt.now()``.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miles_core.backend import (
    CellFailure,
    Cluster,
    ComponentFailure,
    EngineFailure,
    GenerateRequest,
    RouterFailure,
)
from miles_core.buffer import (
    BufferConfig,
    DataBuffer,
    Fate,
    Group,
    Sample,
    SampleStatus,
    UnusedHandler,
    Verdict,
)
from miles_core.cells import CellGroup, CellState, Decision, Heal, Outcome
from miles_core.errors import ConfigError, MilesCoreError, int_at_least
from miles_core.events import (
    AdapterUnloaded,
    AttemptBegan,
    AttemptEnded,
    BucketSent,
    CellStateChanged,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    EngineStateChanged,
    Event,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    GroupTrained,
    HealBegan,
    HealEnded,
    History,
    LedgerRestored,
    PromptDrawn,
    QuorumChanged,
    RunEnded,
    RunStarted,
    RunStatus,
    SampleGenerated,
    StepBegan,
    StepCommitted,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.runtime import Runtime, Task
from miles_core.sync import Lock, Notifier
from miles_core.transfer import (
    DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE,
    Bucket,
    TransferMode,
    lora_unit,
    plan_buckets,
    plan_transfer,
)
from miles_core.versions import VersionLedger
from miles_core.weight_update import (
    PauseEngines,
    PublishVersion,
    ResumeEngines,
    SendBucket,
    StampEngines,
    UnloadAdapter,
    UpdateKind,
    UpdateStep,
    WeightUpdate,
)

MODES = ("fully_async", "one_step_off")


@dataclass(frozen=True)
class LoopConfig:
    """The loop's flags (miles' names where the concept is the same)."""

    steps: int
    rollout_batch_size: int = 4
    n_samples_per_prompt: int = 2
    max_weight_staleness: int | None = None
    unused_samples_handler: UnusedHandler = UnusedHandler.RETRY
    capacity_factor: float = 2.0
    in_flight_groups: int | None = None
    """Producer budget in groups; defaults to rollout_batch_size (miles)."""
    update_weight_buffer_size: int = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE
    transfer_mode: TransferMode = TransferMode.BROADCAST
    max_step_attempts: int = 30
    max_route_attempts: int = 30
    lora_adapter: str | None = None
    """Train and push only this LoRA adapter (one atomic unit, unload-then-load)."""
    mode: str = "fully_async"
    """fully_async (a producer keeps generating, updates abort what is in flight) or
    one_step_off (batch k+1 is generated during step k and weights are updated when
    both are done: staleness 1, no aborts)."""
    heartbeat_interval: float | None = None
    """--trainer-heartbeat-checker-interval; None turns the monitor off."""
    heartbeat_timeout: float = 10.0
    """--trainer-heartbeat-checker-timeout: seconds a cell has to answer."""
    heartbeat_failure_threshold: int = 3
    """--trainer-heartbeat-checker-failure-threshold: misses in a row that fail a cell."""
    scenario: str = "custom"
    seed: int = 0

    def __post_init__(self) -> None:
        if not int_at_least(self.steps, 1):
            raise ConfigError("steps", f"got {self.steps!r}", "pass an integer >= 1")
        budget = self.in_flight_groups
        if budget is not None and not int_at_least(budget, 1):
            raise ConfigError("in_flight_groups", f"got {budget!r}", "pass an integer >= 1")
        if self.mode not in MODES:
            raise ConfigError("mode", f"got {self.mode!r}", f"choose one of {MODES}")
        if self.mode == "one_step_off" and self.capacity_factor < 1:
            raise ConfigError(
                "capacity_factor",
                f"{self.capacity_factor} holds less than one batch, but one_step_off puts a "
                "whole batch before it is drained",
                "use --async-data-buffer-capacity-factor >= 1 with one_step_off",
            )

    def buffer_config(self) -> BufferConfig:
        return BufferConfig(
            rollout_batch_size=self.rollout_batch_size,
            capacity_factor=self.capacity_factor,
            max_weight_staleness=self.max_weight_staleness,
            unused_samples_handler=self.unused_samples_handler,
            n_samples_per_prompt=self.n_samples_per_prompt,
        )


@dataclass
class RunReport:
    status: RunStatus
    reason: str
    steps_done: int
    versions: list[int] = field(default_factory=list)


class Orchestrator:
    """One run of the fully-async loop over one cluster."""

    def __init__(
        self,
        rt: Runtime,
        cluster: Cluster,
        config: LoopConfig,
        history: History | None = None,
        ledger: VersionLedger | None = None,
    ) -> None:
        """``ledger``: a ledger restored from a checkpoint, to resume its version sequence."""
        self.rt = rt
        self.cluster = cluster
        self.config = config
        self.history = history if history is not None else History()
        self.ledger = ledger if ledger is not None else VersionLedger()
        self.cells = CellGroup(
            cluster.num_cells,
            cluster.gpus_per_cell,
            max_step_attempts=config.max_step_attempts,
            max_route_attempts=config.max_route_attempts,
        )
        self.buffer = DataBuffer(config.buffer_config())
        units = cluster.units
        if config.lora_adapter is not None:  # the base model stays; the adapter travels whole
            units = (lora_unit(config.lora_adapter, cluster.lora_params),)
        self.buckets: tuple[Bucket, ...] = plan_buckets(units, config.update_weight_buffer_size)
        self.live: dict[str, bool] = {e: True for e in cluster.engine_ids}
        """Engines in rotation -> whether they serve the published weights."""
        self.load: dict[str, int] = {e: 0 for e in cluster.engine_ids}
        self._incarnation: dict[str, int] = {e: 0 for e in cluster.engine_ids}
        """Bumped when an engine comes back up: failures of an older process are stale news."""
        self._batch: list[Group] = []
        self._prompts = itertools.count()
        self._groups = itertools.count()
        self._updates = itertools.count()
        self._recycled: deque[int] = deque()
        self._in_flight: dict[int, int] = {}  # group_id -> prompt_id
        self._blocked: dict[int, int] = {}
        self._arrived = Notifier(rt)
        self._space = Notifier(rt)
        self._progress = Notifier(rt)
        self._engines_changed = Notifier(rt)
        self._stopping = False
        self._monitor_paused = 0
        self._update_lock = Lock(rt)
        self.versions: list[int] = []

    # -- recording ---------------------------------------------------------------

    def emit(self, event_type: type[Event], **fields: Any) -> None:
        self.history.append(event_type(t=self.rt.now(), **fields))

    def _record_cells(self) -> None:
        for tr in self.cells.take_transitions():
            self.emit(
                CellStateChanged, cell=tr.cell, old=tr.old.value, new=tr.new.value, reason=tr.reason
            )

    def _cell_failed(self, cell: int, reason: str) -> None:
        """A failed cell is marked errored and stopped: its processes are killed, so a
        cell that was only suspected (missed heartbeats) cannot come back as a zombie."""
        if self.cells.state(cell) in (CellState.PENDING, CellState.STOPPED):
            return  # already stopped (and maybe restarting): old news about a dead process
        self.cells.mark_failed(cell, reason)
        self.cells.stop(cell, reason)
        self.cluster.cell(cell).stop()
        self._record_cells()

    # -- control (operators and fault injectors call these) ------------------------

    def start_cell(self, cell: int, reason: str) -> None:
        """Bring a stopped cell back: it is healed at the next step's refresh."""
        self.cells.restart(cell, reason)
        self._record_cells()

    def engine_down(self, engine: str, reason: str) -> None:
        if self.live.pop(engine, None) is not None:
            self.emit(EngineStateChanged, engine=engine, up=False, reason=reason)
            self._engines_changed.notify()

    def engine_up(self, engine: str, reason: str) -> None:
        """A (re)started engine serves once it holds the published weights: at once if no
        update was ever started, else after a sync (or the next update) stamped it."""
        if engine in self.live:
            return
        self.emit(EngineStateChanged, engine=engine, up=True, reason=reason)
        self._incarnation[engine] = self._incarnation.get(engine, 0) + 1
        pristine = self.ledger.current is None and self.ledger.reservation is None
        self.live[engine] = pristine
        if not pristine:
            self.rt.spawn(self._sync(engine), f"sync-{engine}")
        self.load.setdefault(engine, 0)
        self._engines_changed.notify()

    # -- rollout -----------------------------------------------------------------------

    def _serving(self) -> list[str]:
        return [e for e, synced in self.live.items() if synced]

    async def _pick_engine(self) -> str:
        while not (candidates := self._serving()):
            await self._engines_changed.wait()
        load = self.load
        least = min([load[e] for e in candidates])
        return self.rt.rng("router").choice(sorted([e for e in candidates if load[e] == least]))

    async def _generate_sample(self, group_id: int, prompt_id: int, index: int) -> Sample:
        engine = await self._pick_engine()
        incarnation = self._incarnation[engine]
        self.load[engine] += 1
        request = GenerateRequest(group_id=group_id, prompt_id=prompt_id, sample=index)
        version, aborted, reward, payload = None, True, 0.0, None
        try:
            result = await self.cluster.router.generate(engine, request)
            version, aborted, reward = result.weight_version, result.aborted, result.reward
            payload = result.payload
        except (EngineFailure, RouterFailure) as failure:
            if isinstance(failure, EngineFailure) and self._incarnation[engine] == incarnation:
                self.engine_down(failure.engine, failure.reason)
        finally:
            self.load[engine] -= 1
        self.emit(
            SampleGenerated,
            group_id=group_id,
            prompt_id=prompt_id,
            sample=index,
            turn=0,
            engine=engine,
            version=version,
            aborted=aborted,
        )
        if aborted:
            return Sample(index, (), SampleStatus.ABORTED)
        return Sample(index, (version,), reward=reward, payload=payload)

    async def _generate_group(self, group_id: int, prompt_id: int) -> bool:
        n = self.config.n_samples_per_prompt
        tasks = [
            self.rt.spawn(self._generate_sample(group_id, prompt_id, i), f"g{group_id}s{i}")
            for i in range(n)
        ]
        samples = await self.rt.wait_all(tasks)
        group = Group(group_id, prompt_id, tuple(samples))
        del self._in_flight[group_id]
        queued = await self._put(group)
        self._progress.notify()
        return queued

    async def _put(self, group: Group) -> bool:
        """Put with backpressure; True when the group was queued for training."""
        while True:
            verdict = self.buffer.put(group)
            if verdict.fate is Fate.QUEUED:
                self._blocked.pop(group.group_id, None)
                self.emit(
                    GroupPut, group_id=group.group_id, prompt_id=group.prompt_id, fate="queued"
                )
                self._arrived.notify()
                return True
            if verdict.fate is not Fate.BLOCKED:
                self._unused(verdict)
                return False
            if group.group_id not in self._blocked:
                self._blocked[group.group_id] = group.prompt_id
                self.emit(
                    GroupPut, group_id=group.group_id, prompt_id=group.prompt_id, fate="blocked"
                )
            await self._space.wait()

    def _unused(self, verdict: Verdict) -> None:
        group, reason = verdict.group, str(verdict.reason)
        if verdict.detail:
            reason = f"{reason}:{verdict.detail}"
        if verdict.fate is Fate.RECYCLE:
            self._recycled.append(group.prompt_id)
            self.emit(
                GroupRecycled, group_id=group.group_id, prompt_id=group.prompt_id, reason=reason
            )
        else:
            self.emit(
                GroupDropped, group_id=group.group_id, prompt_id=group.prompt_id, reason=reason
            )

    def _next_prompt(self) -> int:
        if self._recycled:
            return self._recycled.popleft()
        prompt = next(self._prompts)
        self.emit(PromptDrawn, prompt_id=prompt)
        return prompt

    def _start_group(self) -> Any:
        group_id, prompt_id = next(self._groups), self._next_prompt()
        self._in_flight[group_id] = prompt_id
        return self.rt.spawn(self._generate_group(group_id, prompt_id), f"group-{group_id}")

    async def _rollout(self, groups: int) -> None:
        """One-step-off: generate until ``groups`` more groups are queued (aborted ones redone)."""
        queued = 0
        while queued < groups:
            tasks = [self._start_group() for _ in range(groups - queued)]
            queued += sum(await self.rt.wait_all(tasks))

    async def _producer(self) -> None:
        budget = self.config.in_flight_groups or self.config.rollout_batch_size
        while not self._stopping:
            while len(self._in_flight) + len(self._blocked) < budget:
                self._start_group()
            await self._progress.wait()

    async def _drain(self) -> list[Group]:
        batch: list[Group] = []
        while len(batch) < self.config.rollout_batch_size:
            current = self.ledger.current
            verdicts = self.buffer.get(current)
            if verdicts:
                self._space.notify()
            for verdict in verdicts:
                group = verdict.group
                if verdict.fate is Fate.TRAIN:
                    self.emit(
                        GroupGot,
                        group_id=group.group_id,
                        prompt_id=group.prompt_id,
                        current_version=current,
                        staleness=verdict.staleness,
                    )
                    batch.append(group)
                else:
                    self._unused(verdict)
            if not verdicts or verdicts[-1].fate is not Fate.TRAIN:
                if self.config.mode == "one_step_off":  # no producer: top the batch up now
                    await self._rollout(self.config.rollout_batch_size - len(batch))
                else:
                    self._progress.notify()  # recycled prompts may be regenerated now
                    await self._arrived.wait()
        return batch

    # -- training ---------------------------------------------------------------------

    async def _heal(self, heal: Heal, quorum_id: int) -> bool:
        self.emit(
            HealBegan,
            quorum_id=quorum_id,
            src_cell=heal.src_cell,
            dst_cell=heal.dst_cell,
            src_ranks=heal.src_ranks,
            dst_ranks=heal.dst_ranks,
        )
        try:
            await self.cluster.cell(heal.dst_cell).heal(heal)
        except CellFailure as failure:
            if failure.cell == heal.src_cell:
                self._cell_failed(heal.src_cell, f"died sending a checkpoint: {failure.reason}")
            else:
                self.cells.heal_failed(heal.dst_cell, failure.reason)
                self._cell_failed(heal.dst_cell, failure.reason)
            self.emit(HealEnded, dst_cell=heal.dst_cell, ok=False)
            return False
        self.cells.heal_done(heal.dst_cell)
        self._record_cells()
        self.emit(HealEnded, dst_cell=heal.dst_cell, ok=True)
        return True

    async def _refresh(self) -> None:
        self._monitor_paused += 1
        try:
            await self._refresh_cells()
        finally:
            self._monitor_paused -= 1

    async def _refresh_cells(self) -> None:
        """Refresh until the quorum is stable: a failed heal changes membership again."""
        while True:
            plan = self.cells.refresh()
            self._record_cells()
            if plan.reconfigure:
                self.emit(QuorumChanged, quorum_id=plan.quorum_id, members=plan.members)
            healed = [await self._heal(heal, plan.quorum_id) for heal in plan.heals]
            if all(healed):
                return

    async def _train_on(
        self, cell: int, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> Outcome:
        try:
            return await self.cluster.cell(cell).train(step, attempt, batch, members)
        except CellFailure:
            return Outcome.ERRORED

    async def _train(self, step: int, batch: list[Group]) -> None:
        self.emit(StepBegan, step=step)
        while True:
            await self._refresh()
            attempt = self.cells.begin_attempt(step)
            self.emit(
                AttemptBegan,
                step=step,
                attempt=attempt.attempt,
                quorum_id=attempt.quorum_id,
                cells=attempt.cells,
            )
            tasks = [
                self.rt.spawn(
                    self._train_on(c, step, attempt.attempt, batch, attempt.cells), f"train-{c}"
                )
                for c in attempt.cells
            ]
            outcomes = await self.rt.wait_all(tasks)
            result = self.cells.finish_attempt(dict(zip(attempt.cells, outcomes, strict=True)))
            for cell in result.errored:
                self._cell_failed(cell, f"step {step} attempt {attempt.attempt} errored")
            self.emit(
                AttemptEnded,
                step=step,
                attempt=attempt.attempt,
                decision=result.decision.value,
                normal=result.normal,
                discarded=result.discarded,
                errored=result.errored,
            )
            if result.decision is Decision.COMMIT:
                break
        self.emit(StepCommitted, step=step, attempt=attempt.attempt, n_groups=len(batch))
        for group in batch:
            self.emit(GroupTrained, group_id=group.group_id, prompt_id=group.prompt_id, step=step)

    # -- failure detection ------------------------------------------------------------

    async def _heartbeat(self, cell: int) -> bool:
        reply = self.rt.spawn(self.cluster.cell(cell).heartbeat(), f"heartbeat-{cell}")
        answered = (
            await self.rt.wait_any([reply, self.rt.timer(self.config.heartbeat_timeout)]) == 0
        )
        if not answered:
            reply.cancel("heartbeat timed out")
        return answered

    async def _monitor(self, interval: float) -> None:
        """miles' trainer heartbeat checker: N missed beats in a row fail a cell.

        Paused while weights are updated or cells healed, as in miles, so that a
        busy cell is not taken for a dead one.
        """
        misses = {cell: 0 for cell in range(self.cells.num_cells)}
        while not self._stopping:
            await self.rt.sleep(interval)
            if self._monitor_paused or len(self.cells.alive()) < 2:
                continue
            for cell in self.cells.alive():
                answered = await self._heartbeat(cell)
                if self._monitor_paused or self.cells.state(cell) is not CellState.ALIVE:
                    break
                misses[cell] = 0 if answered else misses[cell] + 1
                if misses[cell] >= self.config.heartbeat_failure_threshold:
                    misses[cell] = 0
                    self._cell_failed(
                        cell, f"missed {self.config.heartbeat_failure_threshold} heartbeats"
                    )

    # -- weight updates -------------------------------------------------------------------

    async def _call_engine(self, engine: str, method: str, *args: Any) -> EngineFailure | None:
        try:
            await getattr(self.cluster.engine(engine), method)(*args)
        except EngineFailure as failure:
            return failure
        return None

    async def _each_engine(self, engines: tuple[str, ...], method: str, *args: Any) -> None:
        """Call every engine at once; raise the first failure (engine order) once all ended."""
        tasks = [
            self.rt.spawn(self._call_engine(e, method, *args), f"{method}-{e}") for e in engines
        ]
        failures = [f for f in await self.rt.wait_all(tasks) if f is not None]
        if failures:
            raise failures[0]

    async def _run_step(self, update_id: int, cell: int, step: UpdateStep) -> None:
        if isinstance(step, PauseEngines):
            await self._each_engine(step.engines, "pause")
            self.emit(EnginesPaused, update_id=update_id, engines=step.engines)
        elif isinstance(step, SendBucket):
            bucket = self.buckets[step.bucket]
            plan = plan_transfer(self.config.transfer_mode, (bucket,), step.engines)
            for transfer in plan.transfers:  # broadcast: one call; p2p: one per engine
                await self.cluster.transport.send_bucket(update_id, cell, bucket, transfer.targets)
            self.emit(
                BucketSent,
                update_id=update_id,
                bucket=step.bucket,
                n_buckets=step.n_buckets,
                engines=step.engines,
                nbytes=bucket.nbytes,
            )
        elif isinstance(step, StampEngines):
            await self.cluster.cell(cell).ping()  # the updater's rank 0 stamps: it must be alive
            await self._each_engine(step.engines, "stamp", step.version)
            for engine in step.engines:
                self.emit(EngineStamped, update_id=update_id, engine=engine, version=step.version)
        elif isinstance(step, PublishVersion):
            self.ledger.publish(step.version, f"cell-{cell}")
            self.versions.append(step.version)
            self.emit(VersionPublished, update_id=update_id, version=step.version, updater=cell)
        elif isinstance(step, ResumeEngines):
            for engine in step.engines:
                if engine in self.live:
                    self.live[engine] = True
            await self._each_engine(step.engines, "resume")
            self.emit(EnginesResumed, update_id=update_id, engines=step.engines)
            self._engines_changed.notify()
        elif isinstance(step, UnloadAdapter):
            await self._each_engine(step.engines, "unload_adapter", step.adapter)
            self.emit(
                AdapterUnloaded, update_id=update_id, adapter=step.adapter, engines=step.engines
            )

    async def _train_and_update(
        self, step: int, batch: list[Group], next_batch: Task[Any] | None = None
    ) -> None:
        """Train a step, then update the weights, holding the weights lock throughout.

        A sync of a restarted engine sends the trainer's current weights stamped
        with the published version, which is right only while no step sits
        between its optimizer step and its update. The lock makes those windows
        exclusive (the real backend's checksums caught a sync racing a train step
        and sending half-stepped weights; the simulator has no weights to see it).

        One-step-off waits for ``next_batch`` before updating, so as not to abort
        it, but only while some engine serves: with none serving (a restarted
        engine waits for this very lock to be synced) the batch cannot finish,
        and updating now is what lets it go on.
        """
        await self._update_lock.acquire()
        try:
            await self._train(step, batch)
            self._batch = []
            while next_batch is not None and not next_batch.done() and self._serving():
                await self.rt.wait_any([next_batch, self._engines_changed.wait()])
            self._monitor_paused += 1
            try:
                while not self.live:  # every engine is down: wait for one to come back
                    await self._engines_changed.wait()
                await self._route_update(publish=True)
            finally:
                self._monitor_paused -= 1
        finally:
            self._update_lock.release()

    async def _sync(self, engine: str) -> None:
        """Bring a restarted engine to the published weights before it serves."""
        await self._update_lock.acquire()
        try:
            if not self.live.get(engine, True) and not self._stopping:
                if self.ledger.current is None:  # the update under way was abandoned
                    self.live[engine] = True
                    self._engines_changed.notify()
                else:
                    await self._route_update(publish=False, only=(engine,))
        except MilesCoreError:
            pass  # no cell can send now: the next full update includes the engine
        finally:
            self._update_lock.release()

    async def _route_update(self, publish: bool, only: tuple[str, ...] | None = None) -> None:
        """Run one update on the first alive cell, failing over; ``publish=False`` re-sends
        the published version to ``only`` (a sync of restarted engines)."""
        call = self.cells.routed("update_weights" if publish else "sync_engines")
        while True:
            cell = call.target()
            engines = tuple(sorted(e for e in self.live if only is None or e in only))
            if not engines:
                return  # a sync whose engine died again
            if publish:
                version = self.ledger.reserve(f"cell-{cell}")
            else:
                version = self.ledger.current
                assert version is not None
            update_id = next(self._updates)
            incarnations = {e: self._incarnation[e] for e in engines}
            adapter = self.config.lora_adapter
            kind = UpdateKind.FULL if adapter is None else UpdateKind.LORA
            update = WeightUpdate(version, engines, len(self.buckets), kind, adapter, publish)
            self.emit(
                UpdateBegan,
                update_id=update_id,
                version=version,
                updater=cell,
                kind=update.kind.value,
                n_buckets=len(self.buckets),
                engines=engines,
                publishes=publish,
            )
            try:
                while (step := update.next_step()) is not None:
                    await self._run_step(update_id, cell, step)
                    update.complete(step)
                return
            except ComponentFailure as failure:
                if publish:
                    self.ledger.abandon(version)
                self.emit(UpdateAborted, update_id=update_id, version=version, reason=str(failure))
                if isinstance(failure, EngineFailure):
                    if self._incarnation.get(failure.engine) == incarnations.get(failure.engine):
                        self.engine_down(failure.engine, failure.reason)
                    # else: the process that failed was replaced meanwhile; retry with the new one
                else:
                    call.failed(failure.reason)
                    self._cell_failed(cell, failure.reason)

    async def _one_step_off(self) -> None:
        """Batch k+1 is generated while step k trains; the update waits for both, so it
        never interrupts generation and every batch is exactly one version old."""
        rbs = self.config.rollout_batch_size
        next_batch = self.rt.spawn(self._rollout(rbs), "rollout-0")
        for step in range(self.config.steps):
            await next_batch
            self._batch = await self._drain()
            if step + 1 < self.config.steps:
                next_batch = self.rt.spawn(self._rollout(rbs), f"rollout-{step + 1}")
            await self._train_and_update(step, self._batch, next_batch)

    # -- the run --------------------------------------------------------------------------

    def steps_done(self) -> int:
        return sum(isinstance(e, StepCommitted) for e in self.history)

    def outstanding(self) -> tuple[int, ...]:
        """Prompts drawn but neither trained nor dropped: queued, in the batch, or generating."""
        held = [g.prompt_id for g in (*self.buffer.queued(), *self._batch)]
        waiting = [*self._recycled, *self._in_flight.values(), *self._blocked.values()]
        return tuple(sorted([*held, *waiting]))

    async def run(self) -> RunReport:
        c = self.config
        self.emit(
            RunStarted,
            seed=c.seed,
            scenario=c.scenario,
            engines=tuple(sorted(self.live)),
            num_cells=self.cells.num_cells,
            max_weight_staleness=c.max_weight_staleness,
        )
        if self.ledger.current is not None:  # resumed: engines hold their initial weights
            self.emit(LedgerRestored, version=self.ledger.current)
            for engine in sorted(self.live):
                del self.live[engine]
                self.engine_up(engine, "resumed from a checkpoint: synced before it serves")
        if c.mode == "fully_async":
            producer = self.rt.spawn(self._producer(), "producer")
        if c.heartbeat_interval is not None:
            monitor = self.rt.spawn(self._monitor(c.heartbeat_interval), "heartbeat-monitor")
        status, reason = RunStatus.COMPLETED, f"{c.steps} steps"
        try:
            if c.mode == "one_step_off":
                await self._one_step_off()
            else:
                for step in range(c.steps):
                    self._batch = await self._drain()
                    await self._train_and_update(step, self._batch)
        except MilesCoreError as error:
            status, reason = RunStatus.FAILED, f"{type(error).__name__}: {error}"
        self._stopping = True
        if c.mode == "fully_async":
            producer.cancel("run ended")
        if c.heartbeat_interval is not None:
            monitor.cancel("run ended")
        self.emit(RunEnded, status=status, reason=reason, outstanding_prompts=self.outstanding())
        return RunReport(status, reason, self.steps_done(), list(self.versions))
