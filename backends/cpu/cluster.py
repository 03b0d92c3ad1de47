"""The real world behind miles_core's backend protocols: Ray actors, HTTP, gloo.

Translation only: every call maps to an actor method or an SGLang endpoint,
and every way it can fail maps to the failure the protocol names (a dead
actor or a refused connection is a CellFailure / EngineFailure). What to do
about a failure is the orchestration's decision, never made here.

Faults from scenario files act through the FaultTarget methods. A kill at a
named point strikes inside the call about to be made (``before_allreduce``:
the rank exits after its backward pass; ``mid_generation``: the engine exits
halfway through the request); any other kill is ``ray.kill`` at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import ray
import torch.distributed as dist
from ray.exceptions import RayActorError
from ray.util.placement_group import PlacementGroup

from backends.common.ray_session import LOOPBACK, in_bundle
from backends.cpu.engine import DIE_MIDWAY, EngineActor
from backends.cpu.policy import (
    RESPONSE_TOKENS,
    PolicyConfig,
    Trajectory,
    build_model,
    prompt_tokens,
    reward,
    update_units,
)
from backends.cpu.trainer import TrainerActor
from miles_core.backend import (
    CellFailure,
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RouterFailure,
)
from miles_core.buffer import Group, SampleStatus
from miles_core.cells import Heal, Outcome
from miles_core.events import WeightsChecked
from miles_core.loop import Orchestrator
from miles_core.placement import Placement
from miles_core.runtime import Runtime
from miles_core.transfer import Bucket, ParamSpec, UpdateUnit
from sim.faults import ScheduledFaults
from sim.runtime import derive_seed

ACTOR_DIED = (RayActorError,)
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=120)


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
    call raises CellFailure.
    """

    def __init__(self, world: RayWorld, index: int) -> None:
        self.world = world
        self.index = index
        self.ranks: list[Any] = []
        self.incarnation = 0
        self.doomed = False

    def failure(self, reason: str) -> CellFailure:
        return CellFailure(self.index, reason)

    async def start(self) -> None:
        """New rank processes; a sharded cell's ranks form their own torch world, named by
        the cell and its incarnation (a rendezvous name is never reused)."""
        self.incarnation += 1
        bundles = self.world.placement.cell_bundles(self.index)
        world = f"cell{self.index}.{self.incarnation}"
        self.ranks = [
            TrainerActor.options(
                num_gpus=self.world.placement.layout.train_actor_gpu_fraction,
                scheduling_strategy=in_bundle(self.world.pg, bundle),
            ).remote(
                self.index, self.world.policy, rank, len(bundles), self.world.store_addr, world
            )
            for rank, bundle in enumerate(bundles)
        ]
        await self.call("ready")

    async def call(self, method: str, *args: Any) -> list[Any]:
        """The same call on every rank; their results in rank order."""
        return await self.call_each(method, [args] * len(self.ranks))

    async def call_each(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if not self.ranks:
            raise self.failure("not running")
        calls = [getattr(r, method).remote(*a) for r, a in zip(self.ranks, args, strict=True)]
        try:
            return list(await asyncio.gather(*calls))
        except ACTOR_DIED as died:
            self.kill()  # one rank gone: the rest would wait in its collectives
            raise self.failure(f"a rank died in {method}: {type(died).__name__}") from None

    async def train(
        self, step: int, attempt: int, batch: Sequence[Group], members: tuple[int, ...]
    ) -> Outcome:
        self.world.faults.fire("before_allreduce", cell=self.index, step=step)
        doomed, self.doomed = self.doomed, False
        trajectories = [
            [s.payload for s in g.samples() if s.status is not SampleStatus.ABORTED] for g in batch
        ]
        slowdown = self.world.slowdown(f"cell-{self.index}")
        store = self.world.store_addr
        args = (step, attempt, trajectories, members, store, doomed, slowdown)
        results = await self.call("train", *args)
        if all(r["outcome"] == "normal" for r in results):
            return Outcome.NORMAL
        return Outcome.DISCARDED

    async def heal(self, heal: Heal) -> None:
        """Rank i of the source sends its share of model and optimizer to rank i here."""
        self.world.faults.fire("during_heal", cell=heal.dst_cell)
        self.world.faults.fire("during_heal", cell=heal.src_cell)
        source = self.world.cells[heal.src_cell]
        states = await source.call("get_state")
        if not self.ranks:  # a restarted cell: new processes, then the checkpoint
            try:
                await self.start()
            except ACTOR_DIED:
                self.kill()
                raise self.failure("died while starting") from None
        await self.call_each("set_state", [(state,) for state in states])

    async def ping(self) -> None:
        await self.call("heartbeat")

    async def heartbeat(self) -> None:
        if not self.ranks or self.world.impaired(f"heartbeat-{self.index}"):
            await _forever()
        try:
            await asyncio.gather(*(r.heartbeat.remote() for r in self.ranks))
        except ACTOR_DIED:
            await _forever()  # a dead cell never answers

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []

    def stop(self) -> None:
        self.kill()


class RayEngine:
    """An engine actor and the HTTP client the control plane talks to it with."""

    def __init__(self, world: RayWorld, engine_id: str, position: int) -> None:
        self.world = world
        self.id = engine_id
        self.position = position
        self.actor: Any = None
        self.url: str | None = None
        self.doomed = False

    async def start(self) -> None:
        bundle = self.world.placement.engine_bundles(self.position)[0]
        self.actor = EngineActor.options(
            num_gpus=self.world.placement.layout.engine_actor_gpu_fraction,
            scheduling_strategy=in_bundle(self.world.pg, bundle),
        ).remote(self.id, self.world.policy)
        port = await self.actor.start.remote()
        self.url = f"http://{LOOPBACK}:{port}"

    def kill(self) -> None:
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self.actor, self.url = None, None

    async def request(
        self, method: str, path: str, body: dict[str, Any] | None = None, **headers: str
    ) -> dict[str, Any]:
        if self.url is None:
            raise EngineFailure(self.id, "not running")
        try:
            async with self.world.http.request(
                method, self.url + path, json=body, headers=headers
            ) as reply:
                if reply.status >= 400:
                    text = (await reply.text())[:200]
                    raise EngineFailure(self.id, f"{path} answered {reply.status}: {text}")
                return await reply.json(content_type=None) if reply.content_length != 0 else {}
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
            raise EngineFailure(self.id, f"{path}: {type(error).__name__}") from None

    async def pause(self) -> None:
        await self.request("POST", "/pause_generation", {"mode": "abort"})

    async def resume(self) -> None:
        await self.request("POST", "/continue_generation", {})

    async def stamp(self, version: int) -> None:
        await self.request("POST", "/update_weight_version", {"new_version": str(version)})
        reply = await self.request("GET", "/testbed/weights_checksum")
        self.world.weights_checked(self.id, version, reply["checksum"])

    async def unload_adapter(self, adapter: str) -> None:
        raise EngineFailure(self.id, "the CPU backend trains full parameters, not LoRA")


class RayRouter:
    """Routes each call to the engine the orchestration chose (see the closing note on
    sglang-router: its own policy would override miles_core's least-load choice)."""

    def __init__(self, world: RayWorld) -> None:
        self.world = world

    async def generate(self, engine: str, request: GenerateRequest) -> GenerateResult:
        world = self.world
        if world.impaired("router-fail"):
            raise RouterFailure("router failing (injected)")
        if world.impaired("router-delay"):
            await asyncio.sleep(world.slowdown("router-delay") - 1.0)
        target = world.engines[engine]
        world.faults.fire("mid_generation", engine=engine)
        headers = {DIE_MIDWAY: "1"} if target.doomed else {}
        target.doomed = False
        prompt = prompt_tokens(world.seed, request.prompt_id)
        seed = derive_seed(world.seed, f"sample-{request.group_id}-{request.sample}") % 2**31
        body = {
            "rid": f"g{request.group_id}-s{request.sample}",
            "input_ids": prompt,
            "sampling_params": {
                "max_new_tokens": RESPONSE_TOKENS,
                "temperature": 1.0,
                "sampling_seed": seed,
            },
            "return_logprob": True,
        }
        reply = await target.request("POST", "/generate", body, **headers)
        meta = reply["meta_info"]
        version = None if meta["weight_version"] == "default" else int(meta["weight_version"])
        aborted = meta["finish_reason"]["type"] == "abort"
        response = tuple(reply["output_ids"])
        score = reward(prompt, response)
        world.rewards[request.group_id] = (*world.rewards.get(request.group_id, ()), score)
        return GenerateResult(
            engine=engine,
            weight_version=version,
            aborted=aborted,
            reward=score,
            payload=Trajectory(tuple(prompt), response, score),
        )


class GlooTransport:
    """Buckets from the source cell's rank to engines over a gloo group per update.

    SGLang's sequence: /init_weights_update_group on every engine while the
    trainer joins as rank 0, then per bucket a broadcast from the trainer while
    each engine serves /update_weights_from_distributed. Broadcast mode makes
    one group of all engines; p2p one group per engine.
    """

    def __init__(self, world: RayWorld) -> None:
        self.world = world
        self._groups: dict[tuple[int, tuple[str, ...]], str] = {}

    async def _all(self, calls: dict[str, Any], source: int) -> list[Any]:
        """Run calls at once and name who failed.

        A dead source cell or engine raises at once (the trainer must not sit in a
        rendezvous timeout before the orchestration hears of it). A collective that
        failed inside a live trainer means a peer vanished: the engines' own replies
        then say which one.
        """
        tasks = {asyncio.ensure_future(c): who for who, c in calls.items()}
        pending: set[asyncio.Future[Any]] = set(tasks)
        try:
            while pending:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
                errors = [t.exception() for t in tasks if t.done() and t.exception()]
                component = [e for e in errors if isinstance(e, CellFailure)] + [
                    e for e in errors if isinstance(e, EngineFailure)
                ]
                if component:
                    raise component[0]
            errors = [t.exception() for t in tasks if t.exception()]
            if errors:  # only the trainer's collective failed, yet every engine answered
                raise CellFailure(source, f"collective failed: {errors[0]}")
            return [t.result() for t in tasks]
        finally:
            for t in pending:
                t.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _group(self, update_id: int, cell: RayCell, engines: tuple[str, ...]) -> str:
        key = (update_id, engines)
        if key in self._groups:
            return self._groups[key]
        for old in [k for k in self._groups if k[0] != update_id]:
            self._groups.pop(old)
        name = f"update{update_id}-{'+'.join(engines)}"
        world = len(engines) + 1
        host, port = self.world.store_addr
        calls: dict[str, Any] = {"cell": cell.call("init_update_group", (host, port), name, world)}
        for rank, engine in enumerate(engines, start=1):
            body = {
                "master_address": host,
                "master_port": port,
                "rank_offset": rank,
                "world_size": world,
                "group_name": name,
                "backend": "gloo",
            }
            calls[engine] = self.world.engines[engine].request(
                "POST", "/init_weights_update_group", body
            )
        await self._all(calls, cell.index)
        if update_id not in self.world.trainer_checksums:
            self.world.trainer_checksums[update_id] = (await cell.call("checksum"))[0]
        self.world.current_update = update_id
        self._groups[key] = name
        return name

    async def send_bucket(
        self, update_id: int, source_cell: int, bucket: Bucket, engines: tuple[str, ...]
    ) -> None:
        cell = self.world.cells[source_cell]
        name = await self._group(update_id, cell, engines)
        body = {
            "names": [s.name for s in bucket.spans],
            "dtypes": [s.dtype for s in bucket.spans],
            "shapes": [list(s.shape) for s in bucket.spans],
            "group_name": name,
            "load_format": "flattened_bucket",
            "flush_cache": True,
        }
        calls: dict[str, Any] = {"cell": cell.call("send_bucket", name, bucket)}
        for engine in engines:
            calls[engine] = self.world.engines[engine].request(
                "POST", "/update_weights_from_distributed", body
            )
        started = self.world.rt.now()
        if self.world.impaired("link"):
            await asyncio.sleep(0.01 * (self.world.slowdown("link") - 1))
        seconds = (await self._all(calls, source_cell))[0][0]  # the cell's rank 0
        self.world.transfers.add(update_id, bucket.nbytes, seconds, self.world.rt.now() - started)
        # the bucket arrived; a fault here kills the updater before its next step
        self.world.faults.fire("after_bucket", cell=source_cell, bucket=bucket.index)


class RayWorld:
    """The Cluster protocol over Ray, and the FaultTarget the scenario's faults act on."""

    def __init__(
        self,
        rt: Runtime,
        *,
        num_cells: int,
        gpus_per_cell: int,
        num_engines: int,
        policy: PolicyConfig,
        pg: PlacementGroup,
        placement: Placement,
        faults: ScheduledFaults,
        seed: int,
    ) -> None:
        self.rt = rt
        self.num_cells = num_cells
        self.gpus_per_cell = gpus_per_cell
        self.engine_ids = tuple(f"engine-{i}" for i in range(num_engines))
        self.policy = policy
        self.pg = pg
        self.placement = placement
        self.faults = faults
        self.seed = seed
        model = build_model(policy)
        self.units: tuple[UpdateUnit, ...] = update_units(model)
        self.model_bytes = sum(u.nbytes for u in self.units)
        self.lora_params: tuple[ParamSpec, ...] = ()
        self.cells = {i: RayCell(self, i) for i in range(num_cells)}
        self.engines = {e: RayEngine(self, e, i) for i, e in enumerate(self.engine_ids)}
        self.router = RayRouter(self)
        self.transport = GlooTransport(self)
        self.store = dist.TCPStore(LOOPBACK, 0, is_master=True, wait_for_workers=False)
        self.store_addr = (LOOPBACK, self.store.port)
        self.http = aiohttp.ClientSession(timeout=HTTP_TIMEOUT)
        self.control: Orchestrator | None = None
        self.trainer_checksums: dict[int, str] = {}
        self.current_update = -1
        self.rewards: dict[int, tuple[float, ...]] = {}
        self.transfers = TransferLog()
        self._impaired: dict[str, tuple[float, float]] = {}

    async def start(self) -> None:
        await asyncio.gather(
            *(c.start() for c in self.cells.values()), *(e.start() for e in self.engines.values())
        )

    async def close(self) -> None:
        for cell in self.cells.values():
            cell.kill()
        for engine in self.engines.values():
            engine.kill()
        await self.http.close()
        del self.store

    def attach(self, control: Orchestrator) -> None:
        self.control = control

    def cell(self, index: int) -> RayCell:
        return self.cells[index]

    def engine(self, engine_id: str) -> RayEngine:
        return self.engines[engine_id]

    def weights_checked(self, engine: str, version: int, engine_checksum: str) -> None:
        assert self.control is not None
        self.control.emit(
            WeightsChecked,
            engine=engine,
            version=version,
            checksum=engine_checksum,
            trainer_checksum=self.trainer_checksums[self.current_update],
        )

    # -- FaultTarget -----------------------------------------------------------------

    def kill_cell(self, index: int, point: str | None) -> None:
        if point == "before_allreduce":
            self.cells[index].doomed = True  # RayCell.train passes it into the call
        else:
            self.cells[index].kill()

    def kill_engine(self, engine: str, point: str | None) -> None:
        if point == "mid_generation":
            self.engines[engine].doomed = True  # RayRouter.generate sends the header
        else:
            self.engines[engine].kill()

    async def restart_engine(self, engine: str) -> None:
        self.engines[engine].kill()
        await self.engines[engine].start()

    def impair(self, what: str, factor: float, seconds: float) -> None:
        self._impaired[what] = (factor, self.rt.now() + seconds)

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
