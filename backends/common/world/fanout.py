"""What the Ray world's weight transports share: the cluster they see (``TransportCluster``),
the log of what each update moved, and one bucket's calls to the source cell and its
engines made at once with failures named (``Fanout``): a cut link's stall, a slow link,
the arrival of a bucket and its Delivery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.common.sglang import api
from backends.common.wire import participation
from backends.common.world.cell import RayCell
from backends.common.world.engine_slot import RayEngine
from backends.common.world.settings import WorldSettings
from miles_core.backend import (
    CellFailure,
    ComponentFailure,
    Delivery,
    EngineFailure,
    link_cut,
)
from miles_core.kinds import FaultPoint
from miles_core.runtime import Runtime
from miles_core.scenario.schedule import FaultPoints
from miles_core.transfer import Bucket

CUT_POLL_SECONDS = 0.02
"""How often a send on a cut link looks whether the cut ended."""


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


class TransportCluster(Protocol):
    """What a weight transport sees of its cluster (cluster.py's RayCluster)."""

    rt: Runtime
    settings: WorldSettings
    cells: Mapping[int, RayCell]
    engines: Mapping[str, RayEngine]
    faults: FaultPoints
    store: Any
    """The world's TCPStore (participation in each collective is counted there)."""
    store_addr: tuple[str, int]
    transfers: TransferLog

    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...


class Fanout:
    """One bucket's calls to the source cell and its engines, at once, failures named."""

    seconds: float = 0.0
    """The source rank's own seconds on the last bucket (in the collective, or packing)."""

    def __init__(self, cluster: TransportCluster) -> None:
        self.cluster = cluster
        self._checksums: dict[int, str] = {}
        """Update -> the source's checksum of the model it sends, reported with each bucket
        (Delivery.trainer_checksum) for the engines' stamps to be checked against."""

    async def _all(
        self,
        calls: dict[str, Any],
        source: int,
        stalled: Callable[[], ComponentFailure | None] | None = None,
    ) -> list[Any]:
        """Run calls at once and name who failed.

        A dead source cell or engine raises at once (the trainer must not sit in a
        rendezvous timeout before the orchestration hears of it). A live member that says
        the collective failed (``_Collective``) names nobody: a peer vanished, and its own
        call says which. A collective that is still stalled at the group's timeout
        (``stalled`` given) waits for a member that never took part: ``stalled`` reads who
        (participation.py), and that member is named.
        """
        tasks = {asyncio.ensure_future(c): who for who, c in calls.items()}
        pending: set[asyncio.Future[Any]] = set(tasks)
        loop = asyncio.get_running_loop()
        timeout = self.cluster.settings.collective_timeout
        deadline = None if stalled is None else loop.time() + timeout
        try:
            while pending:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                _, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_EXCEPTION
                )
                errors = [t.exception() for t in tasks if t.done() and t.exception()]
                component = [e for e in errors if isinstance(e, CellFailure)] + [
                    e for e in errors if isinstance(e, EngineFailure)
                ]
                if component:
                    raise component[0]
                if pending and deadline is not None and loop.time() >= deadline:
                    assert stalled is not None
                    failure, deadline = stalled(), None
                    if failure is not None:
                        raise failure
            errors = [t.exception() for t in tasks if t.exception()]
            if errors:  # only the collective failed, yet every member answered
                raise CellFailure(source, f"collective failed: {errors[0]}")
            return [t.result() for t in tasks]
        finally:
            for t in pending:
                t.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _absent(
        self, groups: Mapping[str, tuple[tuple[str, ...], int]], source: int, what: str, key: str
    ) -> ComponentFailure | None:
        """The first member of ``groups`` (name -> its engines in rank order, rank r being
        engines[r - 1], and the number of the collective in that group) that never entered
        it: the source is rank 0."""
        timeout = self.cluster.settings.collective_timeout
        why = f"took no part in {what}: the group waited {timeout:g}s for it"
        for name, (engines, number) in groups.items():
            ranks = range(len(engines) + 1)
            for rank in participation.absent(self.cluster.store, name, ranks, number, key):
                return (
                    CellFailure(source, why) if rank == 0 else EngineFailure(engines[rank - 1], why)
                )
        return None

    async def _checked(self, update_id: int, cell: RayCell) -> None:
        """The trainer's checksum of what this update sends, for the engines' stamps."""
        if update_id not in self._checksums:
            self._checksums[update_id] = (await cell.call("checksum"))[0]

    async def _delivered(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        t: float,
        group_seconds: float | None = None,
    ) -> Delivery:
        await self._slow_link(t)
        return self._arrived(update_id, source_cell, bucket, engines, t, group_seconds)

    async def _cut(self, source: int, bucket: Bucket) -> None:
        """The link to the engines is cut (a partition): nothing moves until the cut ends (or
        liveness mode's heal ends it), and a collective that waited the group's whole timeout
        fails as a whole, its source raising (torch's broadcast does). Loopback cannot be
        cut: the wait stands in for it, at the send, in every transport."""
        cluster = self.cluster
        if not cluster.impaired("partition"):
            return
        loop = asyncio.get_running_loop()
        timeout = cluster.settings.collective_timeout
        deadline = loop.time() + timeout
        while cluster.impaired("partition"):
            if loop.time() >= deadline:
                raise link_cut(source, bucket.index, timeout)
            await asyncio.sleep(min(CUT_POLL_SECONDS, max(0.0, deadline - loop.time())))

    async def _slow_link(self, t: float) -> None:
        cluster = self.cluster
        if cluster.impaired("link"):  # a slow link: the same bytes, this many times longer
            await asyncio.sleep((cluster.rt.now() - t) * (cluster.slowdown("link") - 1))

    def _arrived(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        t: float,
        group_seconds: float | None = None,
    ) -> Delivery:
        """The bucket's Delivery; ``group_seconds``: how long making its group took, where
        this send made it (the bucket's own ``t`` begins after)."""
        cluster = self.cluster
        wall = cluster.rt.now() - t
        cluster.transfers.add(update_id, bucket.payload_bytes, self.seconds, wall)
        # the bucket arrived; a fault here strikes before the updater's next step
        cluster.faults.fire(FaultPoint.AFTER_BUCKET, cell=source_cell, bucket=bucket.index)
        checksum = self._checksums.get(update_id)
        return Delivery(tuple(sorted(engines)), wall, checksum, group_seconds)


def version_field(version: int | None) -> Any:
    """miles' ``weight_version=str(weight_version)`` (left out when there is none)."""
    return api.OMIT if version is None else str(version)
