"""Simulated trainer cells (engines are in sim/world/engine.py): they do what they are asked, for
as long as the time models say, and fail when they are dead.

A cell's processes die with ``kill`` (work in progress raises its CellFailure at once) and
a new set starts with ``start`` (a new incarnation: sim/world/process.py). A cell sees its
cluster through ``CellCluster``, the few parts of it a cell uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol

from miles_core.backend import (
    CellFailure,
    TrainReport,
)
from miles_core.buffer import Group
from miles_core.cells import Heal, Outcome
from miles_core.kinds import FaultPoint
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.faults import RANK_FAILED
from miles_core.scenario.schedule import FaultPoints
from sim.world.process import Mortal
from sim.world.runtime import SimRuntime


class CellCluster(Protocol):
    """What a simulated cell sees of its cluster (sim/world/cluster.py's SimCluster)."""

    rt: SimRuntime
    world: WorldShape
    timing: TimeModel
    faults: FaultPoints
    cells: Sequence[SimCell]

    def exchange(self, step: int, attempt: int, members: tuple[int, ...]) -> Exchange: ...
    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...
    def kill_cell(self, index: int) -> None: ...
    def heartbeat_reply(self) -> Awaitable[None]: ...
    def control_reply(self) -> Awaitable[None]: ...


class SimCell(Mortal):
    def __init__(self, cluster: CellCluster, index: int) -> None:
        super().__init__(cluster.rt, f"cell-{index}")
        self.cluster = cluster
        self.index = index
        self._compute = cluster.rt.rng(f"cell-{index}.compute")
        self._heartbeat = f"heartbeat-{index}"
        """What a dropped-heartbeat fault impairs (named once: every heartbeat asks)."""
        self.raising = False
        """A rank raises in the step about to exchange (the fail_rank fault)."""

    def failure(self, reason: str) -> CellFailure:
        return CellFailure(self.index, reason)

    async def train(
        self, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> TrainReport:
        t = self.cluster.timing
        # the attempt's exchange group is joined first, so that a member that is dead now,
        # or dies before it arrives, fails it for the others (as the real trainer does)
        exchange = self.cluster.exchange(step, attempt, members)
        if self.dead:
            exchange.fail()
            raise self.failure("dead")
        jitter = self._compute.uniform(1 - t.train_jitter, 1 + t.train_jitter)
        seconds = t.train_step_seconds * jitter * self.cluster.slowdown(f"cell-{self.index}")
        if t.batch_split_by_quorum:  # the step's batch is split among the quorum's cells
            seconds *= self.cluster.world.num_cells / len(members)
        seconds += t.train_fixed_seconds * jitter * self.cluster.slowdown(f"cell-{self.index}")
        if await self.work(seconds):
            raise self.failure("killed during forward/backward")
        fired = self.cluster.faults.fire(FaultPoint.BEFORE_ALLREDUCE, cell=self.index, step=step)
        if fired and self.dead:
            raise self.failure("killed before the gradient allreduce")
        if fired and self.raising:  # the world kills a cell whose rank raised, as Ray's does
            self.raising = False
            self.cluster.kill_cell(self.index)
            raise self.failure(f"a rank raised in train: RuntimeError: {RANK_FAILED}")
        exchange.arrive(self.index)
        if await self.rt.wait_any([exchange.done, self._death]) == 1:
            raise self.failure("killed during the gradient allreduce")
        # a quorum of one exchanges with nobody (the real trainer skips it: an attempt of one
        # CPU cell spends about 7 ms beyond its forward/backward, of two about 30 ms)
        if len(members) > 1 and await self.work(t.allreduce_seconds):
            raise self.failure("killed during the gradient allreduce")
        outcome = Outcome.DISCARDED if exchange.failed else Outcome.NORMAL
        return TrainReport(outcome, members, seconds)

    async def ping(self) -> None:
        """A control call to the cell's rank 0: a dead cell fails it at once; a live one
        answers after the world's control_reply_seconds, unless it died meanwhile."""
        if self.dead:
            raise self.failure("dead")
        if self.cluster.timing.control_reply_seconds:
            await self.cluster.control_reply()
            if self.dead:
                raise self.failure("died before it answered")

    def stop(self) -> None:
        self.cluster.kill_cell(self.index)

    def heartbeat(self) -> Awaitable[None]:
        """A healthy cell answers after the reply time: that wait itself is handed back (no
        coroutine around each of a large run's hundreds of thousands of heartbeats)."""
        if self.dead:
            return self._refused()
        if self.cluster.impaired(self._heartbeat):
            return self._heartbeat_when_healthy()
        return self.cluster.heartbeat_reply()

    async def _refused(self) -> None:
        """A dead process refuses the call at once, as Ray does a call to a dead actor."""
        raise self.failure("dead: the heartbeat was refused")

    async def _heartbeat_when_healthy(self) -> None:
        """A muted cell answers nothing until it is heard again (polled ten times per reply
        time), then as a healthy one does; one that dies meanwhile never answers."""
        while self.dead or self.cluster.impaired(self._heartbeat):
            await self.rt.sleep(self.cluster.timing.heartbeat_reply_seconds * 10)
        await self.rt.sleep(self.cluster.timing.heartbeat_reply_seconds)

    async def heal(self, heal: Heal) -> None:
        """Receive a checkpoint into this cell's running processes."""
        t, world = self.cluster.timing, self.cluster.world
        source = self.cluster.cells[heal.src_cell]
        if self.dead:
            raise self.failure("no running processes to heal")
        if source.dead:
            raise source.failure("dead before sending its checkpoint")
        self.cluster.faults.fire(FaultPoint.DURING_HEAL, cell=heal.dst_cell)
        self.cluster.faults.fire(FaultPoint.DURING_HEAL, cell=heal.src_cell)
        seconds = 3 * world.param_bytes / t.checkpoint_bytes_per_second  # weights + 2 moments
        outcome = await self.work(seconds, source._death)
        if outcome == 1:
            raise self.failure("killed while receiving a checkpoint")
        if outcome == 2:
            raise source.failure("killed while sending a checkpoint")


class Exchange:
    """One cross-cell gradient all-reduce of a step attempt."""

    def __init__(self, cluster: CellCluster, members: tuple[int, ...]) -> None:
        self.members = set(members)
        self.arrived: set[int] = set()
        self.failed = False
        self.done = cluster.rt.signal()
        for cell in members:
            if cluster.cells[cell].dead:
                self.fail()

    def arrive(self, cell: int) -> None:
        self.arrived.add(cell)
        if self.arrived >= self.members:
            self.done.set()

    def fail(self) -> None:
        self.failed = True
        self.done.set()
