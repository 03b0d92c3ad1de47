"""Planted control bugs: changes to the control plane the way a user's own change might
break it, each named with the oracle that must catch it.

A mutation check of the verdict: ``python -m sim sweep --plant NAME`` runs a
sweep with the bug in every worker and shows which oracles caught it and on
which seeds; ``python -m sim shrink ... --plant NAME`` shrinks what it found.
``scenarios/test_planted_bugs.py`` asserts each plant fails its oracle. A plant
only patches attributes, and ``planted`` puts every one back on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from miles_core import engines
from miles_core import placement as placement_module
from miles_core.backend import EngineFailure, SessionAlreadyOpen
from miles_core.buffer import DataBuffer, Fate, Group, Reason, SampleStatus, UnusedHandler, Verdict
from miles_core.cells import CellGroup, Decision, Outcome
from miles_core.errors import ConfigError
from miles_core.events import PromptDrawn
from miles_core.loop import engine_calls
from miles_core.loop import update as update_module
from miles_core.loop.engine_calls import EngineCall
from miles_core.loop.producer import Producer
from miles_core.loop.supervision import EngineSupervisor
from miles_core.loop.train import Trainer
from miles_core.loop.update import Updater
from miles_core.transfer import TransferMode
from miles_core.update_connections import UpdateConnections
from miles_core.weight_update import FlushCache, PublishVersion
from sim.search.plants_gate import GATE_PLANTS
from sim.search.plants_resume import RESUME_PLANTS


class Patcher:
    """Sets attributes and puts the originals back (pytest's MonkeyPatch, without pytest)."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, object]] = []

    def setattr(self, target: object, name: str, value: object) -> None:
        self._saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self) -> None:
        while self._saved:
            target, name, value = self._saved.pop()
            setattr(target, name, value)


Plant = Callable[[Patcher], None]


def publish_after_resume(mp: Patcher) -> None:
    """The engines resume before the version is published (seed report on PR #2244, risk 3)."""
    import miles_core.weight_update as wu

    plan = wu.plan_update_actions

    def swapped(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        actions = list(plan(*args, **kwargs))
        publish = [i for i, a in enumerate(actions) if isinstance(a, PublishVersion)]
        if publish:
            i = publish[0]
            actions[i], actions[i + 1] = actions[i + 1], actions[i]
        return tuple(actions)

    mp.setattr(wu, "plan_update_actions", swapped)


def discarded_attempt_commits(mp: Patcher) -> None:
    """An attempt whose allreduce failed for some cell commits on the cells that finished."""
    finish = CellGroup.finish_attempt

    def lenient(self: CellGroup, outcomes: dict[int, Outcome]) -> Any:
        result = finish(self, outcomes)
        if result.decision is Decision.RETRY and result.discarded:
            self._step_attempts.pop(result.attempt.step, None)
            return dataclasses.replace(result, decision=Decision.COMMIT)
        return result

    mp.setattr(CellGroup, "finish_attempt", lenient)


def dead_cell_in_exchange(mp: Patcher) -> None:
    """A retry keeps the first attempt's exchange group, dead cell and all."""
    train_on = Trainer._train_on
    first: dict[int, tuple[int, ...]] = {}

    async def stale(
        self: Trainer, cell: int, step: int, attempt: int, batch: Any, cells: Any
    ) -> Any:
        return await train_on(self, cell, step, attempt, batch, first.setdefault(step, cells))

    mp.setattr(Trainer, "_train_on", stale)


def p2p_to_one_engine(mp: Patcher) -> None:
    """p2p sends each bucket to the first engine of the update only."""
    plan = update_module.plan_transfer

    def first_only(mode: Any, buckets: Any, engines: Any, *args: Any, **kwargs: Any) -> Any:
        result = plan(mode, buckets, engines, *args, **kwargs)
        if result.mode is TransferMode.P2P:
            return dataclasses.replace(result, transfers=result.transfers[:1])
        return result

    mp.setattr(update_module, "plan_transfer", first_only)


def recycled_never_regenerated(mp: Patcher) -> None:
    """Recycled prompts are queued but the producer always draws new ones."""

    def draw_new(self: Producer) -> int:
        prompt = next(self._prompts)
        self.ctx.emit(PromptDrawn, prompt_id=prompt)
        return prompt

    mp.setattr(Producer, "_next_prompt", draw_new)


def stamp_by_engine_id(mp: Patcher) -> None:
    """The original restart-before-stamp bug: the stamp and the resume go to whatever process
    serves the engine id when each call is sent (an HTTP call to the engine's address), not
    to the process that received the buckets. Resolved as the calls go out, after the
    updater's own round trip before the stamp: a restart inside that window is the bug's."""
    each = Updater._each

    async def by_id(self: Updater, targets: Any, call: EngineCall, *args: Any) -> Any:
        if call.name in ("stamp", "resume"):  # in place: the caller records what it stamped
            targets.update({e: self.ctx.engines.incarnation(e) for e in targets})
        return await each(self, targets, call, *args)

    mp.setattr(Updater, "_each", by_id)


def version_update_aborts_all(mp: Patcher) -> None:
    """The client posts only {"new_version": ...}: SGLang's default abort_all_requests=true
    aborts every request in flight at each update (miles #2589, #2296)."""

    def version_only(version: int, abort_all_requests: bool) -> EngineCall:
        del abort_all_requests  # the version only: the engine's default applies
        return EngineCall("stamp", lambda engine: engine.stamp(version))

    mp.setattr(engine_calls, "stamp", version_only)


def flush_under_in_place(mp: Patcher) -> None:
    """The cache is flushed whatever the pause mode (miles #1497): under in_place the frozen
    requests still hold KV pages, and SGLang refuses."""
    import miles_core.weight_update as wu

    plan = wu.plan_update_actions

    def always_flush(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        actions = list(plan(*args, **kwargs))
        if not any(isinstance(a, FlushCache) for a in actions):
            actions.insert(1, FlushCache(actions[0].engines))
        return tuple(actions)

    mp.setattr(wu, "plan_update_actions", always_flush)


def staleness_from_final_version(mp: Patcher) -> None:
    """A sample keeps only the version it finished under, not every span's: a response that
    spanned updates looks fresher than it is (miles counts from the oldest)."""
    generate = Producer._generate_sample

    async def last_only(self: Producer, group_id: int, prompt_id: int, index: int) -> Any:
        sample = await generate(self, group_id, prompt_id, index)
        return dataclasses.replace(sample, weight_versions=sample.weight_versions[-1:])

    mp.setattr(Producer, "_generate_sample", last_only)


def aborted_group_trained(mp: Patcher) -> None:
    """The buffer refuses a group only when every sample was aborted, not when any was: a
    group cut short by an update, a dead engine or a failing router is trained with its
    truncated responses (miles' buffer refuses it whole: fully_async_data_buffer.py,
    DefaultDataBuffer.put)."""

    def all_aborted(self: Group) -> bool:
        return all(s.status is SampleStatus.ABORTED for s in self.samples())

    mp.setattr(Group, "aborted", property(all_aborted))


def heal_from_first_member(mp: Patcher) -> None:
    """A heal's source is the first member of the new quorum, not its first alive cell: a
    restarted cell with the lowest index is healed from itself, with initial weights."""
    refresh = CellGroup.refresh

    def first_member(self: CellGroup) -> Any:
        plan = refresh(self)
        src = plan.members[0] if plan.members else None
        heals = tuple(
            dataclasses.replace(h, src_cell=src, src_alive_rank=0, src_ranks=self.ranks(src))
            for h in plan.heals
        )
        return dataclasses.replace(plan, heals=heals)

    mp.setattr(CellGroup, "refresh", first_member)


def unused_handler_inverted(mp: Patcher) -> None:
    """The buffer reads --async-unused-samples-handler the wrong way round: under drop (miles'
    default) aborted and stale groups are recycled, under retry they are dropped, so their
    prompts are trained after all, or lost for good (miles: DefaultDataBuffer.put and get
    hand both to the one unused handler, fully_async_data_buffer.py)."""

    def inverted(
        self: DataBuffer, group: Group, reason: Reason, staleness_value: int | None = None
    ) -> Verdict:
        recycle = self.config.unused_samples_handler is not UnusedHandler.RETRY
        fate = Fate.RECYCLE if recycle else Fate.DROP
        return Verdict(group, fate, reason, staleness=staleness_value)

    mp.setattr(DataBuffer, "_unused", inverted)


def recovered_engine_serves_unsynced(mp: Patcher) -> None:
    """A new engine process serves before it is synced, as miles' recovered engine does:
    ``SGLangEngine.init`` posts ``/add_worker`` to the router as it launches, with the
    checkpoint's weights, and ``recover_updatable_engines`` runs at the start of
    ``update_weights`` (miles/ray/actor_group.py), so requests may reach it before that
    update pauses it (sglang_engine.py ``_init_normal``; rollout_manager.py)."""
    table = dict(engines.TRANSITIONS)
    for old in (
        engines.EngineState.DOWN,
        engines.EngineState.SERVING,
        engines.EngineState.UNSYNCED,
    ):
        table[(old, engines.EngineEvent.STARTED)] = engines.EngineState.SERVING
    mp.setattr(engines, "TRANSITIONS", table)


def lora_loaded_per_updater(mp: Patcher) -> None:
    """A LoRA update unloads the adapter from every engine when this updater cell has pushed
    it before, and from none otherwise: miles' one ``_lora_loaded`` flag per updater
    (update_weight_from_distributed/mixin.py ``_update_lora_weights``). A new updater
    after a cell failover pushes again onto engines that hold the adapter, and SGLang
    refuses the duplicate name."""
    send_bucket = Updater._send_bucket

    async def flagging(self: Updater, update_id: int, cell: int, *args: Any) -> None:
        await send_bucket(self, update_id, cell, *args)
        self.__dict__.setdefault("_pushed_by", set()).add(cell)  # set after the push

    def by_flag(self: Updater, engines: tuple[str, ...], targets: Any, cell: int) -> Any:
        return engines if cell in self.__dict__.get("_pushed_by", ()) else ()

    mp.setattr(Updater, "_send_bucket", flagging)
    mp.setattr(Updater, "_adapter_holders", by_flag)


def staleness_against_trainer_version(mp: Patcher) -> None:
    """The buffer judges staleness against the version the trainer is making (its step
    counter), not the one the engines were given (torchforge #557 at max_policy_age 0):
    every group generated under the newest published weights counts one version stale, so
    with a bound of 0 nothing ever passes and training waits for ever."""
    get = DataBuffer.get

    def ahead(self: DataBuffer, current_version: int | None = None, **context: Any) -> Any:
        return get(self, None if current_version is None else current_version + 1, **context)

    mp.setattr(DataBuffer, "get", ahead)


def placement_sorted_as_text(mp: Patcher) -> None:
    """Nodes sorted by their text, not their address (miles' sort_key fell back to character
    codes for anything but a dotted quad): 10.10.0.1 before 10.9.0.1, names and IPv6
    addresses anywhere. Each node's bundles stay together; the nodes' order is wrong."""
    mp.setattr(placement_module, "node_sort_key", lambda node, resolver=None: (0, 0, node))


def placement_gpu_major(mp: Patcher) -> None:
    """Bundles sorted by GPU id first, then node: GPU 0 of every node, then GPU 1 of every
    node..., so a tensor-parallel group or an engine's GPUs land on different nodes."""
    node_key = placement_module.node_sort_key

    def gpu_major(bundle: Any, resolver: Any = placement_module.no_resolver) -> tuple:
        return (bundle.gpu_id, *node_key(bundle.node, resolver), bundle.node, bundle.index)

    mp.setattr(placement_module, "bundle_sort_key", gpu_major)


def lock_kept_when_nothing_to_sync(mp: Patcher) -> None:
    """A sync that finds its engine synced already (an update got there first) returns
    without releasing the weights lock, an early return that skips the ``finally``: every
    later update waits on the lock for ever. A hang and nothing else: no safety oracle sees
    it, only liveness does."""
    sync = Updater.sync

    async def leaky(self: Updater, engine: str) -> None:
        ctx = self.ctx
        await ctx.update_lock.acquire(f"the sync of {engine}")
        if ctx.stopping or not self.engines.unsynced(engine):
            return  # the bug: this path never releases the lock
        ctx.update_lock.release()
        await sync(self, engine)

    mp.setattr(Updater, "sync", leaky)


def update_call_without_deadline(mp: Patcher) -> None:
    """With fault tolerance, the update's control calls wait for an answer with no deadline
    (miles PRs #2983 / #3036: an engine that never answers an abort holds the update). The
    health monitor is paused through the update, so a hung engine holds it for ever."""

    async def patient(
        self: Updater, engine: str, incarnation: int, call: EngineCall, answered: Any
    ) -> Any:
        ctx = self.ctx
        if not ctx.engines.current(engine, incarnation):
            return EngineFailure(engine, "its process was replaced during the update")
        answer = None
        try:
            answer = await call.make(ctx.cluster.engine(engine, incarnation))
        except EngineFailure as failure:
            return failure
        except SessionAlreadyOpen:
            pass
        answered(engine, answer)
        return None

    mp.setattr(Updater, "_call", patient)


def recovery_asked_while_starting(mp: Patcher) -> None:
    """The health monitor asks again for an engine whose new process is still starting,
    once its patience (interval + timeout) ran out, as if the start were a lost one: each
    ask replaces the process being started, so a start slower than the patience never
    ends (seen on the CPU backend under load before the monitor kept its recoveries)."""
    from miles_core.loop.health import EngineHealthMonitor

    def forgetful(self: EngineHealthMonitor, engine: str, incarnation: int) -> None:
        del engine, incarnation  # the bug: no recovery is ever known to be under way

    mp.setattr(EngineHealthMonitor, "recovery_ended", forgetful)
    recover = EngineHealthMonitor._recover

    def impatient(self: EngineHealthMonitor, engine: str, reason: str) -> None:
        self._under_way.pop(engine, None)
        recover(self, engine, reason)

    mp.setattr(EngineHealthMonitor, "_recover", impatient)


class _NeverPaused:
    """A run context whose health monitor is never paused (everything else as it is)."""

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    monitor_paused = 0


def monitor_probes_through_updates(mp: Patcher) -> None:
    """The health monitor is not paused around weight updates (miles pauses it:
    ``actor_group.update_weights`` calls ``health_monitoring_pause`` before the broadcast).
    A /health_generate is scheduled as a request, so a paused engine answers none: an
    update longer than the check's timeout gets its healthy engines killed, every time,
    until the update's retries run out (``ft_updates_outlast_the_health_timeout``)."""
    from miles_core.loop.health import EngineHealthMonitor

    run = EngineHealthMonitor.run

    async def unpaused(self: EngineHealthMonitor) -> None:
        self.ctx = _NeverPaused(self.ctx)  # type: ignore[assignment]
        await run(self)

    mp.setattr(EngineHealthMonitor, "run", unpaused)


def connection_kept_after_reconfigure(mp: Patcher) -> None:
    """A refresh does not mark the cells' weight-update connections stale (miles before #1444):
    a cell that becomes the updater again, after another cell consumed has_new_engines,
    keeps a group naming an engine process that was since replaced, and fails its update."""
    mp.setattr(UpdateConnections, "reconfigured", lambda self, cells: None)


def orphan_left_in_router(mp: Patcher) -> None:
    """A process out of rotation is not taken out of the router (miles before #100: the
    health monitor only ``ray.kill``-ed the actor; and through a lost actor ever since): a
    server whose actor is gone keeps serving the weights it holds, and the router sends it
    requests after the updates it never gets."""
    mp.setattr(EngineSupervisor, "_unroute", lambda self, engine, incarnation: None)


def refused_request_fails_engine(mp: Patcher) -> None:
    """An engine's refusal of a request (an over-long prompt) taken for the engine's failure:
    the engine leaves rotation, the group is aborted and, under retry, recycled first, so
    the prompt goes to the next engine, and the next (NeMo-RL #3938)."""

    def as_failure(self: Producer, engine: str, incarnation: int, refusal: Any) -> Any:
        self.engines.failed(engine, incarnation, refusal.reason)
        return SampleStatus.ABORTED

    mp.setattr(Producer, "_refused", as_failure)


PLANTS: dict[str, tuple[Plant, str]] = {
    "publish_after_resume": (publish_after_resume, "update_order"),
    "discarded_attempt_commits": (discarded_attempt_commits, "step_attempts"),
    "dead_cell_in_exchange": (dead_cell_in_exchange, "step_attempts"),
    "p2p_to_one_engine": (p2p_to_one_engine, "update_order"),
    "recycled_never_regenerated": (recycled_never_regenerated, "recycled_regenerated"),
    "stamp_by_engine_id": (stamp_by_engine_id, "update_order"),
    "version_update_aborts_all": (version_update_aborts_all, "requests_kept"),
    "flush_under_in_place": (flush_under_in_place, "end_state"),
    "staleness_from_final_version": (staleness_from_final_version, "bounded_staleness"),
    "aborted_group_trained": (aborted_group_trained, "whole_groups"),
    "heal_from_first_member": (heal_from_first_member, "step_attempts"),
    "unused_handler_inverted": (unused_handler_inverted, "recycled_regenerated"),
    "recovered_engine_serves_unsynced": (recovered_engine_serves_unsynced, "published_weights"),
    "lora_loaded_per_updater": (lora_loaded_per_updater, "end_state"),
    "staleness_against_trainer_version": (staleness_against_trainer_version, "liveness"),
    "placement_sorted_as_text": (placement_sorted_as_text, "placement"),
    "placement_gpu_major": (placement_gpu_major, "placement"),
    "lock_kept_when_nothing_to_sync": (lock_kept_when_nothing_to_sync, "liveness"),
    "update_call_without_deadline": (update_call_without_deadline, "liveness"),
    "recovery_asked_while_starting": (recovery_asked_while_starting, "fault_witness"),
    "monitor_probes_through_updates": (monitor_probes_through_updates, "end_state"),
    "connection_kept_after_reconfigure": (connection_kept_after_reconfigure, "end_state"),
    "orphan_left_in_router": (orphan_left_in_router, "published_weights"),
    "refused_request_fails_engine": (refused_request_fails_engine, "recycled_regenerated"),
    **RESUME_PLANTS,
    **GATE_PLANTS,
}


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    """The control plane with plant ``name`` in it (unchanged for None) while inside."""
    if name is None:
        yield
        return
    check_plant(name)
    patcher = Patcher()
    try:
        PLANTS[name][0](patcher)
        yield
    finally:
        patcher.undo()


def check_plant(name: str, flag: str = "--plant") -> str:
    if name not in PLANTS:
        raise ConfigError(flag, f"no planted bug named {name!r}", f"use one of {sorted(PLANTS)}")
    return name


__all__ = ["PLANTS", "Patcher", "check_plant", "planted"]
