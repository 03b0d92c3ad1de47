"""The real world behind miles_core's backend protocols: Ray actors, HTTP, gloo.

Translation only: every call maps to an actor method or an SGLang endpoint,
and every way it can fail maps to the failure the protocol names (a dead
actor or a refused connection is a CellFailure / EngineFailure). What to do
about a failure is the orchestration's decision, never made here.

The world reports what it sees, as a real cluster would: each engine actor is
watched by a call that never returns, so its death is reported the moment Ray
knows of it (EngineExited); a new engine process is reported once its HTTP
server answers; new cell processes as soon as Ray has created their actors
(calls to them, such as the heal's, wait until they are up). Calls to an engine
are addressed to one process: a call meant for a process that was replaced
fails instead of reaching the new one.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import ray
import torch.distributed as dist
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup

from backends.common.session.ray_session import LOOPBACK, in_bundle
from backends.common.stack import CPU_STACK, Stack
from backends.common.training.policy import AnyPolicy, build_model, update_units
from backends.common.training.task import ClimbTask, Task
from backends.common.wire.groups import abandon_attempt
from backends.common.world.engine_slot import EngineHandle, RayEngine
from backends.common.world.trainer import TrainerActor
from backends.common.world.transport import HTTP_TIMEOUT, CollectiveTransport, RayRouter
from miles_core.backend import (
    CellFailure,
    TrainReport,
    WorldObserver,
)
from miles_core.buffer import Group, SampleStatus
from miles_core.cells import Heal, Outcome
from miles_core.kinds import FaultPoint
from miles_core.placement import Placement
from miles_core.runtime import Runtime
from miles_core.scenario.schedule import FaultPoints
from miles_core.transfer import ParamSpec, UpdateUnit

ACTOR_DIED = (RayActorError,)
RANK_RAISED = (RayTaskError,)
"""A rank's method raised (a Python exception in a live process, not a death)."""


def _cause(raised: RayTaskError) -> str:
    """The exception a rank raised, as one line: its type and the first line of its message
    (Ray's own text is the remote traceback)."""
    cause = raised.cause if isinstance(raised.cause, BaseException) else raised
    message = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {message[0][:200]}" if message else type(cause).__name__


async def _forever() -> None:
    await asyncio.Event().wait()


@dataclass
class TransferLog:
    """What each update moved and how long the source spent in collectives."""

    bytes: dict[int, int] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    wall: dict[int, float] = field(default_factory=dict)

    def add(self, update_id: int, nbytes: int, seconds: float, wall: float) -> None:
        self.bytes[update_id] = self.bytes.get(update_id, 0) + nbytes
        self.seconds[update_id] = self.seconds.get(update_id, 0.0) + seconds
        self.wall[update_id] = self.wall.get(update_id, 0.0) + wall


class RayCell:
    """One trainer cell: ``gpus_per_cell`` rank actors, one failure domain.

    A call goes to every rank (the ranks of a sharded cell take part in each
    other's collectives); if any rank died, the whole cell is killed and the
    call raises CellFailure. In the cell's own work (train, heal) a rank that
    raised fails its cell the same way: miles' ``RayTrainCell._execute_raw``
    isolates any exception from a cell's actors (miles/ray/train/cell.py), and
    the other cells go on. A weight update's calls pass a rank's exception on as
    it is: its collective failed because a peer vanished, and the transport
    names which one from the engines' replies.
    """

    def __init__(self, world: RayWorld, index: int) -> None:
        self.world = world
        self.index = index
        self.ranks: list[Any] = []
        self.incarnation = -1
        self.doomed: dict[int, str] = {}
        """Rank -> what a fault injects into its next step before the exchange (EXIT, RAISE)."""

    def failure(self, reason: str) -> CellFailure:
        return CellFailure(self.index, reason)

    async def start(self) -> int:
        """New rank processes, once they answer."""
        incarnation = self.create()
        await self.call("ready")
        return incarnation

    def create(self) -> int:
        """New rank processes, created now (Ray queues calls to them until they are up); a
        sharded cell's ranks form their own torch world, named by the cell and its
        incarnation (a rendezvous name is never reused)."""
        self.kill()
        self.incarnation += 1
        bundles = self.world.placement.cell_bundles(self.index)
        world = f"cell{self.index}.{self.incarnation}"
        actor = self.world.stack.trainer_actor or TrainerActor
        self.ranks = [
            actor.options(
                num_gpus=self.world.placement.layout.train_actor_gpu_fraction,
                scheduling_strategy=in_bundle(self.world.pg, bundle),
            ).remote(
                self.index,
                self.world.policy,
                rank,
                len(bundles),
                self.world.store_addr,
                world,
                self.world.stack,
            )
            for rank, bundle in enumerate(bundles)
        ]
        return self.incarnation

    async def call(self, method: str, *args: Any) -> list[Any]:
        """The same call on every rank; their results in rank order."""
        return await self.call_each(method, [args] * len(self.ranks))

    async def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if not self.ranks:
            raise self.failure("no running processes")
        calls = [getattr(r, method).remote(*a) for r, a in zip(self.ranks, args, strict=True)]
        try:
            return list(await asyncio.gather(*calls))
        except ACTOR_DIED as died:
            self.kill()  # one rank gone: the rest would wait in its collectives
            raise self.failure(f"a rank died in {method}: {type(died).__name__}") from None

    async def _isolated(self, method: str, call: Awaitable[list[Any]]) -> list[Any]:
        """A call of the cell's own work (``method``): a rank's exception is the cell's
        failure."""
        try:
            return await call
        except RANK_RAISED as raised:
            self.kill()  # one rank left the call: the rest would wait in its collectives
            raise self.failure(f"a rank raised in {method}: {_cause(raised)}") from None

    async def train(
        self, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> TrainReport:
        self.world.faults.fire(FaultPoint.BEFORE_ALLREDUCE, cell=self.index, step=step)
        doomed, self.doomed = self.doomed, {}
        trajectories = [
            [s.payload for s in g.samples() if s.status is not SampleStatus.ABORTED] for g in batch
        ]
        slowdown = self.world.slowdown(f"cell-{self.index}")
        store = self.world.store_addr
        args = [
            (step, attempt, trajectories, members, store, doomed.get(rank, ""), slowdown)
            for rank in range(len(self.ranks))
        ]
        try:
            results = await self._isolated("train", self.call_each("train", args))
        except CellFailure as failure:  # the other members need not wait for this one
            abandon_attempt(self.world.store, step, attempt, f"cell {self.index}: {failure.reason}")
            raise
        normal = all(r["outcome"] == "normal" for r in results)
        outcome = Outcome.NORMAL if normal else Outcome.DISCARDED
        return TrainReport(outcome, members, max(r["seconds"] for r in results))

    async def heal(self, heal: Heal) -> None:
        """Rank i of the source sends its share of model and optimizer to rank i here."""
        if not self.ranks:
            raise self.failure("no running processes to heal")
        self.world.faults.fire(FaultPoint.DURING_HEAL, cell=heal.dst_cell)
        self.world.faults.fire(FaultPoint.DURING_HEAL, cell=heal.src_cell)
        source = self.world.cells[heal.src_cell]
        states = await source._isolated("get_state", source.call("get_state"))
        await self._isolated("set_state", self.call_each("set_state", [(s,) for s in states]))

    async def ping(self) -> None:
        await self.call("heartbeat")

    async def heartbeat(self) -> None:
        if not self.ranks:
            raise self.failure("no running processes: the heartbeat was refused")
        if self.world.impaired(f"heartbeat-{self.index}"):
            await _forever()
        try:
            await asyncio.gather(*(r.heartbeat.remote() for r in self.ranks))
        except ACTOR_DIED:  # Ray refuses a call to a dead actor at once: a miss now
            raise self.failure("a rank died: the heartbeat was refused") from None

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []

    def stop(self) -> None:
        self.kill()


class RayWorld:
    """The Cluster protocol over Ray (the FaultActions are in backends.common.world.faults)."""

    def __init__(
        self,
        rt: Runtime,
        *,
        num_cells: int,
        gpus_per_cell: int,
        num_engines: int,
        policy: AnyPolicy,
        pg: PlacementGroup,
        placement: Placement,
        faults: FaultPoints,
        seed: int,
        engine_token_seconds: float = 0.0,
        stack: Stack = CPU_STACK,
        collective_timeout: float = 1800.0,
        flush_refuses_while_queued: bool = False,
        prefix_cache: str = "off",
        task: Task | None = None,
    ) -> None:
        self.rt = rt
        self.task: Task = task or ClimbTask(seed)
        """The prompts and the reward the router asks for (task.py)."""
        self.stack = stack
        self.num_cells = num_cells
        self.gpus_per_cell = gpus_per_cell
        self.engine_ids = tuple(f"engine-{i}" for i in range(num_engines))
        self.policy = policy
        self.pg = pg
        self.placement = placement
        self.faults = faults
        self.seed = seed
        self.engine_token_seconds = engine_token_seconds
        self.collective_timeout = collective_timeout
        """How long a weight-update broadcast waits for every member (the trainer's and the
        engines' groups, and the transport's deadline): --update-weight-collective-timeout."""
        self.flush_refuses_while_queued = flush_refuses_while_queued
        """The engines act as an SGLang before #31962 ([sim] flush_refuses_while_queued)."""
        self.prefix_cache = prefix_cache
        """The engines' prefix cache policy ([sim] prefix_cache)."""
        model = build_model(policy)
        self.units: tuple[UpdateUnit, ...] = update_units(model)
        self.model_bytes = sum(u.nbytes for u in self.units)
        self.lora_params: tuple[ParamSpec, ...] = ()
        self.cells = {i: RayCell(self, i) for i in range(num_cells)}
        self.engines = {e: RayEngine(self, e, i) for i, e in enumerate(self.engine_ids)}
        self.router = RayRouter(self)
        self.transport = (stack.transport or CollectiveTransport)(self)
        self.store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        self.store_addr = (LOOPBACK, self.store.port)
        # no cap on connections: a generate request holds one for as long as an engine keeps
        # it (a paused engine keeps it until resumed), so with aiohttp's default of 100 the
        # 101st request in flight, and the pause, flush and update calls behind it, wait for
        # one forever (a batch of 32 x 8 samples deadlocked its first update). Requests in
        # flight are bounded by the producer (one batch, or --async-max-concurrent-samples).
        self.http = aiohttp.ClientSession(
            timeout=HTTP_TIMEOUT, connector=aiohttp.TCPConnector(limit=0)
        )
        self.observer: WorldObserver | None = None
        self.trainer_checksums: dict[int, str] = {}
        self.current_update = -1
        self.rewards: dict[int, tuple[float, ...]] = {}
        self.transfers = TransferLog()
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        """Set by the first of the world's own tasks that raised (a crash of the world)."""
        self._impaired: dict[str, tuple[float, float]] = {}

    async def start(self) -> None:
        await asyncio.gather(
            *(c.start() for c in self.cells.values()), *(e.start() for e in self.engines.values())
        )

    async def close(self) -> None:
        self.observer = None  # what the world sees from now on is no part of the run
        for cell in self.cells.values():
            cell.kill()
        for engine in self.engines.values():
            engine.kill()
        self.router.close()
        await self.http.close()
        del self.store

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """A task of the world's own; if it raises, the run ends with that error."""

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not self.failed.done():
                    self.failed.set_result(error)

        asyncio.get_running_loop().create_task(guarded(), name=name)

    # -- the Cluster protocol --------------------------------------------------------

    def attach(self, observer: WorldObserver) -> None:
        self.observer = observer

    def cell(self, index: int) -> RayCell:
        return self.cells[index]

    def engine(self, engine_id: str, incarnation: int) -> EngineHandle:
        return EngineHandle(self.engines[engine_id], incarnation)

    def restart_engine(self, engine_id: str) -> None:
        """A new process for the slot, killing the old one (its watch reports that exit); the
        new one is reported once it answers, or its death if it died while starting."""
        self.spawn(self._restart_engine(engine_id), f"restart-{engine_id}")

    async def _restart_engine(self, engine_id: str) -> None:
        incarnation = await self.engines[engine_id].start(recovery=True)
        if incarnation is not None and self.observer is not None:
            self.observer.engine_started(engine_id, incarnation, "actor started, /health answered")

    def start_cell(self, index: int) -> None:
        """New rank actors for the cell, killing the old ones; reported at once (Ray queues
        calls to them until they are up, and the heal's first call waits for that)."""
        incarnation = self.cells[index].create()
        if self.observer is not None:
            self.observer.cell_started(index, incarnation, "rank actors created")

    def engine_exited(self, engine_id: str, incarnation: int, how: str) -> None:
        if self.observer is not None:
            self.observer.engine_exited(engine_id, incarnation, how)

    def weights_checked(self, engine: str, version: int, engine_checksum: str) -> None:
        if self.observer is not None:
            trainer = self.trainer_checksums[self.current_update]
            self.observer.weights_checked(engine, version, engine_checksum, trainer)

    # -- impairments (slow cells and links, router delays and failures, muted heartbeats) --

    def impair(self, what: str, factor: float, seconds: float) -> None:
        self._impaired[what] = (factor, self.rt.now() + seconds)

    def end_impairments(self) -> None:
        now = self.rt.now()
        self._impaired = {what: (factor, now) for what, (factor, _) in self._impaired.items()}

    def impaired(self, what: str) -> bool:
        entry = self._impaired.get(what)
        return entry is not None and self.rt.now() < entry[1]

    def slowdown(self, what: str) -> float:
        return self._impaired[what][0] if self.impaired(what) else 1.0


def buffer_size_for(model_bytes: int, sim_buckets: int) -> int:
    """A bucket size that splits the real model into as many buckets as the scenario's
    simulated model (so "after bucket 2" exists in both worlds)."""
    return max(1, math.ceil(model_bytes / max(1, sim_buckets)))


__all__ = ["RayWorld", "buffer_size_for"]
