"""The simulated weight transport: a bucket costs what sim/world/update_cost.py says, over
the link the placement gives it, and a collective completes for nobody until every member
takes part. The Ray world's twin is backends/common/world/transport.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from miles_core.backend import Delivery, link_cut
from miles_core.kinds import FaultPoint
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.schedule import FaultPoints
from miles_core.transfer import LORA_UNIT_PREFIX, Bucket
from sim.world.cells import SimCell
from sim.world.contents import sent
from sim.world.engine import SimEngine
from sim.world.runtime import SimRuntime, SimSignal
from sim.world.ticket_locks import SimTicketLocks
from sim.world.update_cost import Route, bucket_seconds, group_make_seconds, update_fixed_seconds


class TransportCluster(Protocol):
    """What the transport sees of its cluster (cluster.py's SimCluster)."""

    rt: SimRuntime
    world: WorldShape
    timing: TimeModel
    faults: FaultPoints
    cells: Sequence[SimCell]
    engines: Mapping[str, SimEngine]
    cell_nodes: Sequence[set[str]]
    """The nodes each cell's GPUs sit on (the placement's)."""
    engine_nodes: Mapping[str, set[str]]
    collective_timeout: float
    reads_weights: bool
    healed: SimSignal
    """Set when liveness mode's heal ends every impairment (a cut link's stall ends)."""

    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...
    def impairment_left(self, what: str) -> float: ...


class SimTransport:
    def __init__(self, cluster: TransportCluster) -> None:
        self.cluster = cluster
        self._groups: dict[int, tuple[int, dict[str, int]]] = {}
        """Each cell's weight-update group: the cell process that made it, and the engine
        processes it was made for."""
        self.locks = SimTicketLocks(cluster.rt, cluster.cells, cluster.world.gpus_per_cell)
        """The cells' weight-update ticket locks (today's profile: sim/world/ticket_locks.py)."""
        self._made: dict[int, set[tuple[str, ...]]] = {}
        """Each cell's collective groups made since it connected, by their engines: a
        broadcast's one of every engine it sends to, p2p's a pair group per engine (as the
        Ray world makes them)."""

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """The cell's new group, in place of its old one; made as its first bucket goes (a
        dead or hung member fails that collective, as a real group's first use does), so
        it takes no time of its own here: that bucket's source pays for the making."""
        self._groups[source_cell] = (self.cluster.cells[source_cell].incarnation, dict(engines))
        self._made[source_cell] = set()

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
        group = tuple(sorted(engines))
        making = self._making(source_cell, [group])
        busy = seconds + setup + sum(making.values())
        stalled = await self.locks.send(
            source_cell,
            bucket.index,
            self.cluster.collective_timeout,
            lambda: self._send(source_cell, bucket, engines, busy),
        )
        self._made[source_cell].update(making)
        checksum = self._loaded(bucket, engines, version)
        return Delivery(
            tuple(engines), stalled + seconds, checksum, group_seconds=_charged(making, group)
        )

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
        making = self._making(source_cell, [(e,) for e in engines])  # in turn, as the Ray world
        busy = max(links.values()) + setup + sum(making.values())
        stalled = await self.locks.send(
            source_cell,
            bucket.index,
            self.cluster.collective_timeout,
            lambda: self._send(source_cell, bucket, engines, busy),
        )
        self._made[source_cell].update(making)
        checksum = self._loaded(bucket, engines, version)
        return tuple(
            Delivery((e,), stalled + seconds, checksum, group_seconds=_charged(making, (e,)))
            for e, seconds in links.items()
        )

    def _loaded(
        self, bucket: Bucket, engines: Mapping[str, int], version: int | None
    ) -> str | None:
        """Where the cluster reads weights (contents.py): each engine loads the arrived
        bucket, and the id of what the trainer sent is the delivery's checksum. None for a
        LoRA adapter's bucket (its base weights do not change) or a send with no version."""
        cluster = self.cluster
        if not cluster.reads_weights or version is None:
            return None
        if any(unit.startswith(LORA_UNIT_PREFIX) for unit in bucket.units):
            return None
        for engine in engines:
            cluster.engines[engine].load_bucket(bucket.index, version)
        return sent(version)

    def _making(
        self, source_cell: int, groups: list[tuple[str, ...]]
    ) -> dict[tuple[str, ...], float]:
        """The groups of ``groups`` this send makes (none made since the cell connected), each
        with what its making costs (sim/world/update_cost.py ``group_make_seconds``)."""
        made = self._made.setdefault(source_cell, set())
        timing = self.cluster.timing
        return {g: group_make_seconds(timing, len(g)) for g in groups if g not in made}

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


def _charged(making: Mapping[tuple[str, ...], float], group: tuple[str, ...]) -> float | None:
    """What making ``group`` was charged, as its Delivery reports it: None where this send
    did not make it, or its making is not charged (a time model without the term records
    no UpdateGroupMade, so the histories made before it existed are as they were)."""
    return making.get(group) or None


def _check_receivers(cluster: TransportCluster, engines: Mapping[str, int]) -> None:
    """Raise as the first receiver whose named process is gone would (``SimEngine.check``),
    with the test inlined for the live ones: a bucket goes to every engine, twice a send."""
    processes = cluster.engines
    for engine, incarnation in engines.items():
        process = processes[engine]
        if process.dead or process.incarnation != incarnation:
            process.check(incarnation)
