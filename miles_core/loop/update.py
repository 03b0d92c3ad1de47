"""The weight updater: miles_core.weight_update's sequence, run on the first alive cell.

Where each decision is made:

- an update (or the sync of restarted engines) is planned for the engine
  processes live when it begins, each addressed by its incarnation; a bucket
  is recorded when the world's transport says it arrived, a stamp when the
  engine answered;
- its cell sends over the weight-update group it kept from its last update, made
  afresh only where miles makes it (miles_core.update_connections: a new engine
  process, a refresh since, a member lost, other engines); a kept group that names
  a replaced process fails the cell, as miles' call to the old actor raises;
- a process replaced during the update did not receive its buckets: its stamp
  is refused (EngineFailure) and the update is retried, now with the new
  process, before anything is published;
- a cell failure fails over to the next alive cell with the same reserved
  version; an engine failure takes the engine out and retries without it;
- once published, the update is done: an engine that fails to resume leaves
  rotation and nothing is published twice;
- a sync never overlaps a step between its train and its update (the weights
  lock spans both), since it sends the trainer's current weights under the
  published version;
- one-step-off waits for the next batch before updating, so as not to abort
  it, but only while some engine serves (a restarted engine may be waiting for
  this very lock to be synced, and the batch needs it).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, overload

from miles_core.backend import (
    CellFailure,
    ComponentFailure,
    EngineFailure,
    RequestRefused,
    SessionAlreadyOpen,
)
from miles_core.buffer import Group
from miles_core.errors import FlushTimeoutError, NoAliveCellError, RetriesExhaustedError
from miles_core.events import (
    AdapterUnloaded,
    BucketReceived,
    EnginesFlushed,
    EnginesPaused,
    EnginesPausedAbortingBelow,
    EnginesResumed,
    EngineStamped,
    Event,
    FlushRefused,
    UpdateAborted,
    UpdateBegan,
    UpdateGroupConnected,
    UpdateGroupMade,
    UpdateSessionClosed,
    UpdateSessionOpened,
    VersionPublished,
    WeightsChecked,
)
from miles_core.kinds import AbortCause, PauseMode
from miles_core.loop import engine_calls
from miles_core.loop.cell_isolation import CellIsolation
from miles_core.loop.context import RunContext
from miles_core.loop.engine_calls import EngineCall
from miles_core.loop.supervision import EngineSupervisor
from miles_core.loop.train import Trainer
from miles_core.loop.window import UpdateWindow
from miles_core.pause_filter import pause_threshold
from miles_core.runtime import Task
from miles_core.transfer import Bucket, TransferMode, lora_unit, plan_buckets, plan_transfer
from miles_core.weight_update import (
    BeginUpdate,
    EndUpdate,
    FlushCache,
    PauseEngines,
    PublishVersion,
    ResumeEngines,
    SendBucket,
    StampEngines,
    UnloadAdapter,
    UpdateAction,
    UpdateKind,
    WeightUpdate,
)

P2P_TRANSFER_TIMEOUT = 30.0
"""miles' --p2p-transfer-timeout default: how long ``wait_transfers`` waits for each p2p
send (only with --miles-bug-p2p-failures-logged; otherwise every send is waited for)."""


Answered = Callable[[str, "str | None"], None]
"""Told each engine that answered a call, and what it answered (engine_calls.EngineCall)."""


def _names(engines: list[str]) -> Answered:
    """An ``Answered`` that keeps the names of the engines that answered, in ``engines``."""
    return lambda engine, _answer: engines.append(engine)


class _CallNames(Sequence[str]):
    """The task names of an update's calls, "method-engine", made only if asked for (the
    simulator asks only for a call that waits)."""

    def __init__(self, method: str, engines: tuple[str, ...]) -> None:
        self._method, self._engines = method, engines

    def __len__(self) -> int:
        return len(self._engines)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [f"{self._method}-{e}" for e in self._engines[i]]
        return f"{self._method}-{self._engines[i]}"


class Updater:
    def __init__(
        self,
        ctx: RunContext,
        engines: EngineSupervisor,
        trainer: Trainer,
        replace: Callable[[str, int, str], None] = lambda engine, incarnation, reason: None,
    ) -> None:
        self.ctx = ctx
        self.engines = engines
        self.trainer = trainer
        self.replace = replace
        """Fault tolerance's replacement of a process now (EngineHealthMonitor.replace)."""
        self.isolation = CellIsolation(ctx, engines, replace)
        """The today profile's per-engine deadline and give-up (cell_isolation.py)."""
        self.window = UpdateWindow(ctx, engines, replace)
        """Today's miles: when a full update's window opens, what its abort stops."""
        units = ctx.cluster.units
        if ctx.config.lora_adapter is not None:  # the base model stays; the adapter travels whole
            units = (lora_unit(ctx.config.lora_adapter, ctx.cluster.lora_params),)
        self.buckets: tuple[Bucket, ...] = plan_buckets(units, ctx.config.update_weight_buffer_size)
        self._updates = itertools.count()
        self._sending: dict[int, int] = {}
        """The update in flight -> the version its buckets carry (weight_version)."""
        self._holding: dict[str, int] = {}
        """LoRA: engine -> the process the transport reported the adapter delivered to, until
        it is unloaded; only those are unloaded from (``plan_update_actions``)."""
        self._writes: list[Task[None]] = []
        """--miles-bug-p2p-failures-logged: this update's bucket sends, not yet waited for."""
        self._checksums: dict[int, str] = {}
        """Update -> the trainer's checksum of what it sent, as its deliveries reported it
        (a world that can read weights: the engines' stamps are checked against it)."""
        self._left_paused = 0
        """--miles-bug-health-monitor-left-paused: pauses of the health monitor that updates
        which raised left behind, until the next rollout begins (``resume_left_paused``)."""

    # -- calls to engines ---------------------------------------------------------------

    async def _call(
        self, engine: str, incarnation: int, call: EngineCall, answered: Answered
    ) -> EngineFailure | None:
        """One call to an engine process; ``answered(engine, its answer)`` if it succeeded,
        else its failure. With fault tolerance, a process that does not answer within the
        health check's timeout has failed (a hung engine must not hold the update); without it,
        the call waits, as miles' would. Under the today profile: cell_isolation.py."""
        if self.isolation.active:
            await self.isolation.call(engine, incarnation, call, answered)
            return None
        ctx = self.ctx
        if not ctx.engines.current(engine, incarnation):
            return EngineFailure(engine, "its process was replaced during the update")
        method = call.name
        try:
            made = call.make(ctx.cluster.engine(engine, incarnation))
            if not ctx.config.use_fault_tolerance:
                answer = await made
            else:
                task = ctx.rt.spawn(made, f"{method}-{engine}.{incarnation}")
                timeout = ctx.config.rollout_health_check_timeout
                try:
                    if await ctx.rt.wait_any([task, ctx.rt.timer(timeout)]) == 1:
                        task.cancel(f"{method} timed out")
                        reason = f"no answer to {method} within {timeout:g}s"
                        # it may still generate, unpaused, on old weights: out and replaced
                        # now, as after a failed health check (seed 9912 --liveness: its
                        # sample of v4 came after v5 was published, before the monitor's
                        # next round replaced it)
                        self.engines.failed(engine, incarnation, reason)
                        self.replace(engine, incarnation, reason)
                        return EngineFailure(engine, reason)
                except BaseException:  # the update was cancelled: its call must not go on
                    task.cancel(f"the update's {method} was cancelled")  # to act for it
                    raise
                answer = await task
        except EngineFailure as failure:
            return failure
        except SessionAlreadyOpen:
            # an aborted attempt of this update left it open: this attempt loads into it
            # (miles' retry fails here; SGLang allows no second begin)
            answer = None
        answered(engine, answer)
        return None

    async def _each(
        self,
        targets: dict[str, int],
        call: EngineCall,
        answered: Answered = lambda engine, answer: None,
    ) -> list[EngineFailure]:
        """Call every engine at once; ``answered(engine, answer)`` as each succeeds; the
        failures, in engine order, once all ended (``rt.gather``: an engine's answer to a
        control call usually needs no wait at all, and the simulator then makes no task of
        it)."""
        one = self._call
        calls = [one(e, i, call, answered) for e, i in targets.items()]
        names = _CallNames(call.name, tuple(targets))
        results = await self.ctx.rt.gather(calls, names, "the update was cancelled")
        return [f for f in results if f is not None]

    # -- one action of the sequence ------------------------------------------------------

    async def _run_action(
        self, update_id: int, cell: int, action: UpdateAction, targets: dict[str, int]
    ) -> None:
        ctx = self.ctx
        engines = getattr(action, "engines", ())
        # most actions name every target, in order: a copy of the update's mapping (its own,
        # as each action's always was), made in one C call
        mine = dict(targets) if engines == tuple(targets) else {e: targets[e] for e in engines}
        if isinstance(action, PauseEngines):
            pause = engine_calls.pause(action.mode, action.abort_below)
            paused: Any = EnginesPaused
            if action.abort_below is not None:  # miles_core/pause_filter.py
                paused = partial(EnginesPausedAbortingBelow, abort_below=action.abort_below)
            await self._all_answer(update_id, mine, paused, pause)
        elif isinstance(action, FlushCache):
            await self._flush(update_id, mine)
        elif isinstance(action, BeginUpdate):
            await self._all_answer(update_id, mine, UpdateSessionOpened, engine_calls.BEGIN_UPDATE)
        elif isinstance(action, EndUpdate):
            await self._all_answer(update_id, mine, UpdateSessionClosed, engine_calls.END_UPDATE)
        elif isinstance(action, UnloadAdapter):
            unloaded, failures = await self._answered(
                mine, engine_calls.unload_adapter(action.adapter)
            )
            for engine in unloaded:
                self._holding.pop(engine, None)
            ctx.emit(AdapterUnloaded, update_id=update_id, adapter=action.adapter, engines=unloaded)
            if failures:
                raise failures[0]
        elif isinstance(action, SendBucket):
            if ctx.config.miles_bug_p2p_failures_logged and (
                ctx.config.transfer_mode is TransferMode.P2P
            ):
                await self._send_unwaited(update_id, cell, action, mine)
            else:
                await self._send_bucket(update_id, cell, action, mine)
        elif isinstance(action, StampEngines):
            await self._stamp(update_id, cell, action.version, mine)
        elif isinstance(action, PublishVersion):
            ctx.ledger.publish(action.version, f"cell-{cell}")
            ctx.versions.append(action.version)
            ctx.emit(VersionPublished, update_id=update_id, version=action.version, updater=cell)
        elif isinstance(action, ResumeEngines):
            await self._resume(update_id, mine)

    async def _flush(self, update_id: int, targets: dict[str, int]) -> None:
        """/flush_cache on every engine at once, each tried again while it refuses, as miles'
        ``SGLangEngine.flush_cache`` does (SGLang refuses while requests still hold KV after
        the pause): --flush-cache-max-retries tries, each refusal recorded (FlushRefused) and
        followed by a wait of --flush-cache-retry-interval; after the last, FlushTimeoutError
        (miles' TimeoutError) fails the update and the run. A dead engine (EngineFailure) is
        not tried again, as miles raises a connection error at once: the update fails over."""
        ctx, config = self.ctx, self.ctx.config
        answered: list[str] = []

        async def flush(engine: str, incarnation: int) -> EngineFailure | None:
            reason = ""
            for attempt in range(1, config.flush_cache_max_retries + 1):
                try:
                    return await self._call(
                        engine, incarnation, engine_calls.FLUSH_CACHE, _names(answered)
                    )
                except RequestRefused as refusal:
                    reason = refusal.reason
                    ctx.emit(
                        FlushRefused,
                        update_id=update_id,
                        engine=engine,
                        incarnation=incarnation,
                        attempt=attempt,
                        reason=reason,
                    )
                await ctx.rt.sleep(config.flush_cache_retry_interval)
            raise FlushTimeoutError(
                f"{engine} (process {incarnation}) refused /flush_cache on all "
                f"{config.flush_cache_max_retries} tries, {config.flush_cache_retry_interval:g}s "
                f"apart: {reason} (miles raises TimeoutError here); raise "
                "--flush-cache-max-retries or --flush-cache-retry-interval to wait longer"
            )

        calls = [flush(e, i) for e, i in targets.items()]
        names = _CallNames("flush_cache", tuple(targets))
        results = await ctx.rt.gather(calls, names, "the update was cancelled")
        flushed = tuple(sorted(answered))
        incarnations = tuple(map(targets.__getitem__, flushed))
        ctx.emit(EnginesFlushed, update_id=update_id, engines=flushed, incarnations=incarnations)
        for failure in results:
            if failure is not None:
                raise failure

    async def _answered(
        self, targets: dict[str, int], call: EngineCall
    ) -> tuple[tuple[str, ...], list[EngineFailure]]:
        """The engines that answered (sorted), and the failures."""
        answered: list[str] = []
        failures = await self._each(targets, call, _names(answered))
        return tuple(sorted(answered)), failures

    async def _all_answer(
        self,
        update_id: int,
        targets: dict[str, int],
        event: type[Event],
        call: EngineCall,
    ) -> None:
        """Call every engine; record the processes that answered; raise the first failure."""
        answered, failures = await self._answered(targets, call)
        self.ctx.emit(
            event,
            update_id=update_id,
            engines=answered,
            incarnations=tuple(map(targets.__getitem__, answered)),
        )
        if failures:
            raise failures[0]

    async def _stamp(
        self, update_id: int, cell: int, version: int, targets: dict[str, int]
    ) -> None:
        ctx = self.ctx
        await ctx.cluster.cell(cell).ping()  # the updater's rank 0 stamps: it must be alive

        trainer = self._checksums.get(update_id)

        def stamped(engine: str, checksum: str | None) -> None:  # as each engine answers
            self.engines.record_stamp(engine, targets[engine], version)
            if checksum is not None and trainer is not None:  # a world that reads weights
                ctx.emit(
                    WeightsChecked,
                    engine=engine,
                    version=version,
                    checksum=checksum,
                    trainer_checksum=trainer,
                )
            ctx.history.append(  # built here, not through emit's keyword dict: once per
                EngineStamped(  # engine and update
                    t=ctx.rt.now(),
                    update_id=update_id,
                    engine=engine,
                    incarnation=targets[engine],
                    version=version,
                )
            )

        failures = await self._each(targets, engine_calls.stamp(version, False), stamped)
        if failures:
            raise failures[0]

    async def _resume(self, update_id: int, targets: dict[str, int]) -> None:
        resumed, failures = await self._answered(targets, engine_calls.RESUME)
        self.ctx.emit(
            EnginesResumed,
            update_id=update_id,
            engines=resumed,
            incarnations=tuple(map(targets.__getitem__, resumed)),
        )
        self.engines.synced(
            {e: targets[e] for e in resumed}, f"stamped and resumed by update {update_id}"
        )
        for failure in failures:  # done is done: nothing is published twice
            self.engines.failed(failure.engine, targets[failure.engine], failure.reason)

    async def _send_bucket(
        self, update_id: int, cell: int, action: SendBucket, targets: dict[str, int]
    ) -> None:
        """Broadcast: one call to every engine. p2p: one link per engine, all sent at once
        (sent in turn, each engine waited for the one before it: backends/bench measured
        0.75x of the GB/s with 2 and 4 engines)."""
        ctx = self.ctx
        bucket = self.buckets[action.bucket]
        if self.isolation.active:  # given-up engines get no bucket; a replaced one is given up
            left = self.isolation.not_replaced(targets)
            self.isolation.check_some_left(targets)
            targets = left
        plan = plan_transfer(ctx.config.transfer_mode, (bucket,), tuple(targets))
        to = {e: targets[e] for transfer in plan.transfers for e in transfer.targets}
        replaced = ctx.engines.replaced(to)
        if replaced is not None:
            raise EngineFailure(replaced, "its process was replaced during the update")
        transport = ctx.cluster.transport
        version = self._sending[update_id]  # miles sends it with every bucket
        if plan.mode is TransferMode.P2P:
            deliveries = await transport.send_bucket_each(update_id, cell, bucket, to, version)
        else:
            deliveries = (await transport.send_bucket(update_id, cell, bucket, to, version),)
        for delivery in deliveries:
            if delivery.trainer_checksum is not None:  # what the engines' stamps compare with
                self._checksums[update_id] = delivery.trainer_checksum
            if ctx.config.lora_adapter is not None:  # the adapter's one unit is this bucket
                self._holding.update((e, targets[e]) for e in delivery.engines)
            if delivery.group_seconds is not None:  # the world made the group as it sent
                ctx.emit(
                    UpdateGroupMade,
                    update_id=update_id,
                    updater=cell,
                    engines=delivery.engines,
                    incarnations=tuple(map(targets.__getitem__, delivery.engines)),
                    seconds=delivery.group_seconds,
                )
            ctx.emit(
                BucketReceived,
                update_id=update_id,
                bucket=action.bucket,
                n_buckets=action.n_buckets,
                engines=delivery.engines,
                incarnations=tuple(map(targets.__getitem__, delivery.engines)),
                nbytes=bucket.nbytes,
                seconds=delivery.seconds,
            )

    # -- miles' p2p path, its bug included (--miles-bug-p2p-failures-logged) ---------------

    async def _send_unwaited(
        self, update_id: int, cell: int, action: SendBucket, targets: dict[str, int]
    ) -> None:
        """As miles' p2p updater with one GPU per engine (every engine rank is the last): the
        bucket's write to each engine goes out unwaited, one future per engine (p2p.py
        ``_update_weight_implementation``), and after the last bucket ``wait_transfers``
        waits for each future in turn, at most P2P_TRANSFER_TIMEOUT each
        (p2p_transfer_utils.py). A write that failed or is still going is only logged there;
        the update goes on to stamp, publish and resume. What arrived is recorded when the
        transport says so, late or not at all."""
        spawn = self.ctx.spawn
        for engine, incarnation in targets.items():
            name = f"p2p-write-{update_id}-{action.bucket}-{engine}"
            write = self._write(update_id, cell, action, {engine: incarnation})
            self._writes.append(spawn(write, name))
        if action.bucket == action.n_buckets - 1:
            writes, self._writes = self._writes, []
            rt = self.ctx.rt
            for write in writes:  # future.result(timeout=...), each in turn
                if not write.done():
                    await rt.wait_any([write, rt.timer(P2P_TRANSFER_TIMEOUT)])

    async def _write(
        self, update_id: int, cell: int, action: SendBucket, targets: dict[str, int]
    ) -> None:
        # miles: logger.error("[P2P] Transfer future failed"), and nothing else
        with contextlib.suppress(ComponentFailure):
            await self._send_bucket(update_id, cell, action, targets)

    # -- whole updates -------------------------------------------------------------------

    async def route(self, publish: bool, only: tuple[str, ...] | None = None) -> None:
        """One update on the first alive cell, failing over; ``publish=False`` re-sends the
        published version to ``only`` (a sync of restarted engines)."""
        ctx = self.ctx
        call = ctx.cells.routed("update_weights" if publish else "sync_engines")
        has_new_engines = ctx.connections.has_new_engines  # read once, before the attempts
        while True:
            if publish and ctx.config.today:  # start_update_weights: _ensure_cells_ready
                await self.window.open()
                # the window's snapshot comes before the connect: a process reported while
                # the window waited is new to the group (miles connects after the snapshot)
                has_new_engines = has_new_engines or ctx.connections.has_new_engines
            cell = call.target()
            engines = tuple(e for e in ctx.engines.live() if only is None or e in only)
            if not engines:
                return  # a sync whose engine died again
            targets = ctx.engines.incarnations(engines)
            if publish:
                version = ctx.ledger.reserve(f"cell-{cell}")
            else:
                version = ctx.ledger.current
                assert version is not None
            update_id = next(self._updates)
            self._sending = {update_id: version}
            adapter = ctx.config.lora_adapter
            kind = UpdateKind.FULL if adapter is None else UpdateKind.LORA
            mode = ctx.config.pause_generation_mode
            if ctx.config.miles_bug_fsdp_ignores_pause_mode:  # miles' FSDP updater: no mode,
                mode = PauseMode.RETRACT  # so SGLangEngine.pause_generation's default, flushed
            holding = None if adapter is None else self._adapter_holders(engines, targets, cell)
            update = WeightUpdate(
                version,
                engines,
                len(self.buckets),
                kind,
                adapter,
                publish,
                mode,
                holding,
                pause_threshold(ctx.config, version),
            )
            ctx.emit(
                UpdateBegan,
                update_id=update_id,
                version=version,
                updater=cell,
                kind=update.kind,
                n_buckets=len(self.buckets),
                engines=engines,
                publishes=publish,
            )
            ctx.monitor_paused += 1  # a busy engine is not a dead one
            try:
                await self._attempt(update_id, cell, update, targets, has_new_engines)
                return
            except ComponentFailure as failure:
                if publish:
                    ctx.ledger.abandon(version)
                engine_failed = isinstance(failure, EngineFailure)
                ctx.emit(
                    UpdateAborted,
                    update_id=update_id,
                    version=version,
                    cause=AbortCause.ENGINE if engine_failed else AbortCause.CELL,
                    component=failure.component,
                    reason=failure.reason,
                )
                if publish and ctx.config.today:  # abort_update_weights(snapshot)
                    self.window.aborted(update_id, targets, failure.reason)
                if isinstance(failure, EngineFailure):
                    ctx.connections.member_failed(cell)
                    if failure.engine in targets:
                        self.engines.failed(failure.engine, targets[failure.engine], failure.reason)
                else:
                    call.failed(failure.reason)
                    self.trainer.cell_failed(cell, failure.reason)
            finally:
                ctx.monitor_paused -= 1

    async def _attempt(
        self,
        update_id: int,
        cell: int,
        update: WeightUpdate,
        targets: dict[str, int],
        has_new_engines: bool,
    ) -> None:
        """One attempt of an update on ``cell``. Under the today profile it is bounded by
        --update-weights-timeout, and an engine given up is left out of the rest of it
        (cell_isolation.py); until it publishes, an attempt with no engine left fails."""
        isolation = self.isolation
        published = False

        async def actions() -> None:
            nonlocal published
            await self._connect(update_id, cell, targets, has_new_engines)
            while (action := update.next_action()) is not None:
                await self._run_action(update_id, cell, action, targets)
                update.complete(action)
                published = published or isinstance(action, PublishVersion)
                if isolation.active and not published:
                    isolation.check_some_left(targets)

        if not self.ctx.config.today:
            return await actions()
        isolation.begin(update_id, cell)
        await isolation.bounded(actions(), cell, lambda: published)

    async def _connect(
        self, update_id: int, cell: int, targets: dict[str, int], has_new_engines: bool
    ) -> None:
        """Make ``cell``'s weight-update group afresh where miles does (update_connections),
        or keep the one it holds. A kept group that names a process since replaced fails the
        cell, as miles' updater raises calling the old engine actor (and miles marks a cell
        whose call raised errored: group.py ``_execute_first_alive``)."""
        ctx = self.ctx
        connections = ctx.connections
        reason = connections.reason_to_connect(cell, targets, has_new_engines)
        if reason is None:
            kept = connections.group(cell)
            gone = ctx.engines.replaced(kept)
            if gone is not None:
                raise CellFailure(
                    cell,
                    f"its weight-update group names {gone}'s process {kept[gone]}, replaced "
                    "since the group was made",
                )
            return
        await ctx.cluster.transport.connect(update_id, cell, targets)
        connections.connected(cell, targets)
        ctx.emit(
            UpdateGroupConnected,
            update_id=update_id,
            updater=cell,
            engines=tuple(targets),
            incarnations=tuple(targets.values()),
            reason=reason.value,
        )

    async def _update_weights(self, publish: bool, only: tuple[str, ...] | None = None) -> None:
        """``route``, bracketed as miles brackets an update: with
        --miles-bug-health-monitor-left-paused the health monitor is paused before the
        retries (group.py ``update_weights``: ``health_monitoring_pause``, then ``retry``)
        and an update that raises leaves it paused until the next rollout begins
        (rollout_manager.py ``generate``: ``_health_monitoring_resume``); route's own
        pauses, each resumed, stay."""
        ctx = self.ctx
        if not ctx.config.miles_bug_health_monitor_left_paused:
            return await self.route(publish, only)
        ctx.monitor_paused += 1
        try:
            await self.route(publish, only)
        except BaseException:
            self._left_paused += 1  # no finally resumes it
            raise
        ctx.monitor_paused -= 1

    def resume_left_paused(self) -> None:
        """A rollout begins (miles' ``generate``): the pauses failed updates left end."""
        self.ctx.monitor_paused -= self._left_paused
        self._left_paused = 0

    def _adapter_holders(
        self, engines: tuple[str, ...], targets: dict[str, int], cell: int
    ) -> tuple[str, ...]:
        """The engines whose current process holds the LoRA adapter, by what the transport
        reported delivered: unloaded from those only, since SGLang refuses to unload an
        adapter a process lacks and to load one it has (a new updater cell, or a restarted
        engine, is not a reason to guess)."""
        return tuple(e for e in engines if self._holding.get(e) == targets[e])

    async def train_and_update(
        self,
        step: int,
        batch: list[Group],
        trained: Callable[[int], None],
        next_batch: Task[Any] | None = None,
    ) -> None:
        """Train a step, then update the weights, holding the weights lock throughout."""
        ctx = self.ctx
        await ctx.update_lock.acquire(f"step {step}'s train and update")
        try:
            await self.trainer.train(step, batch)
            trained(step)
            while next_batch is not None and not next_batch.done() and self.engines.serving():
                await ctx.rt.wait_any([next_batch, ctx.engines_changed.wait()])
            while not ctx.engines.live():  # every engine is down: wait for one to come back
                await ctx.engines_changed.wait()
            await self._update_weights(publish=True)
        finally:
            ctx.update_lock.release()

    async def sync(self, engine: str) -> None:
        """Bring a new (or outdated) engine process to the published weights before it serves."""
        ctx = self.ctx
        await ctx.update_lock.acquire(f"the sync of {engine}")
        try:
            if ctx.stopping or not self.engines.unsynced(engine):
                return  # an update synced it meanwhile, or it is down again
            if ctx.ledger.current is None:  # no version was ever published
                self.engines.synced(
                    {engine: ctx.engines.incarnation(engine)},
                    "no version was published: its initial weights are the current ones",
                )
            else:
                await self._update_weights(publish=False, only=(engine,))
        except (NoAliveCellError, RetriesExhaustedError):
            pass  # no cell can send now: the next full update includes the engine
        finally:
            ctx.update_lock.release()
