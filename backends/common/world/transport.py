"""Buckets over collective groups in the Ray world: gloo, NCCL on CUDA, or shared memory
(requests go through the router, router.py; tensor handles: handle_transport.py).

Translation only: a bucket goes to the engine processes the orchestration names; a
process that was replaced meanwhile is an EngineFailure, a dead peer in a collective
names who died. A transport sees its cluster through ``TransportCluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from typing import Any

from backends.common.sglang import api
from backends.common.wire import participation
from backends.common.wire.cell_lock import LockWait
from backends.common.world.cell import RayCell
from backends.common.world.fanout import Fanout, TransportCluster, version_field
from backends.common.world.settings import HTTP_TIMEOUT
from miles_core.backend import (
    CellFailure,
    ComponentFailure,
    Delivery,
    EngineFailure,
)
from miles_core.transfer import Bucket

DESTROY_SECONDS = 10.0
"""How long each side of an old group's destruction is waited for, in the background."""


class _Collective(Exception):
    """A live member says the collective failed (SGLang's "Failed to receive weights", "Failed
    to initialize custom process group"): it names no one, since every member of a stalled
    or broken group fails alike."""


COLLECTIVE_FAILED = ("Failed to receive weights", "Failed to initialize custom process group")


async def _member(call: Awaitable[Any]) -> Any:
    """An engine's part in a collective: its report of the collective's failure is a
    _Collective, its own failure (dead, unreachable) stays an EngineFailure."""
    try:
        return await call
    except EngineFailure as failure:
        if any(words in failure.reason for words in COLLECTIVE_FAILED):
            raise _Collective(f"{failure.component}: {failure.reason}") from None
        raise


class CollectiveTransport(Fanout):
    """Buckets from the source cell's rank to engines over its groups (gloo, or NCCL on CUDA:
    the stack's collective backend).

    SGLang's sequence: /init_weights_update_group on every engine while the
    trainer joins as rank 0, then per bucket a broadcast from the trainer while
    each engine serves /update_weights_from_distributed. Broadcast mode makes
    one group of all engines; p2p one group per engine. A cell's groups are for the
    engine processes it connected (``connect``, where the control plane decides, as
    miles' ``connect_rollout_engines``), made at its first bucket and kept for its next
    updates; its next connect destroys them (/destroy_weights_update_group, in the
    background). A process the cell did not connect is in none of its groups.
    Each bucket's body is miles': the update's ``weight_version``, and no ``load_format``
    (one broadcast per tensor) unless the stack asks for packed buckets
    (``--flattened-bucket``; see sglang/api.py, UpdateWeightsFromDistributedReqInput).
    """

    def __init__(self, cluster: TransportCluster) -> None:
        super().__init__(cluster)
        self._connected: dict[int, dict[str, int]] = {}
        """Each cell's connection: the engine processes its groups are for."""
        self._groups: dict[tuple[int, tuple[tuple[str, int], ...]], str] = {}
        """(cell, engine processes) -> the group made for them, kept across updates."""
        self._destroying: set[asyncio.Task[Any]] = set()
        self._members: dict[str, tuple[str, ...]] = {}
        """Each group's engines in rank order (rank r is the r-th, from 1)."""
        self._sent: dict[str, int] = {}
        """Broadcasts started on each group (the next one's number)."""

    @property
    def _patience(self) -> float:
        """How long an engine's part in a collective is waited for: past the collective's
        timeout (when the stall is judged), so that no member's HTTP call ends first."""
        return self.cluster.settings.collective_timeout + HTTP_TIMEOUT.total

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """The cell's groups are for these processes from now on; its old ones are destroyed
        in the background (a dead or hung member must not hold the update)."""
        self._connected[source_cell] = dict(engines)
        for key in [k for k in self._groups if k[0] == source_cell]:
            name = self._groups.pop(key)
            self._members.pop(name, None)
            self._sent.pop(name, None)
            task = asyncio.ensure_future(self._destroy(source_cell, dict(key[1]), name))
            self._destroying.add(task)
            task.add_done_callback(self._destroying.discard)

    async def _destroy(self, source_cell: int, engines: Mapping[str, int], name: str) -> None:
        """Best effort, as miles' ``disconnect_rollout_engines_from_distributed``: a member
        that is gone took its side of the group with it."""
        destroy = api.DestroyWeightsUpdateGroupReqInput(group_name=name)
        calls: list[Awaitable[Any]] = [
            self.cluster.engines[e].request(i, destroy.METHOD, destroy.ROUTE, api.body(destroy))
            for e, i in engines.items()
        ]
        calls.append(self.cluster.cells[source_cell].call("destroy_update_group", name))
        for call in calls:
            with contextlib.suppress(ComponentFailure, asyncio.TimeoutError):
                await asyncio.wait_for(call, DESTROY_SECONDS)

    async def _group(
        self, update_id: int, cell: RayCell, engines: Mapping[str, int]
    ) -> tuple[str, float | None]:
        """The cell's group for these processes, and how long making it took where this call
        made it (None: made before). The making is timed alone: every member's join, at
        once, from the first call to the last answer (the trainer's checksum after it is
        not part of it)."""
        connected = self._connected.get(cell.index, {})
        for engine, incarnation in sorted(engines.items()):
            if connected.get(engine) != incarnation:
                why = f"process {incarnation} is not in cell {cell.index}'s weight-update group"
                raise EngineFailure(engine, why)
        key = (cell.index, tuple(sorted(engines.items())))
        if key in self._groups:
            await self._checked(update_id, cell)
            return self._groups[key], None
        name = f"cell{cell.index}-update{update_id}-" + "+".join(
            f"{e}.{i}" for e, i in sorted(engines.items())
        )
        world_size = len(engines) + 1
        host, port = self.cluster.store_addr
        backend = self.cluster.settings.stack.collective_backend
        timeout = self.cluster.settings.collective_timeout
        calls: dict[str, Any] = {
            "cell": cell.call("init_update_group", (host, port), name, world_size, backend, timeout)
        }
        for rank, (engine, incarnation) in enumerate(sorted(engines.items()), start=1):
            join = api.InitWeightsUpdateGroupReqInput(host, port, rank, world_size, name, backend)
            calls[engine] = _member(
                self.cluster.engines[engine].request(
                    incarnation, join.METHOD, join.ROUTE, api.body(join), seconds=self._patience
                )
            )
        members = tuple(sorted(engines))
        joining = {name: (members, 0)}
        began = self.cluster.rt.now()
        await self._all(
            calls,
            cell.index,
            lambda: self._absent(joining, cell.index, f"joining {name}", participation.JOINED),
        )
        made = self.cluster.rt.now() - began
        self._members[name] = members
        await self._checked(update_id, cell)
        self._groups[key] = name
        return name, made

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        cluster = self.cluster
        cell = cluster.cells[source_cell]
        name, made = await self._group(update_id, cell, engines)
        started = cluster.rt.now()
        await self._cut(source_cell, bucket)
        await self._send(cell, bucket, dict.fromkeys(engines, name), engines, version)
        return await self._delivered(update_id, source_cell, bucket, engines, started, made)

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """p2p in one call: the bucket to each engine over its own pair group, all at once.

        The groups, bodies and checks of one ``send_bucket`` per engine, but the trainer
        starts its broadcast on every pair group before it waits for any
        (``TrainerRank.send_bucket`` with several names): sent in turn, each engine waits
        for the one before it (backends/bench: ``in-turn`` against ``backend``). For an
        update loop that hands over a bucket's p2p transfers together; one Delivery per
        engine, as that many ``send_bucket`` calls return."""
        cluster = self.cluster
        cell = cluster.cells[source_cell]
        names, made = {}, {}
        for engine, incarnation in sorted(engines.items()):
            names[engine], made[engine] = await self._group(update_id, cell, {engine: incarnation})
        started = cluster.rt.now()
        await self._cut(source_cell, bucket)
        await self._send(cell, bucket, names, engines, version)
        await self._slow_link(started)
        return tuple(
            self._arrived(update_id, source_cell, bucket, {e: i}, started, made[e])
            for e, i in sorted(engines.items())
        )

    async def _send(
        self,
        cell: RayCell,
        bucket: Bucket,
        names: Mapping[str, str],
        engines: Mapping[str, int],
        version: int | None,
    ) -> None:
        """The trainer's broadcast on each distinct group, each engine's receive on its own,
        at once; ``names``: engine -> its group."""
        cluster = self.cluster
        packed = cluster.settings.stack.packed
        groups = list(dict.fromkeys(names[e] for e in sorted(engines)))
        numbers = {g: (self._members[g], self._sent.get(g, 0)) for g in groups}
        for g in groups:
            self._sent[g] = numbers[g][1] + 1
        group: str | list[str] = groups[0] if len(groups) == 1 else groups
        calls: dict[str, Any] = {"cell": cell.call("send_bucket", group, bucket, packed)}
        for engine, incarnation in sorted(engines.items()):
            send = _bucket_request(bucket, names[engine], version, packed)
            request = cluster.engines[engine].request
            body = api.body(send)
            calls[engine] = _member(
                request(incarnation, send.METHOD, send.ROUTE, body, seconds=self._patience)
            )
        what = f"the broadcast of bucket {bucket.index}"
        absent = lambda: self._absent(numbers, cell.index, what, participation.KEY)  # noqa: E731
        if not cell.ticket_lock:
            self.seconds = (await self._all(calls, cell.index, absent))[0][0]  # the cell's rank 0
            return
        stalled = lambda: _in_the_lock(cell, absent())  # noqa: E731
        waited = LockWait(lambda: cell.lock_state()[0])  # names the lock to the wait-for graph
        self.seconds = (await waited.wait(self._all(calls, cell.index, stalled)))[0][0]


def _in_the_lock(cell: RayCell, failure: ComponentFailure | None) -> ComponentFailure | None:
    """A cell named as the member that took no part in a broadcast, with the lock its rank 0
    waits in where it waits (the simulator's reason, sim/world/ticket_locks.py)."""
    if not isinstance(failure, CellFailure):
        return failure
    party, waits = cell.lock_state()
    return cell.failure(f"{failure.reason} (rank 0 waited for {party})") if waits else failure


def _bucket_request(
    bucket: Bucket, group: str, version: int | None, packed: bool
) -> api.UpdateWeightsFromDistributedReqInput:
    spans = bucket.spans
    return api.UpdateWeightsFromDistributedReqInput(
        names=[s.name for s in spans],
        dtypes=[s.dtype for s in spans],
        shapes=[list(s.shape) for s in spans],
        group_name=group,
        weight_version=version_field(version),
        load_format="flattened_bucket" if packed else api.OMIT,
    )
