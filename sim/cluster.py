"""A simulated cluster: trainer cells, engines, a router and a weight transport in virtual time.

It implements miles_core.backend's protocols with time models and nothing
else: it does what it is asked, takes as long as the models say, and fails
when a fault says so. It never retries, never picks an engine, never numbers
a version; the orchestration decides all of that.

Time models (all parameters in SimConfig):

- generation: response length ~ lognormal(mean, sigma) tokens x decode time per
  token, slowed by (1 + slowdown x concurrent requests on the engine);
- a train step: compute time with jitter, then the cross-cell gradient
  exchange, which fails for every member if one member died before it;
- a bucket: link latency + bytes / bandwidth per send (a broadcast is one
  send to all engines, p2p one send per engine); the bandwidth is NVLink's when
  the source cell and every target engine sit on one node, the inter-node
  link's otherwise. Who sits where comes from miles_core.placement: the
  cluster's GPU bundles (handed out in a seeded random order, as Ray does) are
  ordered and laid out like miles' disaggregated mode with independent-DP cells;
- healing: checkpoint bytes / checkpoint bandwidth.

A killed component stops at its current await: work in progress raises its
CellFailure or EngineFailure at once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from miles_core.backend import (
    CellFailure,
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RouterFailure,
)
from miles_core.buffer import Group
from miles_core.cells import Heal, Outcome
from miles_core.placement import Bundle, LayoutConfig, Placement, compute_layout, place
from miles_core.transfer import Bucket, ParamSpec, UpdateUnit, units_of
from sim.runtime import SimRuntime, SimSignal


@dataclass(frozen=True)
class SimConfig:
    """The simulated hardware and model; presets live in sim/scenarios.py (PRESETS)."""

    num_cells: int = 2
    gpus_per_cell: int = 1
    num_engines: int = 2
    param_bytes: int = 64 * 1024**2
    num_tensors: int = 16
    response_tokens_mean: float = 256.0
    response_tokens_sigma: float = 0.5
    decode_seconds_per_token: float = 0.01
    concurrency_slowdown: float = 0.02
    train_step_seconds: float = 5.0
    train_jitter: float = 0.1
    allreduce_seconds: float = 0.2
    link_latency_seconds: float = 1e-4
    link_bytes_per_second: float = 10e9
    """Between nodes (the weight-transfer link: InfiniBand / RoCE)."""
    nvlink_bytes_per_second: float = 100e9
    """Within a node: a bucket whose source and targets share a node moves at this rate."""
    gpus_per_node: int = 8
    gpus_per_engine: int = 1
    checkpoint_bytes_per_second: float = 2e9
    heartbeat_reply_seconds: float = 0.01
    router_failure_seconds: float = 0.5
    """How long a failing router takes to answer with an error."""

    def lora_params(self) -> tuple[ParamSpec, ...]:
        """A rank-16 adapter on each layer: lora_A (16 x 1024) and lora_B (1024 x 16), bf16."""
        return tuple(
            ParamSpec.of(f"layer{i}.{name}.weight", shape, "bfloat16")
            for i in range(self.num_tensors)
            for name, shape in (("lora_A", (16, 1024)), ("lora_B", (1024, 16)))
        )

    def units(self) -> tuple[UpdateUnit, ...]:
        """num_tensors bf16 tensors of equal size adding up to param_bytes."""
        per_tensor = max(1, self.param_bytes // (2 * self.num_tensors))
        params = [
            ParamSpec.of(f"layer{i}.weight", (per_tensor,), "bfloat16")
            for i in range(self.num_tensors)
        ]
        return units_of(params)


class _Mortal:
    """Shared by cells and engines: work that a kill interrupts."""

    def __init__(self, rt: SimRuntime, name: str) -> None:
        self.rt = rt
        self.name = name
        self.dead = False
        self._death: SimSignal = rt.signal()

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            self._death.set()

    def revive(self) -> None:
        self.dead = False
        self._death = self.rt.signal()

    async def work(self, seconds: float, *interrupts: SimSignal) -> int:
        """Take ``seconds``; 0 when done, 1 when killed, 2+i when interrupts[i] fired."""
        return await self.rt.wait_any([self.rt.timer(seconds), self._death, *interrupts])


class SimCell(_Mortal):
    def __init__(self, cluster: SimCluster, index: int) -> None:
        super().__init__(cluster.rt, f"cell-{index}")
        self.cluster = cluster
        self.index = index

    def failure(self, reason: str) -> CellFailure:
        return CellFailure(self.index, reason)

    async def train(
        self, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> Outcome:
        c = self.cluster.config
        if self.dead:
            raise self.failure("dead")
        jitter = self.rt.rng(f"cell-{self.index}.compute").uniform(
            1 - c.train_jitter, 1 + c.train_jitter
        )
        slow = self.cluster.slowdown(f"cell-{self.index}")
        if await self.work(c.train_step_seconds * jitter * slow):
            raise self.failure("killed during forward/backward")
        if self.cluster.faults.fire("before_allreduce", cell=self.index, step=step):
            raise self.failure("killed before the gradient allreduce")
        exchange = self.cluster.exchange(step, attempt, members)
        exchange.arrive(self.index)
        if await self.rt.wait_any([exchange.done, self._death]) == 1:
            raise self.failure("killed during the gradient allreduce")
        if await self.work(c.allreduce_seconds):
            raise self.failure("killed during the gradient allreduce")
        return Outcome.DISCARDED if exchange.failed else Outcome.NORMAL

    async def ping(self) -> None:
        if self.dead:
            raise self.failure("dead")

    def stop(self) -> None:
        self.cluster.kill_cell(self.index)

    async def heartbeat(self) -> None:
        while self.dead or self.cluster.impaired(f"heartbeat-{self.index}"):
            await self.rt.sleep(self.cluster.config.heartbeat_reply_seconds * 10)
        await self.rt.sleep(self.cluster.config.heartbeat_reply_seconds)

    async def heal(self, heal: Heal) -> None:
        c = self.cluster.config
        source = self.cluster.cells[heal.src_cell]
        if source.dead:
            raise source.failure("dead before sending its checkpoint")
        self.revive()
        self.cluster.faults.fire("during_heal", cell=heal.dst_cell)
        self.cluster.faults.fire("during_heal", cell=heal.src_cell)
        seconds = 3 * c.param_bytes / c.checkpoint_bytes_per_second  # weights + 2 Adam moments
        outcome = await self.work(seconds, source._death)
        if outcome == 1:
            raise self.failure("killed while receiving a checkpoint")
        if outcome == 2:
            raise source.failure("killed while sending a checkpoint")


class _Exchange:
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
    def __init__(self, cluster: SimCluster, engine_id: str) -> None:
        super().__init__(cluster.rt, engine_id)
        self.cluster = cluster
        self.id = engine_id
        self.version: int | None = None
        self.adapter: str | None = None
        self.incarnation = 0
        self.paused = False
        self._resumed = cluster.rt.signal()
        self._abort = cluster.rt.signal()
        self.in_flight = 0
        self._lengths = cluster.rt.rng(f"{engine_id}.lengths")
        self._rewards = cluster.rt.rng(f"{engine_id}.rewards")
        """Looked up once: a stream is the same object for the whole run (rt.rng's contract)."""

    def failure(self, reason: str) -> EngineFailure:
        return EngineFailure(self.id, reason)

    def restart(self) -> None:
        """A fresh process: initial weights, no version, not paused."""
        self.incarnation += 1
        self.revive()
        self.version = None
        self.paused = False
        self._resumed = self.rt.signal()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        c = self.cluster.config
        if self.dead:
            raise self.failure("dead")
        death = self._death  # the request belongs to this process, not to a restarted one
        while self.paused:
            await self.rt.wait_any([self._resumed, death])
            if death.is_set():
                raise self.failure("killed while the request waited for resume")
        sigma = c.response_tokens_sigma
        mu = math.log(c.response_tokens_mean) - sigma**2 / 2
        tokens = self._lengths.lognormvariate(mu, sigma)
        self.in_flight += 1
        seconds = (
            tokens * c.decode_seconds_per_token * (1 + c.concurrency_slowdown * self.in_flight)
        )
        self.cluster.faults.fire("mid_generation", engine=self.id, delay=seconds / 2)
        outcome = await self.work(seconds, self._abort)
        self.in_flight -= 1
        if outcome == 1:
            raise self.failure("killed mid-generation")
        reward = self._rewards.random()
        return GenerateResult(self.id, self.version, aborted=outcome == 2, reward=reward)

    async def pause(self) -> None:
        if self.dead:
            raise self.failure("dead")
        if not self.paused:  # a second pause (a retried update) keeps the waiters' signal
            self.paused = True
            self._resumed = self.rt.signal()
        self._abort.set()  # in-flight requests return aborted (SGLang's abort mode)
        self._abort = self.rt.signal()

    async def resume(self) -> None:
        if self.dead:
            raise self.failure("dead")
        self.paused = False
        self._resumed.set()

    async def stamp(self, version: int) -> None:
        if self.dead:
            raise self.failure("dead")
        self.version = version

    async def unload_adapter(self, adapter: str) -> None:
        if self.dead:
            raise self.failure("dead")
        self.adapter = None


class SimRouter:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    async def generate(self, engine: str, request: GenerateRequest) -> GenerateResult:
        if self.cluster._impairments:  # nothing was ever impaired: no delay, no failure
            delay = self.cluster.slowdown("router-delay") - 1.0
            if delay > 0:
                await self.cluster.rt.sleep(delay)
            if self.cluster.impaired("router-fail"):
                await self.cluster.rt.sleep(self.cluster.config.router_failure_seconds)
                raise RouterFailure(f"request for group {request.group_id} to {engine} failed")
        return await self.cluster.engines[engine].generate(request)


class SimTransport:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._groups: dict[int, dict[str, int]] = {}
        """update_id -> the incarnation of each engine when it joined the transfer."""

    async def send_bucket(
        self, update_id: int, source_cell: int, bucket: Bucket, engines: tuple[str, ...]
    ) -> None:
        c = self.cluster.config
        source = self.cluster.cells[source_cell]
        group = self._groups.setdefault(update_id, {})
        for engine in engines:
            process = self.cluster.engines[engine]
            if process.dead:
                raise process.failure("dead during a weight update")
            if group.setdefault(engine, process.incarnation) != process.incarnation:
                # a restarted process is not a member of this update's transfer group
                raise process.failure("restarted during the weight update")
        slow = self.cluster.slowdown("link")
        local = (
            all(
                self.cluster.engine_nodes[e] <= self.cluster.cell_nodes[source_cell]
                for e in engines
            )
            and len(self.cluster.cell_nodes[source_cell]) == 1
        )
        rate = c.nvlink_bytes_per_second if local else c.link_bytes_per_second
        seconds = c.link_latency_seconds + bucket.nbytes * slow / rate
        if await source.work(seconds):
            raise source.failure(f"killed sending bucket {bucket.index}")
        # the bucket arrived; a fault here kills the updater before its next step
        self.cluster.faults.fire("after_bucket", cell=source_cell, bucket=bucket.index)


def _place(config: SimConfig, rng: random.Random) -> Placement:
    """The cluster's GPUs as Ray would hand them out, placed by miles_core.placement."""
    actor = config.num_cells * config.gpus_per_cell
    rollout = config.num_engines * config.gpus_per_engine
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=actor,
            rollout_num_gpus=rollout,
            rollout_num_gpus_per_engine=config.gpus_per_engine,
            indep_dp=True,
            gpus_per_cell=config.gpus_per_cell,
        )
    )
    per_node = config.gpus_per_node
    bundles = [
        Bundle(
            index=i,
            node=f"10.0.{i // per_node // 256}.{i // per_node % 256 + 1}",
            gpu_id=i % per_node,
        )
        for i in range(layout.total_gpus)
    ]
    rng.shuffle(bundles)  # Ray's bundle order carries no meaning; the ordering restores one
    return place(layout, bundles)


class SimCluster:
    """The whole simulated world for one run."""

    def __init__(
        self, rt: SimRuntime, config: SimConfig, faults: FaultPoints | None = None
    ) -> None:
        self.rt = rt
        self.config = config
        self.faults = faults if faults is not None else FaultPoints()
        self.num_cells = config.num_cells
        self.gpus_per_cell = config.gpus_per_cell
        self.engine_ids = tuple(f"engine-{i}" for i in range(config.num_engines))
        self.units = config.units()
        self.lora_params = config.lora_params()
        self.placement = _place(config, rt.rng("placement"))
        self.cell_nodes = [
            {b.node for b in self.placement.cell_bundles(i)} for i in range(config.num_cells)
        ]
        self.engine_nodes = {
            e: {b.node for b in self.placement.engine_bundles(i)}
            for i, e in enumerate(self.engine_ids)
        }
        self.cells = [SimCell(self, i) for i in range(config.num_cells)]
        self.engines = {e: SimEngine(self, e) for e in self.engine_ids}
        self.router = SimRouter(self)
        self.transport = SimTransport(self)
        self._exchanges: dict[tuple[int, int], _Exchange] = {}
        self._impairments: dict[str, tuple[float, float]] = {}
        """what -> (factor, until): slow cells and links, router delays and failures."""

    def impair(self, what: str, factor: float, seconds: float) -> None:
        """Slow ``what`` by ``factor`` for ``seconds`` (router-delay: add factor - 1 seconds)."""
        self._impairments[what] = (factor, self.rt.now() + seconds)

    def slowdown(self, what: str) -> float:
        factor, until = self._impairments.get(what, (1.0, 0.0))
        return factor if self.rt.now() < until else 1.0

    def impaired(self, what: str) -> bool:
        return self.rt.now() < self._impairments.get(what, (1.0, 0.0))[1]

    def cell(self, index: int) -> SimCell:
        return self.cells[index]

    def engine(self, engine_id: str) -> SimEngine:
        return self.engines[engine_id]

    def exchange(self, step: int, attempt: int, members: tuple[int, ...]) -> _Exchange:
        key = (step, attempt)
        if key not in self._exchanges:
            self._exchanges[key] = _Exchange(self, members)
        return self._exchanges[key]

    def kill_cell(self, index: int, point: str | None = None) -> None:
        """Kill at once: in virtual time the named point is now."""
        del point
        self.cells[index].kill()
        for exchange in self._exchanges.values():
            if index in exchange.members and not exchange.done.is_set():
                exchange.fail()

    def kill_engine(self, engine_id: str, point: str | None = None) -> None:
        del point
        self.engines[engine_id].kill()

    async def restart_engine(self, engine_id: str) -> None:
        engine = self.engines[engine_id]
        engine.kill()
        engine.restart()


class FaultPoints:
    """Named points in the cluster's code where a scheduled fault may fire.

    ``fire`` applies every matching fault (the kill happens inside it, or after
    ``delay`` virtual seconds) and says whether one fired. The default fires
    nothing; sim/faults.py installs a scenario's faults.
    """

    def fire(self, point: str, **where: object) -> bool:
        del point, where
        return False
