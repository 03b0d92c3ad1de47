"""How requests and weights travel in the Ray world: the router and the weight transports.

Translation only: a request goes to the engine process the orchestration
chose, a bucket to the engine processes it names; a process that was replaced
meanwhile is an EngineFailure, a dead peer in a collective names who died.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
import ray

from backends.common.sglang import api
from backends.common.training.policy import CONTEXT_LENGTH, Trajectory
from backends.common.wire import participation
from miles_core.backend import (
    CellFailure,
    ComponentFailure,
    Delivery,
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RequestRefused,
    RouterFailure,
    link_cut,
)
from miles_core.kinds import FaultPoint
from miles_core.scenario.seeds import derive_seed
from miles_core.transfer import Bucket

if TYPE_CHECKING:
    from backends.common.world.cluster import RayCell, RayWorld

CUT_POLL_SECONDS = 0.02
"""How often a send on a cut link looks whether the cut ended."""

DESTROY_SECONDS = 10.0
"""How long each side of an old group's destruction is waited for, in the background."""

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=120)
"""How long the world waits for an engine's answer (a collective's part waits longer)."""


class RayRouter:
    """Routes each call to the engine process the orchestration chose (sglang-router would
    apply its own policy instead; see docs/cpu.md, "The router"), unless a server it still
    lists whose actor is gone (an orphan) has fewer requests in flight: the least-requests
    policy of miles' router (``_use_url``) sends the call there."""

    def __init__(self, world: RayWorld) -> None:
        self.world = world
        self.orphans: dict[tuple[str, int], tuple[Any, str]] = {}
        """(engine, incarnation) -> the actor kept alive for its server, and its address."""
        self._in_flight: dict[tuple[str, int], int] = {}
        """Requests in flight per process, as the router counts them."""
        self.poison_armed = False
        """The next prompt asked for is over-long (the poison_prompt fault has fired)."""
        self.poisoned: set[int] = set()
        """Prompts sent longer than the engines' context (the engines refuse them)."""

    def keep_orphan(self, engine: str, incarnation: int, actor: Any, url: str) -> None:
        self.orphans[(engine, incarnation)] = (actor, url)

    def remove_worker(self, engine: str, incarnation: int) -> bool:
        """Out of the router; its requests aborted by its address (SGLang's /abort_request
        with abort_all), in the background."""
        entry = self.orphans.pop((engine, incarnation), None)
        if entry is None:
            return False
        self.world.spawn(self._abort(entry[1]), f"abort-{engine}")
        return True

    async def _abort(self, url: str) -> None:
        """Best effort: a server that cannot be reached (hung, gone) has nothing to abort
        that the router would still send it."""
        abort = api.AbortReq(abort_all=True)
        with contextlib.suppress(RouterFailure, RequestRefused):
            await self._post(url, abort.ROUTE, api.body(abort))

    async def _post(self, url: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """One call to a server by its address; any failure is the router's."""
        try:
            async with self.world.http.post(url + route, json=body) as reply:
                if reply.status == 400:  # the server refused the request itself
                    raise RequestRefused(url, (await reply.text())[:200])
                if reply.status >= 400:
                    raise RouterFailure(f"{route} answered {reply.status}")
                return await reply.json() if reply.content_type == "application/json" else {}
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
            raise RouterFailure(f"{route}: {type(error).__name__}") from None

    def close(self) -> None:
        """Stop the orphans' actors (no process outlives its run)."""
        for actor, _ in self.orphans.values():
            ray.kill(actor, no_restart=True)
        self.orphans.clear()

    def _orphan_for(self, engine: str, incarnation: int) -> tuple[str, int] | None:
        load = self._in_flight.get((engine, incarnation), 0)
        for key in sorted(self.orphans):
            if self._in_flight.get(key, 0) < load:
                return key
        return None

    async def generate(
        self, engine: str, incarnation: int, request: GenerateRequest
    ) -> GenerateResult:
        world = self.world
        if self.poison_armed:  # the first request sent since: its prompt is over-long
            self.poison_armed = False
            self.poisoned.add(request.prompt_id)
        if world.impaired("router-delay"):
            await asyncio.sleep(world.slowdown("router-delay") - 1.0)
        if world.impaired("router-fail"):
            raise RouterFailure("router failing (injected)")
        orphan = self._orphan_for(engine, incarnation) if self.orphans else None
        key = orphan or (engine, incarnation)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            return await self._generate(engine, incarnation, request, orphan)
        finally:
            self._in_flight[key] -= 1

    async def _generate(
        self,
        engine: str,
        incarnation: int,
        request: GenerateRequest,
        orphan: tuple[str, int] | None,
    ) -> GenerateResult:
        world = self.world
        target = world.engines[engine]
        rid = f"g{request.group_id}-s{request.sample}"
        url = None if orphan is None else self.orphans[orphan][1]  # kept if it is removed
        if url is None:
            world.faults.fire(FaultPoint.MID_GENERATION, engine=engine)
        if target.doomed and url is None:  # the mid-generation kill: ends the process halfway
            target.doomed = False
            await target.die_midway(incarnation, rid)
        prompt = world.task.prompt(request.prompt_id)
        if request.prompt_id in self.poisoned:  # padded past the context: SGLang says 400
            prompt = [*prompt[:-1], *[prompt[-2]] * CONTEXT_LENGTH, prompt[-1]]
        seed = derive_seed(world.seed, f"sample-{request.group_id}-{request.sample}") % 2**31
        generate = api.GenerateReqInput(
            rid=rid,
            input_ids=prompt,
            sampling_params={
                "max_new_tokens": world.task.max_new_tokens,
                "temperature": 1.0,
                "sampling_seed": seed,
            },
        )
        if url is None:
            reply = await target.request(
                incarnation, generate.METHOD, generate.ROUTE, api.body(generate), refusable=True
            )
        else:
            reply = await self._post(url, generate.ROUTE, api.body(generate))
        meta = reply["meta_info"]
        version = _version(meta["weight_version"])
        aborted = meta["finish_reason"]["type"] == "abort"
        response = tuple(reply["output_ids"])
        score = await world.task.score(request.prompt_id, prompt, response)
        world.rewards[request.group_id] = (*world.rewards.get(request.group_id, ()), score)
        return GenerateResult(
            engine=engine if orphan is None else orphan[0],
            weight_version=version,
            aborted=aborted,
            reward=score,
            payload=Trajectory(tuple(prompt), response, score),
            engine_seconds=meta.get("e2e_latency"),
            versions=tuple(_version(v) for v in meta.get("weight_versions", ())),
            kept_kv=bool(meta.get("testbed_kept_kv", False)),
            cached_versions=tuple(_version(v) for v in meta.get("testbed_cached_versions", ())),
            incarnation=None if orphan is None else orphan[1],
        )


def _version(reported: str) -> int | None:
    """SGLang's weight_version: "default" before any update, then what the stamp set."""
    return None if reported == "default" else int(reported)


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


class _Fanout:
    """One bucket's calls to the source cell and its engines, at once, failures named."""

    seconds: float = 0.0
    """The source rank's own seconds on the last bucket (in the collective, or packing)."""

    def __init__(self, world: RayWorld) -> None:
        self.world = world

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
        timeout = self.world.collective_timeout
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
        timeout = self.world.collective_timeout
        why = f"took no part in {what}: the group waited {timeout:g}s for it"
        for name, (engines, number) in groups.items():
            ranks = range(len(engines) + 1)
            for rank in participation.absent(self.world.store, name, ranks, number, key):
                return (
                    CellFailure(source, why) if rank == 0 else EngineFailure(engines[rank - 1], why)
                )
        return None

    async def _checked(self, update_id: int, cell: RayCell) -> None:
        """The trainer's checksum of what this update sends, for the engines' stamps."""
        if update_id not in self.world.trainer_checksums:
            self.world.trainer_checksums[update_id] = (await cell.call("checksum"))[0]
        self.world.current_update = update_id

    async def _delivered(
        self, update_id: int, source_cell: int, bucket: Bucket, engines: Mapping[str, int], t: float
    ) -> Delivery:
        await self._slow_link(t)
        return self._arrived(update_id, source_cell, bucket, engines, t)

    async def _cut(self, source: int, bucket: Bucket) -> None:
        """The link to the engines is cut (a partition): nothing moves until the cut ends (or
        liveness mode's heal ends it), and a collective that waited the group's whole timeout
        fails as a whole, its source raising (torch's broadcast does). Loopback cannot be
        cut: the wait stands in for it, at the send, in every transport."""
        world = self.world
        if not world.impaired("partition"):
            return
        loop = asyncio.get_running_loop()
        timeout = world.collective_timeout
        deadline = loop.time() + timeout
        while world.impaired("partition"):
            if loop.time() >= deadline:
                raise link_cut(source, bucket.index, timeout)
            await asyncio.sleep(min(CUT_POLL_SECONDS, max(0.0, deadline - loop.time())))

    async def _slow_link(self, t: float) -> None:
        world = self.world
        if world.impaired("link"):  # a slow link: the same bytes, this many times longer
            await asyncio.sleep((world.rt.now() - t) * (world.slowdown("link") - 1))

    def _arrived(
        self, update_id: int, source_cell: int, bucket: Bucket, engines: Mapping[str, int], t: float
    ) -> Delivery:
        world = self.world
        wall = world.rt.now() - t
        world.transfers.add(update_id, bucket.payload_bytes, self.seconds, wall)
        # the bucket arrived; a fault here strikes before the updater's next step
        world.faults.fire(FaultPoint.AFTER_BUCKET, cell=source_cell, bucket=bucket.index)
        return Delivery(tuple(sorted(engines)), wall)


class CollectiveTransport(_Fanout):
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
    (``--flattened-bucket``; see sglang_api.UpdateWeightsFromDistributedReqInput).
    """

    def __init__(self, world: RayWorld) -> None:
        super().__init__(world)
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
        return self.world.collective_timeout + HTTP_TIMEOUT.total

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
            self.world.engines[e].request(i, destroy.METHOD, destroy.ROUTE, api.body(destroy))
            for e, i in engines.items()
        ]
        calls.append(self.world.cells[source_cell].call("destroy_update_group", name))
        for call in calls:
            with contextlib.suppress(ComponentFailure, asyncio.TimeoutError):
                await asyncio.wait_for(call, DESTROY_SECONDS)

    async def _group(self, update_id: int, cell: RayCell, engines: Mapping[str, int]) -> str:
        connected = self._connected.get(cell.index, {})
        for engine, incarnation in sorted(engines.items()):
            if connected.get(engine) != incarnation:
                why = f"process {incarnation} is not in cell {cell.index}'s weight-update group"
                raise EngineFailure(engine, why)
        key = (cell.index, tuple(sorted(engines.items())))
        if key in self._groups:
            await self._checked(update_id, cell)
            return self._groups[key]
        name = f"cell{cell.index}-update{update_id}-" + "+".join(
            f"{e}.{i}" for e, i in sorted(engines.items())
        )
        world = len(engines) + 1
        host, port = self.world.store_addr
        backend = self.world.stack.collective_backend
        timeout = self.world.collective_timeout
        calls: dict[str, Any] = {
            "cell": cell.call("init_update_group", (host, port), name, world, backend, timeout)
        }
        for rank, (engine, incarnation) in enumerate(sorted(engines.items()), start=1):
            join = api.InitWeightsUpdateGroupReqInput(host, port, rank, world, name, backend)
            calls[engine] = _member(
                self.world.engines[engine].request(
                    incarnation, join.METHOD, join.ROUTE, api.body(join), seconds=self._patience
                )
            )
        members = tuple(sorted(engines))
        joining = {name: (members, 0)}
        await self._all(
            calls,
            cell.index,
            lambda: self._absent(joining, cell.index, f"joining {name}", participation.JOINED),
        )
        self._members[name] = members
        await self._checked(update_id, cell)
        self._groups[key] = name
        return name

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        world = self.world
        cell = world.cells[source_cell]
        name = await self._group(update_id, cell, engines)
        started = world.rt.now()
        await self._cut(source_cell, bucket)
        await self._send(cell, bucket, dict.fromkeys(engines, name), engines, version)
        return await self._delivered(update_id, source_cell, bucket, engines, started)

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
        world = self.world
        cell = world.cells[source_cell]
        names = {}
        for engine, incarnation in sorted(engines.items()):
            names[engine] = await self._group(update_id, cell, {engine: incarnation})
        started = world.rt.now()
        await self._cut(source_cell, bucket)
        await self._send(cell, bucket, names, engines, version)
        await self._slow_link(started)
        return tuple(
            self._arrived(update_id, source_cell, bucket, {e: i}, started)
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
        world = self.world
        packed = world.stack.packed
        groups = list(dict.fromkeys(names[e] for e in sorted(engines)))
        numbers = {g: (self._members[g], self._sent.get(g, 0)) for g in groups}
        for g in groups:
            self._sent[g] = numbers[g][1] + 1
        group: str | list[str] = groups[0] if len(groups) == 1 else groups
        calls: dict[str, Any] = {"cell": cell.call("send_bucket", group, bucket, packed)}
        for engine, incarnation in sorted(engines.items()):
            send = _bucket_request(bucket, names[engine], version, packed)
            request = world.engines[engine].request
            body = api.body(send)
            calls[engine] = _member(
                request(incarnation, send.METHOD, send.ROUTE, body, seconds=self._patience)
            )
        what = f"the broadcast of bucket {bucket.index}"
        stalled = lambda: self._absent(numbers, cell.index, what, participation.KEY)  # noqa: E731
        self.seconds = (await self._all(calls, cell.index, stalled))[0][0]  # the cell's rank 0


def _version_field(version: int | None) -> Any:
    """miles' ``weight_version=str(weight_version)`` (left out when there is none)."""
    return api.OMIT if version is None else str(version)


def _bucket_request(
    bucket: Bucket, group: str, version: int | None, packed: bool
) -> api.UpdateWeightsFromDistributedReqInput:
    spans = bucket.spans
    return api.UpdateWeightsFromDistributedReqInput(
        names=[s.name for s in spans],
        dtypes=[s.dtype for s in spans],
        shapes=[list(s.shape) for s in spans],
        group_name=group,
        weight_version=_version_field(version),
        load_format="flattened_bucket" if packed else api.OMIT,
    )


class HandleTransport(_Fanout):
    """Buckets by tensor handles to engines on the trainer's own device (SGLang's
    /update_weights_from_tensor, miles' colocated path): the source rank packs each bucket
    into a shared buffer and sends its handle; each engine copies from it. CUDA IPC on a
    GPU; on CPU, a shared-memory file (torch's file_system strategy) stands in for it."""

    async def connect(self, update_id: int, source_cell: int, engines: Mapping[str, int]) -> None:
        """No group: each bucket's handle goes to the processes it names (miles' colocated
        ``connect_rollout_engines`` maps ranks to engines, which this world does per bucket)."""

    async def send_bucket(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> Delivery:
        world = self.world
        cell = world.cells[source_cell]
        await self._checked(update_id, cell)
        started = world.rt.now()
        await self._cut(source_cell, bucket)
        shared = await self._all({"cell": cell.call("share_bucket", update_id, bucket)}, cell.index)
        handle, self.seconds = shared[0][0]  # the cell's rank 0 packed it
        send = api.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[handle], weight_version=_version_field(version)
        )
        calls = {
            engine: world.engines[engine].request(
                incarnation, send.METHOD, send.ROUTE, api.body(send)
            )
            for engine, incarnation in sorted(engines.items())
        }
        await self._all(calls, source_cell)
        return await self._delivered(update_id, source_cell, bucket, engines, started)

    async def send_bucket_each(
        self,
        update_id: int,
        source_cell: int,
        bucket: Bucket,
        engines: Mapping[str, int],
        version: int | None = None,
    ) -> tuple[Delivery, ...]:
        """p2p by handles: the bucket is packed once and its handle sent to every engine at
        once; one Delivery per engine."""
        started = self.world.rt.now()
        await self.send_bucket(update_id, source_cell, bucket, engines, version)
        return tuple(Delivery((e,), self.world.rt.now() - started) for e in sorted(engines))
