"""Simulated trainer cells and engines: they do what they are asked, for as long as the
time models say, and fail when they are dead.

A component's processes die with ``kill`` (work in progress raises its
CellFailure or EngineFailure at once) and a new set starts with ``start``
(a new incarnation). A call addressed to an engine process that was replaced
fails as the real client's would: the process it was meant for is gone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from miles_core.backend import (
    CellFailure,
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    TrainReport,
)
from miles_core.buffer import Group
from miles_core.cells import Heal, Outcome
from miles_core.kinds import FaultPoint
from sim.runtime import SimRuntime, SimSignal

if TYPE_CHECKING:
    from sim.cluster import SimCluster


class _Mortal:
    """Shared by cells and engines: processes that a kill interrupts and a start replaces."""

    def __init__(self, rt: SimRuntime, name: str) -> None:
        self.rt = rt
        self.name = name
        self.dead = False
        self.incarnation = 0
        self._death: SimSignal = rt.signal()

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            self._death.set()

    def start(self) -> int:
        """New processes (killing the old ones first): the new incarnation."""
        self.kill()
        self.incarnation += 1
        self.dead = False
        self._death = self.rt.signal()
        return self.incarnation

    async def work(self, seconds: float, *interrupts: SimSignal) -> int:
        """Take ``seconds``; 0 when done, 1 when killed, 2+i when interrupts[i] fired."""
        return await self.rt.wait_any([self.rt.timer(seconds), self._death, *interrupts])


class SimCell(_Mortal):
    def __init__(self, cluster: SimCluster, index: int) -> None:
        super().__init__(cluster.rt, f"cell-{index}")
        self.cluster = cluster
        self.index = index
        self._compute = cluster.rt.rng(f"cell-{index}.compute")

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
        if await self.work(seconds):
            raise self.failure("killed during forward/backward")
        fired = self.cluster.faults.fire(FaultPoint.BEFORE_ALLREDUCE, cell=self.index, step=step)
        if fired and self.dead:
            raise self.failure("killed before the gradient allreduce")
        exchange.arrive(self.index)
        if await self.rt.wait_any([exchange.done, self._death]) == 1:
            raise self.failure("killed during the gradient allreduce")
        if await self.work(t.allreduce_seconds):
            raise self.failure("killed during the gradient allreduce")
        outcome = Outcome.DISCARDED if exchange.failed else Outcome.NORMAL
        return TrainReport(outcome, members, seconds)

    async def ping(self) -> None:
        if self.dead:
            raise self.failure("dead")

    def stop(self) -> None:
        self.cluster.kill_cell(self.index)

    async def heartbeat(self) -> None:
        while self.dead or self.cluster.impaired(f"heartbeat-{self.index}"):
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

    def __init__(self, cluster: SimCluster, members: tuple[int, ...]) -> None:
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


class SimEngine(_Mortal):
    """One engine slot; its process is replaced on restart."""

    def __init__(self, cluster: SimCluster, engine_id: str) -> None:
        super().__init__(cluster.rt, engine_id)
        self.cluster = cluster
        self.id = engine_id
        self.version: int | None = None
        self.adapter: str | None = None
        self.paused = False
        self._resumed = cluster.rt.signal()
        self._abort = cluster.rt.signal()
        self.in_flight = 0
        self._lengths = cluster.rt.rng(f"{engine_id}.lengths")
        self._rewards = cluster.rt.rng(f"{engine_id}.rewards")
        """Looked up once: a stream is the same object for the whole run (rt.rng's contract)."""

    def failure(self, reason: str) -> EngineFailure:
        return EngineFailure(self.id, reason)

    def check(self, incarnation: int) -> None:
        """Raise as a client would when the process it addresses is gone."""
        if incarnation != self.incarnation:
            raise self.failure(f"process {incarnation} was replaced by {self.incarnation}")
        if self.dead:
            raise self.failure("dead")

    def start(self) -> int:
        """A fresh process: initial weights, no version, not paused."""
        incarnation = super().start()
        self.version = None
        self.adapter = None
        self.paused = False
        self._resumed = self.rt.signal()
        return incarnation

    async def generate(self, incarnation: int, request: GenerateRequest) -> GenerateResult:
        t = self.cluster.timing
        self.check(incarnation)
        started = self.rt.now()
        death = self._death  # the request belongs to this process, not to a restarted one
        while self.paused:
            await self.rt.wait_any([self._resumed, death])
            if death.is_set():
                raise self.failure("killed while the request waited for resume")
        sigma = t.response_tokens_sigma
        mu = math.log(t.response_tokens_mean) - sigma**2 / 2
        tokens = self._lengths.lognormvariate(mu, sigma)
        self.in_flight += 1
        seconds = (
            tokens * t.decode_seconds_per_token * (1 + t.concurrency_slowdown * self.in_flight)
        )
        self.cluster.faults.fire(FaultPoint.MID_GENERATION, engine=self.id, delay=seconds / 2)
        outcome = await self.work(seconds, self._abort)
        self.in_flight -= 1
        if outcome == 1:
            raise self.failure("killed mid-generation")
        return GenerateResult(
            self.id,
            self.version,
            aborted=outcome == 2,
            reward=self._rewards.random(),
            engine_seconds=self.rt.now() - started,
        )

    async def pause(self) -> None:
        if not self.paused:  # a second pause (a retried update) keeps the waiters' signal
            self.paused = True
            self._resumed = self.rt.signal()
        self._abort.set()  # in-flight requests return aborted (SGLang's abort mode)
        self._abort = self.rt.signal()

    async def resume(self) -> None:
        self.paused = False
        self._resumed.set()

    async def stamp(self, version: int) -> None:
        self.version = version

    async def unload_adapter(self, adapter: str) -> None:
        self.adapter = None


class EngineHandle:
    """Calls to one process of an engine; they fail once that process is gone."""

    def __init__(self, engine: SimEngine, incarnation: int) -> None:
        self.engine = engine
        self.id = engine.id
        self.incarnation = incarnation

    async def pause(self) -> None:
        self.engine.check(self.incarnation)
        await self.engine.pause()

    async def resume(self) -> None:
        self.engine.check(self.incarnation)
        await self.engine.resume()

    async def stamp(self, version: int) -> None:
        self.engine.check(self.incarnation)
        await self.engine.stamp(version)

    async def unload_adapter(self, adapter: str) -> None:
        self.engine.check(self.incarnation)
        await self.engine.unload_adapter(adapter)
