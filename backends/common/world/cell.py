"""A trainer cell of the Ray world: ``gpus_per_cell`` rank actors, one failure domain.

It sees its cluster through ``CellCluster``: the world's settings and placement, the store
its ranks rendezvous at, the fault points and impairments, and the other cells (a heal's
source).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

import ray
from ray.exceptions import RayActorError, RayTaskError

from backends.common.session.ray_session import in_bundle
from backends.common.wire.cell_lock import describe
from backends.common.wire.groups import abandon_attempt
from backends.common.world.settings import WorldSettings
from backends.common.world.trainer import TrainerActor
from miles_core.backend import CellFailure, TrainReport
from miles_core.buffer import Group, SampleStatus
from miles_core.cells import Heal, Outcome
from miles_core.kinds import FaultPoint
from miles_core.placement import Placement
from miles_core.scenario.schedule import FaultPoints


class CellCluster(Protocol):
    """What a cell sees of its cluster (cluster.py's RayCluster)."""

    settings: WorldSettings
    placement: Placement
    pg: Any
    """The run's placement group (its bundles are the placement's)."""
    store: Any
    """The world's TCPStore: attempts abandoned, participation counted."""
    store_addr: tuple[str, int]
    faults: FaultPoints
    cells: Mapping[int, RayCell]
    driver_down: bool
    """A restart_driver's dead loop: what it still calls never leaves it (adopted.py)."""

    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...


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

    def __init__(self, cluster: CellCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.ranks: list[Any] = []
        self.incarnation = -1
        self.doomed: dict[int, str] = {}
        """Rank -> what a fault injects into its next step before the exchange (EXIT, RAISE)."""
        self.holding: list[Any] = []
        """Hot restart: the ranks' ``hold`` calls of the last publish, done before a train."""

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
        bundles = self.cluster.placement.cell_bundles(self.index)
        world = self.world
        actor = self.cluster.settings.stack.trainer_actor or TrainerActor
        self.ranks = [
            actor.options(
                num_gpus=self.cluster.placement.layout.train_actor_gpu_fraction,
                scheduling_strategy=in_bundle(self.cluster.pg, bundle),
            ).remote(
                self.index,
                self.cluster.settings.policy,
                rank,
                len(bundles),
                self.cluster.store_addr,
                world,
                self.cluster.settings.stack,
                ticket_lock=self.ticket_lock,
            )
            for rank, bundle in enumerate(bundles)
        ]
        return self.incarnation

    async def call(self, method: str, *args: Any) -> list[Any]:
        """The same call on every rank; their results in rank order."""
        return await self.call_each(method, [args] * len(self.ranks))

    async def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if self.cluster.driver_down:  # sent by a dead driver's loop: it never leaves it
            await _forever()
        if not self.ranks:
            raise self.failure("no running processes")
        calls = [getattr(r, method).remote(*a) for r, a in zip(self.ranks, args, strict=True)]
        incarnation = self.incarnation
        try:
            return list(await asyncio.gather(*calls))
        except ACTOR_DIED as died:
            if incarnation == self.incarnation:  # not the new processes of a call left behind
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
        self.cluster.faults.fire(FaultPoint.BEFORE_ALLREDUCE, cell=self.index, step=step)
        doomed, self.doomed = self.doomed, {}
        trajectories = [
            [s.payload for s in g.samples() if s.status is not SampleStatus.ABORTED] for g in batch
        ]
        slowdown = self.cluster.slowdown(f"cell-{self.index}")
        store = self.cluster.store_addr
        holding, self.holding = self.holding, []
        await asyncio.gather(*holding, return_exceptions=True)  # the publish's state first
        args = [
            (step, attempt, trajectories, members, store, doomed.get(rank, ""), slowdown)
            for rank in range(len(self.ranks))
        ]
        try:
            results = await self._isolated("train", self.call_each("train", args))
        except CellFailure as failure:  # the other members need not wait for this one
            abandon_attempt(
                self.cluster.store, step, attempt, f"cell {self.index}: {failure.reason}"
            )
            raise
        normal = all(r["outcome"] == "normal" for r in results)
        outcome = Outcome.NORMAL if normal else Outcome.DISCARDED
        return TrainReport(outcome, members, max(r["seconds"] for r in results))

    async def heal(self, heal: Heal) -> None:
        """Rank i of the source sends its share of model and optimizer to rank i here."""
        if not self.ranks:
            raise self.failure("no running processes to heal")
        self.cluster.faults.fire(FaultPoint.DURING_HEAL, cell=heal.dst_cell)
        self.cluster.faults.fire(FaultPoint.DURING_HEAL, cell=heal.src_cell)
        source = self.cluster.cells[heal.src_cell]
        states = await source._isolated("get_state", source.call("get_state"))
        await self._isolated("set_state", self.call_each("set_state", [(s,) for s in states]))

    @property
    def world(self) -> str:
        """The torch world of the cell's current processes (its ranks' store prefix)."""
        return f"cell{self.index}.{self.incarnation}"

    @property
    def ticket_lock(self) -> bool:
        """The ranks send each bucket in a weight-update ticket lock: today's miles, and a
        cell of several ranks standing for its pipeline stages (wire/cell_lock.py)."""
        settings, ranks = self.cluster.settings, self.cluster.placement.cell_bundles(self.index)
        return settings.miles_today and len(ranks) > 1

    def lock_state(self) -> tuple[str, bool]:
        """The lock of the cell's current processes, read from its store as the wait-for
        graph names it, and whether rank 0 waits in it (cell_lock.describe)."""
        name = f"cell {self.index}'s weight-update lock (process {self.incarnation})"
        return describe(self.cluster.store, self.world, name)

    async def raise_holding_lock(self, rank: int) -> None:
        """The fault's act: a call to that rank, which takes the lock, raises in it and lives
        on (its exception is caught in the rank: nothing fails the cell)."""
        if rank < len(self.ranks):
            with contextlib.suppress(*ACTOR_DIED):
                await self.ranks[rank].raise_holding_lock.remote()

    async def ping(self) -> None:
        await self.call("heartbeat")

    async def heartbeat(self) -> None:
        if not self.ranks:
            raise self.failure("no running processes: the heartbeat was refused")
        if self.cluster.impaired(f"heartbeat-{self.index}"):
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
