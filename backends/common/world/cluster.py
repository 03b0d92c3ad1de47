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

RayCluster holds the parts (cells: cell.py; engine slots: engine_slot.py; the router:
router.py; a transport: transport.py) and what they share: the settings (settings.py),
the placement, the store, the fault points, the impairment timetable. Each part sees it
through a short Protocol of its own.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import torch.distributed as dist
from ray.util.placement_group import PlacementGroup

from backends.common.session.ray_session import LOOPBACK
from backends.common.stack import CPU_STACK, Stack
from backends.common.training.policy import AnyPolicy, build_model, update_units
from backends.common.training.task import ClimbTask, Task
from backends.common.world.adopted import report_restarted
from backends.common.world.cell import RayCell
from backends.common.world.engine_slot import EngineHandle, RayEngine
from backends.common.world.fanout import TransferLog
from backends.common.world.router import RayRouter
from backends.common.world.settings import HTTP_TIMEOUT, WorldSettings
from backends.common.world.transport import CollectiveTransport
from miles_core.backend import WorldObserver
from miles_core.impairments import Impairments
from miles_core.kinds import FaultPoint
from miles_core.placement import Placement
from miles_core.runtime import Runtime
from miles_core.saves import SaveState
from miles_core.scenario.schedule import FaultPoints
from miles_core.transfer import ParamSpec, UpdateUnit


class RayCluster:
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
        miles_today: bool = False,
    ) -> None:
        self.rt = rt
        self.settings = WorldSettings(
            policy=policy,
            seed=seed,
            stack=stack,
            engine_token_seconds=engine_token_seconds,
            collective_timeout=collective_timeout,
            flush_refuses_while_queued=flush_refuses_while_queued,
            prefix_cache=prefix_cache,
            miles_today=miles_today,
        )
        self.task: Task = task or ClimbTask(seed)
        """The prompts and the reward the router asks for (task.py)."""
        self.num_cells = num_cells
        self.gpus_per_cell = gpus_per_cell
        self.engine_ids = tuple(f"engine-{i}" for i in range(num_engines))
        self.pg = pg
        self.placement = placement
        self.faults = faults
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
        self.rewards: dict[int, tuple[float, ...]] = {}
        self.transfers = TransferLog()
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        """Set by the first of the world's own tasks that raised (a crash of the world)."""
        self.impairments = Impairments()
        """Slow cells and links, router delays and failures, muted heartbeats, cut links."""
        self.on_driver_lost: Callable[[FaultPoint | None], None] | None = None
        """What the run does when a restart_driver strikes (backends/common/run/
        driver_restart.py); None: no driver restarter runs."""
        self.driver_hold: Callable[[SaveState], None] | None = None
        """Where the trainer keeps the state a new driver adopts (adopted.py ``hold_sink``)."""
        self.resumed = False
        """A new driver's: what befell the processes before it attached is reported then."""
        self.driver_down = False
        """From a restart_driver until the new driver starts: the dead loop's calls and
        process actions go nowhere (a dead process sends nothing)."""

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
        if self.resumed:  # a hot-restarted driver (adopted.py)
            report_restarted(self, observer)

    def restart_driver(self, point: FaultPoint | None) -> None:
        """The driver alone dies, every process up (backends/common/run/driver_restart.py)."""
        if self.on_driver_lost is None:
            raise RuntimeError("restart_driver struck a cluster no driver restarter runs")
        self.on_driver_lost(point)

    def cell(self, index: int) -> RayCell:
        return self.cells[index]

    def engine(self, engine_id: str, incarnation: int) -> EngineHandle:
        return EngineHandle(self.engines[engine_id], incarnation)

    def restart_engine(self, engine_id: str) -> None:
        """A new process for the slot, killing the old one (its watch reports that exit); the
        new one is reported once it answers, or its death if it died while starting."""
        if not self.driver_down:
            self.spawn(self._restart_engine(engine_id), f"restart-{engine_id}")

    def stop_engine(self, engine_id: str) -> None:
        """The control plane stops the process (today's FT controller's suspend): its actor is
        killed, and its watch reports the exit."""
        if not self.driver_down:
            self.engines[engine_id].kill()

    async def _restart_engine(self, engine_id: str) -> None:
        incarnation = await self.engines[engine_id].start(recovery=True)
        if incarnation is not None and self.observer is not None:
            self.observer.engine_started(engine_id, incarnation, "actor started, /health answered")

    def start_cell(self, index: int) -> None:
        """New rank actors for the cell, killing the old ones; reported at once (Ray queues
        calls to them until they are up, and the heal's first call waits for that)."""
        if self.driver_down:
            return
        incarnation = self.cells[index].create()
        if self.observer is not None:
            self.observer.cell_started(index, incarnation, "rank actors created")

    def engine_exited(self, engine_id: str, incarnation: int, how: str) -> None:
        if self.observer is not None:
            self.observer.engine_exited(engine_id, incarnation, how)

    # -- impairments (slow cells and links, router delays and failures, muted heartbeats) --

    def impair(self, what: str, factor: float, seconds: float) -> None:
        self.impairments.impair(what, factor, seconds, self.rt.now())

    def end_impairments(self) -> None:
        self.impairments.end_all(self.rt.now())

    def impaired(self, what: str) -> bool:
        return self.impairments.impaired(what, self.rt.now())

    def slowdown(self, what: str) -> float:
        return self.impairments.slowdown(what, self.rt.now())


def buffer_size_for(model_bytes: int, sim_buckets: int) -> int:
    """A bucket size that splits the real model into as many buckets as the scenario's
    simulated model (so "after bucket 2" exists in both worlds)."""
    return max(1, math.ceil(model_bytes / max(1, sim_buckets)))


__all__ = ["RayCluster", "buffer_size_for"]
