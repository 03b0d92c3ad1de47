"""An engine slot of the Ray world: the actor of its current process, and the SGLang client to it.

Calls are addressed to one process (an incarnation): a call meant for a process
that was replaced fails instead of reaching the new one. Every body is built from
sglang/api.py's request types, the ones the contract test holds to SGLang's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, Protocol

import aiohttp
import ray
from ray.exceptions import RayActorError

from backends.common.engine.server import EngineActor
from backends.common.session.ray_session import LOOPBACK, in_bundle
from backends.common.sglang import api
from backends.common.world.settings import WorldSettings
from miles_core.backend import EngineFailure, RequestRefused, SessionAlreadyOpen
from miles_core.kinds import FaultPoint, PauseMode
from miles_core.placement import Placement
from miles_core.scenario.schedule import FaultPoints

ACTOR_DIED = (RayActorError,)


class OrphanKeeper(Protocol):
    """The router, as a slot whose actor is lost hands it the server left running."""

    def keep_orphan(self, engine: str, incarnation: int, actor: Any, url: str) -> None: ...


class SlotCluster(Protocol):
    """What an engine slot sees of its cluster (cluster.py's RayCluster)."""

    settings: WorldSettings
    placement: Placement
    pg: Any
    """The run's placement group (its bundles are the placement's)."""
    faults: FaultPoints
    http: aiohttp.ClientSession
    router: OrphanKeeper
    driver_down: bool
    """A restart_driver's dead loop: what it still calls never leaves it (adopted.py)."""

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None: ...
    def slowdown(self, what: str) -> float: ...
    def engine_exited(self, engine_id: str, incarnation: int, how: str) -> None: ...


class RayEngine:
    """An engine slot: the actor of its current process and the HTTP client to it."""

    def __init__(self, cluster: SlotCluster, engine_id: str, position: int) -> None:
        self.cluster = cluster
        self.id = engine_id
        self.position = position
        self.actor: Any = None
        self.url: str | None = None
        self.incarnation = -1
        self.doomed = False
        self.hung = False
        """This world made its current process hang (the hang_engine fault)."""
        self.unanswered: frozenset[str] = frozenset()
        """Routes its current process leaves unanswered (the hang_call fault)."""
        self.gone = False
        """Ray reported its current process dead."""

    async def start(self, recovery: bool = False) -> int | None:
        """A new process (the old one killed first); its incarnation once its HTTP server
        answers, or None if it died or was replaced while starting (the death reported).
        ``recovery``: the control plane's own restart (the during_recovery fault point)."""
        self.kill()
        self.incarnation += 1
        self.hung = self.gone = False
        self.unanswered = frozenset()
        incarnation = self.incarnation
        bundle = self.cluster.placement.engine_bundles(self.position)[0]
        settings = self.cluster.settings
        stack = settings.stack
        actor = (
            (stack.engine_actor or EngineActor)
            .options(
                num_gpus=self.cluster.placement.layout.engine_actor_gpu_fraction,
                scheduling_strategy=in_bundle(self.cluster.pg, bundle),
            )
            .remote(
                self.id,
                settings.policy,
                settings.engine_token_seconds,
                stack.device,
                settings.collective_timeout,
                settings.flush_refuses_while_queued,
                settings.prefix_cache,
            )
        )
        self.actor = actor
        if recovery:
            self.cluster.faults.fire(FaultPoint.DURING_RECOVERY, engine=self.id)
        delay = self.cluster.slowdown(f"start-{self.id}") - 1.0  # a slow_start fault's window
        try:
            port = await actor.start.remote(delay)
        except ACTOR_DIED:
            self.cluster.engine_exited(self.id, incarnation, "died while starting")
            return None
        if self.incarnation != incarnation:
            return None  # replaced while starting
        self.url = f"http://{LOOPBACK}:{port}"
        await self.request(incarnation, "GET", api.Health.ROUTE)
        self.cluster.spawn(self._watch(actor, incarnation), f"watch-{self.id}.{incarnation}")
        return incarnation

    def hang(self) -> None:
        """The process stops answering and stays alive (the hang_engine fault)."""
        if self.actor is not None:
            self.hung = True
            self.actor.hang.remote()

    async def hang_call(self, route: str) -> None:
        """The process leaves ``route`` unanswered from now on (the hang_call fault)."""
        if self.actor is not None:
            self.unanswered = self.unanswered | {route}
            await self.actor.hang_route.remote(route)

    async def lie(self) -> None:
        """The process answers loads with success and loads nothing (the lying_engine fault)."""
        if self.actor is not None:
            with contextlib.suppress(ACTOR_DIED):
                await self.actor.lie.remote()

    async def arm_delta_fault(self, fault: str) -> None:
        """The process's next /pull_weights does ``fault`` (a disk-delta fault: delta_routes.py)."""
        if self.actor is not None:
            with contextlib.suppress(ACTOR_DIED):
                await self.actor.arm_delta_fault.remote(fault)

    async def die_midway(self, incarnation: int, rid: str) -> None:
        """That process exits halfway through request ``rid`` (the mid-generation kill),
        armed through its actor: no HTTP client can reach the hook."""
        if self.actor is not None and incarnation == self.incarnation:
            with contextlib.suppress(ACTOR_DIED):  # gone already: the request fails anyway
                await self.actor.die_midway.remote(rid)

    async def _watch(self, actor: Any, incarnation: int) -> None:
        """Report the process's death when Ray sees the actor die."""
        try:
            await actor.wait_forever.remote()
        except ACTOR_DIED:
            if incarnation == self.incarnation:
                self.gone = True
            self.cluster.engine_exited(self.id, incarnation, "its actor died")

    def orphan(self) -> None:
        """The actor is lost and its server left running (the orphan_engine fault): the slot
        lets go of its process without killing it, the router keeps its address, and the
        world reports the actor's exit. The local engine's server lives in its actor's
        process, so that actor is kept, out of the slot's reach, until the world closes."""
        if self.actor is None or self.url is None:
            return  # no process serving: nothing to orphan
        incarnation = self.incarnation
        self.cluster.router.keep_orphan(self.id, incarnation, self.actor, self.url)
        self.actor, self.url, self.gone = None, None, True
        self.cluster.engine_exited(self.id, incarnation, "its actor was lost; its server runs on")

    def kill(self) -> None:
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self.actor, self.url = None, None

    def needs_restart(self) -> bool:
        """Dead, killed or hung: what liveness mode's heal restarts."""
        return self.actor is None or self.hung or self.gone or bool(self.unanswered)

    def wait_party(self) -> str:
        """How the wait-for graph names this engine when a task waits on it."""
        state = "hung" if self.hung else "dead" if self.gone or self.actor is None else "alive"
        if self.unanswered and state == "alive":
            state += f", {', '.join(sorted(self.unanswered))} unanswered"
        return f"{self.id} process {self.incarnation} ({state})"

    async def request(
        self,
        incarnation: int,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        refusable: bool = False,
        seconds: float | None = None,
        **headers: str,
    ) -> dict[str, Any]:
        """One HTTP call to that process. An answer >= 400 is an EngineFailure, or with
        ``refusable`` a 400 is RequestRefused (the engine is fine, it said no). ``seconds``:
        how long to wait for the answer (default: the world's HTTP timeout); a collective's
        part waits longer than the collective may stall, so that a member's own timeout is
        never mistaken for the stall's cause."""
        if self.cluster.driver_down:  # sent by a dead driver's loop: it never leaves it
            await asyncio.Event().wait()
        if incarnation != self.incarnation:
            raise EngineFailure(self.id, f"process {incarnation} was replaced")
        if self.url is None:
            raise EngineFailure(self.id, "not running")
        timeout = None if seconds is None else aiohttp.ClientTimeout(total=seconds)
        try:
            async with self.cluster.http.request(
                method, self.url + path, json=body, headers=headers, timeout=timeout
            ) as reply:
                if reply.status >= 400:
                    text = (await reply.text())[:200]
                    if refusable and reply.status == 400:
                        raise RequestRefused(self.id, f"{path}: {text}")
                    raise EngineFailure(self.id, f"{path} answered {reply.status}: {text}")
                if reply.content_type != "application/json":
                    return {}
                return await reply.json()
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as error:
            raise EngineFailure(self.id, f"{path}: {type(error).__name__}") from None


class EngineHandle:
    """The RolloutEngine protocol for one process of an engine, in SGLang's API (sglang/api.py)."""

    def __init__(self, engine: RayEngine, incarnation: int) -> None:
        self.engine = engine
        self.id = engine.id
        self.incarnation = incarnation

    async def send(self, request: api.SGLangRequest, refusable: bool = False) -> dict[str, Any]:
        payload = api.body(request) if request.METHOD == "POST" else None
        return await self.engine.request(
            self.incarnation, request.METHOD, request.ROUTE, payload, refusable
        )

    async def pause(self, mode: PauseMode, abort_below: int | None = None) -> None:
        below = api.OMIT if abort_below is None else abort_below  # sglang #34185's draft field
        await self.send(api.PauseGenerationReqInput(mode.value, below))

    async def resume(self) -> None:
        await self.send(api.ContinueGenerationReqInput())

    async def flush_cache(self) -> None:
        await self.send(api.FlushCache(), refusable=True)

    async def begin_update(self) -> None:
        try:
            await self.send(api.BeginWeightUpdateReqInput(), refusable=True)
        except RequestRefused as refusal:
            if "already open" in refusal.reason:  # SGLang's words for a second begin
                raise SessionAlreadyOpen(refusal.component, refusal.reason) from None
            raise EngineFailure(self.id, refusal.reason) from None

    async def end_update(self) -> None:
        await self.send(api.EndWeightUpdateReqInput())

    async def stamp(self, version: int, abort_all_requests: bool = True) -> str | None:
        """Leaving ``abort_all_requests`` out of the body takes SGLang's default (true), so
        it is sent only when false, as miles sends it (a client that omits it is the bug).
        Answers the checksum of the weights the engine now serves (the local engine's
        /testbed/weights_checksum; SGLang serves no /testbed/ route: None)."""
        flag = api.OMIT if abort_all_requests else False
        await self.send(api.UpdateWeightVersionReqInput(str(version), flag))
        if self.engine.cluster.settings.stack.engine == "sglang":
            return None  # see backends/gpu/sglang_engine.py
        reply = await self.engine.request(self.incarnation, "GET", "/testbed/weights_checksum")
        return str(reply["checksum"])

    async def health(self) -> None:
        await self.send(api.HealthGenerate())

    async def unload_adapter(self, adapter: str) -> None:
        raise EngineFailure(self.id, "the real backends train full parameters, not LoRA")
