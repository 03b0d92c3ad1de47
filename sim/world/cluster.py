"""A simulated cluster: trainer cells, engines, a router and a weight transport in virtual time.

It implements miles_core.backend's protocols with time models and nothing
else: it does what it is asked, takes as long as the models say, and fails
when a fault says so. It never retries, never picks an engine, never numbers
a version; the orchestration decides all of that. Like a real cluster it
reports new processes (WorldObserver): a restarted engine, a started cell.

Time models (miles_core.scenario.TimeModel):

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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from miles_core.backend import WorldObserver
from miles_core.impairments import Impairments
from miles_core.kinds import FaultPoint
from miles_core.saves import SaveState
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.schedule import FaultPoints, NoFaults
from sim.world.cells import Exchange, SimCell
from sim.world.engine import EngineHandle, SimEngine
from sim.world.placement import place_world
from sim.world.router import SimRouter
from sim.world.runtime import SimRuntime, SimTask
from sim.world.saves import SimCheckpoints, SimDisk
from sim.world.transport import SimTransport


class SimCluster:
    """The whole simulated world for one run."""

    def __init__(
        self,
        rt: SimRuntime,
        world: WorldShape,
        timing: TimeModel | None = None,
        faults: FaultPoints | None = None,
        collective_timeout: float = 1800.0,
        disk: SimDisk | None = None,
    ) -> None:
        self.rt = rt
        self.world = world
        self.timing = timing or TimeModel()
        self.collective_timeout = collective_timeout
        self.reads_weights = False
        """Engines keep content ids and answer stamps with them (sim/world/contents.py):
        on under the ``today`` miles profile (sim/run.py), off under aug2026, whose
        histories held no WeightsChecked in the simulator."""
        """How long a weight-update broadcast waits for a member that does not take part
        (--update-weight-collective-timeout) before it fails for all."""
        self.faults: FaultPoints = faults if faults is not None else NoFaults()
        self.num_cells = world.num_cells
        self.gpus_per_cell = world.gpus_per_cell
        self.engine_ids = world.engine_ids
        self.units = world.units()
        self.lora_params = world.lora_params()
        self.placement = place_world(world, rt.rng("placement"), self.timing.node_addresses)
        self.cell_nodes = [
            {b.node for b in self.placement.cell_bundles(i)} for i in range(world.num_cells)
        ]
        self.engine_nodes = {
            e: {b.node for b in self.placement.engine_bundles(i)}
            for i, e in enumerate(self.engine_ids)
        }
        self.cells = [SimCell(self, i) for i in range(world.num_cells)]
        self.engines = {e: SimEngine(self, e) for e in self.engine_ids}
        self.router = SimRouter(self)
        self.poison_armed = False
        """The next prompt asked for is over-long (the poison_prompt fault has fired)."""
        self.poisoned: set[int] = set()
        """Prompts longer than the engines' context: every engine refuses them."""
        self.transport = SimTransport(self)
        self.observer: WorldObserver | None = None
        self._exchanges: dict[tuple[int, int], Exchange] = {}
        self.impairments = Impairments()
        """Slow cells and links, router delays and failures, muted heartbeats, cut links."""
        self.healed = rt.signal()
        """Set when liveness mode's heal ends every impairment (then replaced)."""
        self._replies: dict[str, tuple[float, Awaitable[None]]] = {}
        """what -> (when asked, the reply's wait) shared by every call of it at that instant."""
        self._handles: dict[tuple[str, int], EngineHandle] = {}
        self.spans: dict[tuple[int | None, ...], tuple[int | None, ...]] = {}
        """Each distinct list of a response's span versions, as one shared tuple: a run keeps
        a sample event for each of its requests, and the collector walks every tuple left
        alive when the run hands it back (a large run's end took seconds more)."""
        self._starting: dict[str, SimTask] = {}
        """Engines whose new process is starting (engine_start_seconds), by the start's task."""
        self._cell_starting: dict[int, SimTask] = {}
        """Cells whose new processes are starting (cell_start_seconds), by the start's task."""
        self.checkpoints = SimCheckpoints(self, disk if disk is not None else SimDisk())
        """The job's saves (--save-interval), on a disk a killed job's restart reads."""
        self.on_job_killed: Callable[[FaultPoint | None], None] | None = None
        """What the job does when a kill_job strikes (sim.world.job.SimJob); set where one may."""
        self.on_driver_lost: Callable[[FaultPoint | None], None] | None = None
        """What the job does when a restart_driver strikes (sim.world.driver_restart)."""
        self.driver_hold: Callable[[SaveState], None] | None = None
        """Where the trainer keeps the state a new driver adopts (miles_core.loop.adopt
        StateHold); None: the loop hands none over (a run no restart_driver strikes)."""
        self.resumed = False
        """The processes of a killed job's restart: what befell them before its controller
        attached is reported when it does (``_report_restarted``)."""

    # -- the Cluster protocol ---------------------------------------------------------

    def cell(self, index: int) -> SimCell:
        return self.cells[index]

    def engine(self, engine_id: str, incarnation: int) -> EngineHandle:
        """The handle of that process, made once (an update asks for every engine's six
        times): a handle holds nothing but the process it addresses."""
        key = (engine_id, incarnation)
        handle = self._handles.get(key)
        if handle is None:
            handle = self._handles[key] = EngineHandle(self.engines[engine_id], incarnation)
        return handle

    def attach(self, observer: WorldObserver) -> None:
        self.observer = observer
        if self.resumed:
            self._report_restarted(observer)

    def _report_restarted(self, observer: WorldObserver) -> None:
        """A restarted job's controller attaches: what befell its processes since they
        started (faults that struck while it was starting) is reported now, as a real
        controller finds its actors: a first process of an engine gone, the process that
        replaced it; a cell's new processes (a dead cell is found by its calls, as ever)."""
        how = "while the job restarted"
        for index, cell in enumerate(self.cells):
            if cell.incarnation and not cell.dead:
                observer.cell_started(index, cell.incarnation, f"processes started {how}")
        for engine_id, engine in self.engines.items():
            if engine.dead or engine.incarnation:
                observer.engine_exited(engine_id, 0, f"died {how}")
            if engine.incarnation and not engine.dead:
                observer.engine_started(engine_id, engine.incarnation, f"process restarted {how}")

    def end_processes(self) -> None:
        """Every process of the cluster dies now (its job was killed), reported to nobody
        (its controller is dead), and nothing it still runs fires a fault."""
        self.observer = None
        self.faults = NoFaults()
        for index, cell in enumerate(self.cells):
            cell.kill()
            self._fail_exchanges(index)
        for engine in self.engines.values():
            engine.kill()
        for orphan in self.router.orphans.values():
            orphan.kill()

    def restarted_from(self, old: SimCluster) -> None:
        """This cluster holds a killed job's new processes: the network's and the data set's
        troubles (impairment windows, over-long prompts) go on as they were in ``old``."""
        self.impairments = old.impairments.copy()
        self.poisoned, self.poison_armed = set(old.poisoned), old.poison_armed
        self.reads_weights = old.reads_weights
        self.transport.locks.on = old.transport.locks.on
        self.resumed = True

    def exchange(self, step: int, attempt: int, members: tuple[int, ...]) -> Exchange:
        key = (step, attempt)
        if key not in self._exchanges:
            self._exchanges[key] = Exchange(self, members)
        return self._exchanges[key]

    # -- what happens to the world (faults act through these) ---------------------------

    def impair(self, what: str, factor: float, seconds: float) -> None:
        """Slow ``what`` by ``factor`` for ``seconds`` (router-delay: add factor - 1 seconds)."""
        self.impairments.impair(what, factor, seconds, self.rt.now())

    def slowdown(self, what: str) -> float:
        return self.impairments.slowdown(what, self.rt.now())

    def heartbeat_reply(self) -> Awaitable[None]:
        """The wait for a healthy cell's heartbeat reply: one wait for every cell pinged at
        this instant (a round pings all at once, and all healthy ones answer after the same
        reply time), so a 64-cell round costs one event, not 64. The order in which the
        cells' replies are taken within a round changes nothing: the round goes on once
        all have answered or its timeout ran out."""
        return self._shared_reply("heartbeat", self.timing.heartbeat_reply_seconds)

    def control_reply(self) -> Awaitable[None]:
        """The round trip of an engine control call, shared as heartbeat_reply is: an update
        calls its 256 engines at one instant, and one event answers them all."""
        return self._shared_reply("control", self.timing.control_reply_seconds)

    def _shared_reply(self, what: str, seconds: float) -> Awaitable[None]:
        now = self.rt.env._now  # compared only: the clock as it is (every heartbeat asks)
        asked, reply = self._replies.get(what, (-1.0, None))
        if asked != now or reply is None:
            reply = self.rt.sleep(seconds)
            self._replies[what] = (now, reply)
        return reply

    def impairment_left(self, what: str) -> float:
        """Seconds until ``what``'s impairment ends (0 when it is not impaired)."""
        return self.impairments.left(what, self.rt.now())

    def impaired(self, what: str) -> bool:
        """Whether ``what`` is impaired now (asked by every heartbeat: nothing to look up
        when nothing was ever impaired)."""
        return self.impairments.impaired(what, self.rt.env._now)

    def heal(self, engines: bool) -> tuple[int, ...]:
        """Liveness mode's heal: every impairment ends now and (``engines``) every engine
        process dead or hung is restarted (one already starting is left to start); the
        dead cells are given back for the fault schedule to start."""
        now = self.rt.now()
        self.impairments.end_all(now)
        self.healed.set()  # a stall on a cut link ends with the cut
        self.healed = self.rt.signal()
        for engine_id, engine in self.engines.items() if engines else ():
            stuck = engine.dead or engine.hung or engine.unanswered
            if stuck and engine_id not in self._starting:
                self.restart_engine(engine_id)
        return tuple(i for i, cell in enumerate(self.cells) if cell.dead)

    def restart_driver(self, point: FaultPoint | None) -> None:
        """The driver alone dies, every other process up (sim.world.driver_restart)."""
        if self.on_driver_lost is None:
            raise RuntimeError("restart_driver struck a cluster no driver restarter runs")
        self.on_driver_lost(point)

    def kill_job(self, point: FaultPoint | None) -> None:
        """Every process of the job dies at once, the controller's too (sim.world.job.SimJob)."""
        if self.on_job_killed is None:
            raise RuntimeError("kill_job struck a cluster that no job runs (sim.world.job.SimJob)")
        self.on_job_killed(point)

    def fail_rank(self, index: int) -> None:
        """A rank of the cell raises in the step about to exchange, its process alive (the
        simulated cell is one unit: which rank does not matter here)."""
        self.cells[index].raising = True

    def kill_cell(self, index: int) -> None:
        """Kill at once: in virtual time a named point is now."""
        self.cells[index].kill()
        self._fail_exchanges(index)

    def _fail_exchanges(self, index: int) -> None:
        """The cell's old processes will never arrive at the exchanges they were part of."""
        for exchange in self._exchanges.values():
            if index in exchange.members and not exchange.done.is_set():
                exchange.fail()

    def start_cell(self, index: int) -> None:
        """New processes for a cell (the scenario's start_cell, or the control plane's
        resume): what is left of the old ones dies now, and the new ones answer the world's
        cell_start_seconds later (at once with 0), when the world reports them. A start
        while another is under way replaces it."""
        self._fail_exchanges(index)
        pending = self._cell_starting.pop(index, None)
        if pending is not None:
            pending.cancel("a later start replaced this one")
        if not self.timing.cell_start_seconds:
            self._start_cell(index)
            return
        self.cells[index].kill()
        self._cell_starting[index] = self.rt.spawn(
            self._start_cell_after(index, self.timing.cell_start_seconds), f"start-cell-{index}"
        )

    async def _start_cell_after(self, index: int, seconds: float) -> None:
        await self.rt.sleep(seconds)
        del self._cell_starting[index]
        self._fail_exchanges(index)
        self._start_cell(index)

    def _start_cell(self, index: int) -> None:
        incarnation = self.cells[index].start()
        if self.observer is not None:
            self.observer.cell_started(index, incarnation, "processes started")

    def kill_engine(self, engine_id: str) -> None:
        """The process dies; like Ray with a dead actor, the world sees it at once."""
        engine = self.engines[engine_id]
        if not engine.dead:
            engine.kill()
            if self.observer is not None:
                self.observer.engine_exited(engine_id, engine.incarnation, "process killed")

    def stop_engine(self, engine_id: str) -> None:
        """The control plane stops the process (today's FT controller's suspend): it dies and
        the world reports it, as a kill; a start under way is left to the resume."""
        self.kill_engine(engine_id)

    def hang_engine(self, engine_id: str) -> None:
        """The process stays alive and stops answering (nothing to report: nothing exited)."""
        self.engines[engine_id].hung = True

    def hang_call(self, engine_id: str, call: str) -> None:
        """The process leaves every ``call`` unanswered from now on (answering the rest)."""
        engine = self.engines[engine_id]
        engine.unanswered = engine.unanswered | {call}

    def poison_prompt(self) -> None:
        """The next prompt asked for is longer than the engines' context."""
        self.poison_armed = True

    def lying_engine(self, engine_id: str) -> None:
        """The process answers loads from now on and loads nothing (its content id stays)."""
        self.engines[engine_id].lying = True

    def orphan_engine(self, engine_id: str) -> None:
        """The engine's actor is lost, its server left running: the process goes on serving
        (its requests, its weights) as an orphan in the router, and the slot holds no
        process until a restart; the world reports the actor's exit."""
        engine = self.engines[engine_id]
        if engine.dead:
            return
        self.router.orphans[(engine_id, engine.incarnation)] = engine
        slot = SimEngine(self, engine_id)
        slot.incarnation, slot.dead = engine.incarnation, True
        self.engines[engine_id] = slot
        if self.observer is not None:
            self.observer.engine_exited(
                engine_id, engine.incarnation, "its actor was lost; its server runs on"
            )

    def restart_engine(self, engine_id: str) -> None:
        """Replace the engine's process (a fault's restart, or the control plane's recovery):
        the old one dies now and the world reports its exit; the new one comes up after the
        world's engine_start_seconds (at once with 0), plus what a slow_start fault adds to a
        start begun in its window, and the world reports it, or its death if it died while
        starting. A restart while a new process starts replaces that start (its process is
        killed before it answered, as Ray kills a pending actor)."""
        self.kill_engine(engine_id)
        seconds = self.timing.engine_start_seconds + self.slowdown(f"start-{engine_id}") - 1.0
        pending = self._starting.pop(engine_id, None)
        if pending is not None:  # even by a start at once (a slow start begun earlier)
            pending.cancel("a later restart replaced this start")
        if not seconds:
            self._start_engine(engine_id)
            return
        self._starting[engine_id] = self.rt.spawn(
            self._start_after(engine_id, seconds), f"start-{engine_id}"
        )

    async def _start_after(self, engine_id: str, seconds: float) -> None:
        await self.rt.sleep(seconds)
        del self._starting[engine_id]
        self._start_engine(engine_id)

    def _start_engine(self, engine_id: str) -> None:
        engine = self.engines[engine_id]
        incarnation = engine.start()
        self.faults.fire(FaultPoint.DURING_RECOVERY, engine=engine_id)
        if self.observer is None:
            return
        if engine.dead:
            self.observer.engine_exited(engine_id, incarnation, "died while starting")
        else:
            self.observer.engine_started(engine_id, incarnation, "process restarted")
