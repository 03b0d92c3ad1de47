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

import dataclasses
import random
from collections.abc import Awaitable, Callable, Mapping

from miles_core.backend import (
    Delivery,
    GenerateRequest,
    GenerateResult,
    RouterFailure,
    WorldObserver,
    link_cut,
)
from miles_core.kinds import FaultPoint
from miles_core.placement import Bundle, LayoutConfig, Placement, compute_layout, place
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.schedule import FaultPoints, NoFaults
from miles_core.transfer import LORA_UNIT_PREFIX, Bucket
from sim.world.cells import Exchange, SimCell
from sim.world.engine import EngineHandle, SimEngine
from sim.world.runtime import SimRuntime, SimTask
from sim.world.saves import SimCheckpoints, SimDisk
from sim.world.update_cost import Route, bucket_seconds, update_fixed_seconds


class SimRouter:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.orphans: dict[tuple[str, int], SimEngine] = {}
        """Servers still listed whose actor is gone (the orphan_engine fault), by process."""

    def generate(
        self, engine: str, incarnation: int, request: GenerateRequest
    ) -> Awaitable[GenerateResult]:
        """The engine's own call when nothing was ever impaired and no orphan is listed (no
        coroutine of the router's around every request); the router's delays, failures and
        choice otherwise."""
        cluster = self.cluster
        if cluster._impairments or self.orphans or cluster.poison_armed:
            return self._impaired(engine, incarnation, request)
        return cluster.engines[engine].generate(incarnation, request)

    def remove_worker(self, engine: str, incarnation: int) -> bool:
        orphan = self.orphans.pop((engine, incarnation), None)
        if orphan is None:
            return False
        orphan.abort_all()
        return True

    def _orphan_for(self, engine: str) -> SimEngine | None:
        """The router's least-requests choice: an orphan with fewer requests in flight than
        the process asked for takes the request (the first such, by process; ties stay)."""
        load = len(self.cluster.engines[engine].jobs)
        for key in sorted(self.orphans):
            if len(self.orphans[key].jobs) < load:
                return self.orphans[key]
        return None

    async def _impaired(
        self, engine: str, incarnation: int, request: GenerateRequest
    ) -> GenerateResult:
        cluster = self.cluster
        if cluster.poison_armed:  # the first request sent since: its prompt is over-long
            cluster.poison_armed = False
            cluster.poisoned.add(request.prompt_id)
        delay = cluster.slowdown("router-delay") - 1.0
        if delay > 0:
            await cluster.rt.sleep(delay)
        if cluster.impaired("router-fail"):
            await cluster.rt.sleep(cluster.timing.router_failure_seconds)
            raise RouterFailure(f"request for group {request.group_id} to {engine} failed")
        orphan = self._orphan_for(engine) if self.orphans else None
        if orphan is not None:
            result = await orphan.generate(orphan.incarnation, request)
            return dataclasses.replace(result, incarnation=orphan.incarnation)
        return await cluster.engines[engine].generate(incarnation, request)


class SimTransport:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self._groups: dict[int, tuple[int, dict[str, int]]] = {}
        """Each cell's weight-update group: the cell process that made it, and the engine
        processes it was made for."""

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """The cell's new group, in place of its old one; made as its first bucket goes (a
        dead or hung member fails that collective, as a real group's first use does), so
        it takes no time of its own here."""
        self._groups[source_cell] = (self.cluster.cells[source_cell].incarnation, dict(engines))

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        """One collective to every engine: as slow as its slowest link."""
        seconds = self._bucket_seconds(source_cell, bucket, engines, p2p=False)
        setup = self._setup_seconds(bucket)
        stalled = await self._send(source_cell, bucket, engines, seconds + setup)
        return Delivery(tuple(engines), stalled + seconds)

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """p2p: each engine on its own link, all at once; the source is busy until the
        slowest arrives (its own bandwidth is shared between the links only under
        many-source p2p, sim/world/update_cost.py)."""
        together = len(engines)
        links = {
            e: self._bucket_seconds(source_cell, bucket, {e: i}, p2p=True, together=together)
            for e, i in engines.items()
        }
        setup = self._setup_seconds(bucket)
        stalled = await self._send(source_cell, bucket, engines, max(links.values()) + setup)
        return tuple(Delivery((e,), stalled + seconds) for e, seconds in links.items())

    def _setup_seconds(self, bucket: Bucket) -> float:
        """The update's fixed cost, which its source pays before the first bucket goes (the
        bucket's own send, which the delivery reports, does not include it)."""
        return update_fixed_seconds(self.cluster.timing) if bucket.index == 0 else 0.0

    def _bucket_seconds(
        self,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        p2p: bool,
        together: int = 1,
    ) -> float:
        """The bucket's cost by sim/world/update_cost.py; ``together``: engines sent to at once."""
        cluster = self.cluster
        local = (
            all(cluster.engine_nodes[e] <= cluster.cell_nodes[source_cell] for e in engines)
            and len(cluster.cell_nodes[source_cell]) == 1
        )
        world = cluster.world
        route = Route(
            local, world.gpus_per_cell, max(together, len(engines)), world.gpus_per_engine
        )
        # a slow link is slower in every way: its latency and its bandwidth
        slowdown = cluster.slowdown("link")
        return bucket_seconds(cluster.timing, bucket.nbytes, route, p2p, bucket.index, slowdown)

    async def _send(
        self,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        seconds: float,
    ) -> float:
        """A collective completes for nobody until every member takes part: a dead member
        fails it at once (its connections close), a hung one (alive, answering nothing)
        stalls it until the group's timeout, and is then the one named. The seconds it
        stalled first while the link was cut (a partition)."""
        cluster = self.cluster
        source = cluster.cells[source_cell]
        self._check_group(source_cell, engines)
        _check_receivers(cluster, engines)  # one not in the update's group fails the collective
        stalled = await self._cut(source_cell, bucket) if cluster.impaired("partition") else 0.0
        absent = [e for e in engines if cluster.engines[e].hung]
        if absent:
            seconds = cluster.collective_timeout
        if await source.work(seconds):
            raise source.failure(f"killed sending bucket {bucket.index}")
        _check_receivers(cluster, engines)  # one that died meanwhile fails the collective too
        if absent:
            raise cluster.engines[absent[0]].failure(
                f"took no part in the broadcast of bucket {bucket.index}: the group waited "
                f"{seconds:g}s for it"
            )
        for unit in bucket.units:  # a LoRA adapter is loaded as its one unit arrives
            if unit.startswith(LORA_UNIT_PREFIX):
                for engine in engines:
                    cluster.engines[engine].load_adapter(unit.removeprefix(LORA_UNIT_PREFIX))
        # the bucket arrived; a fault here strikes before the updater's next step
        cluster.faults.fire(FaultPoint.AFTER_BUCKET, cell=source_cell, bucket=bucket.index)
        return stalled

    async def _cut(self, source_cell: int, bucket: Bucket) -> float:
        """The link to the engines is cut: no member hears from another until the cut ends
        (or liveness mode's heal ends it), and a collective that waited the group's whole
        timeout fails as a whole, its source raising (torch's broadcast does). The seconds
        it waited."""
        cluster = self.cluster
        source = cluster.cells[source_cell]
        began, timeout = cluster.rt.now(), cluster.collective_timeout
        waited = source.work(min(cluster.impairment_left("partition"), timeout), cluster.healed)
        if await waited == 1:
            raise source.failure(f"killed sending bucket {bucket.index}")
        if cluster.impaired("partition"):
            raise link_cut(source_cell, bucket.index, timeout)
        return cluster.rt.now() - began

    def _check_group(self, source_cell: int, engines: Mapping[str, int]) -> None:
        """A bucket travels over the group its cell connected: a process the group was not
        made for takes no part, and the collective fails naming it."""
        made_by, members = self._groups.get(source_cell, (-1, {}))
        if made_by != self.cluster.cells[source_cell].incarnation:
            members = {}  # the group died with the processes that made it
        for engine, incarnation in engines.items():
            if members.get(engine) != incarnation:
                raise self.cluster.engines[engine].failure(
                    f"process {incarnation} is not in cell {source_cell}'s weight-update group"
                )


def _check_receivers(cluster: SimCluster, engines: Mapping[str, int]) -> None:
    """Raise as the first receiver whose named process is gone would (``SimEngine.check``),
    with the test inlined for the live ones: a bucket goes to every engine, twice a send."""
    processes = cluster.engines
    for engine, incarnation in engines.items():
        process = processes[engine]
        if process.dead or process.incarnation != incarnation:
            process.check(incarnation)


def _place(world: WorldShape, rng: random.Random, style: str = "ipv4") -> Placement:
    """The cluster's GPUs as Ray would hand them out, placed by miles_core.placement."""
    layout = compute_layout(
        LayoutConfig(
            actor_num_nodes=1,
            actor_num_gpus_per_node=world.num_cells * world.gpus_per_cell,
            rollout_num_gpus=world.num_engines * world.gpus_per_engine,
            rollout_num_gpus_per_engine=world.gpus_per_engine,
            indep_dp=True,
            gpus_per_cell=world.gpus_per_cell,
        )
    )
    per_node = world.gpus_per_node
    nodes = node_names(-(-layout.total_gpus // per_node), style, rng)
    bundles = [
        Bundle(index=i, node=nodes[i // per_node], gpu_id=i % per_node)
        for i in range(layout.total_gpus)
    ]
    rng.shuffle(bundles)  # Ray's bundle order carries no meaning; the ordering restores one
    return place(layout, bundles)


def node_names(count: int, style: str, rng: random.Random) -> list[str]:
    """``count`` distinct node names drawn in ``style`` (TimeModel.node_addresses), random so
    that their text order and their numeric order differ (10.2.x.x before 10.10.x.x)."""
    names: list[str] = []
    while len(names) < count:
        way = style if style != "mixed" else ("ipv4", "ipv6", "hostnames")[len(names) % 3]
        if way == "ipv4":
            name = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        elif way == "ipv6":
            name = f"fd00::{rng.randrange(1, 2 ** rng.choice([4, 8, 12, 16])):x}"
        else:
            name = f"node-{rng.randrange(1, 1000)}"
        if name not in names:
            names.append(name)
    return names


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
        """How long a weight-update broadcast waits for a member that does not take part
        (--update-weight-collective-timeout) before it fails for all."""
        self.faults: FaultPoints = faults if faults is not None else NoFaults()
        self.num_cells = world.num_cells
        self.gpus_per_cell = world.gpus_per_cell
        self.engine_ids = world.engine_ids
        self.units = world.units()
        self.lora_params = world.lora_params()
        self.placement = _place(world, rt.rng("placement"), self.timing.node_addresses)
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
        self._impairments: dict[str, tuple[float, float]] = {}
        """what -> (factor, until): slow cells and links, router delays and failures."""
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
        self.resumed = False
        """The processes of a killed job's restart: what befell them before its controller
        attached is reported when it does (sim.world.job.report_processes)."""

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
            from sim.world.job import report_processes

            report_processes(self, observer)

    def exchange(self, step: int, attempt: int, members: tuple[int, ...]) -> Exchange:
        key = (step, attempt)
        if key not in self._exchanges:
            self._exchanges[key] = Exchange(self, members)
        return self._exchanges[key]

    # -- what happens to the world (faults act through these) ---------------------------

    def impair(self, what: str, factor: float, seconds: float) -> None:
        """Slow ``what`` by ``factor`` for ``seconds`` (router-delay: add factor - 1 seconds)."""
        self._impairments[what] = (factor, self.rt.now() + seconds)

    def slowdown(self, what: str) -> float:
        factor, until = self._impairments.get(what, (1.0, 0.0))
        return factor if self.rt.now() < until else 1.0

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
        _, until = self._impairments.get(what, (1.0, 0.0))
        return max(0.0, until - self.rt.now())

    def impaired(self, what: str) -> bool:
        """Whether ``what`` is impaired now (asked by every heartbeat: nothing to look up
        when nothing was ever impaired)."""
        impairments = self._impairments
        return bool(impairments) and self.rt.env._now < impairments.get(what, (1.0, 0.0))[1]

    def heal(self, engines: bool) -> tuple[int, ...]:
        """Liveness mode's heal: every impairment ends now and (``engines``) every engine
        process dead or hung is restarted (one already starting is left to start); the
        dead cells are given back for the fault schedule to start."""
        now = self.rt.now()
        self._impairments = {what: (1.0, now) for what in self._impairments}
        self.healed.set()  # a stall on a cut link ends with the cut
        self.healed = self.rt.signal()
        for engine_id, engine in self.engines.items() if engines else ():
            stuck = engine.dead or engine.hung or engine.unanswered
            if stuck and engine_id not in self._starting:
                self.restart_engine(engine_id)
        return tuple(i for i, cell in enumerate(self.cells) if cell.dead)

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
