"""The Ray world's router: each generate request to the engine process the orchestration
chose (or, as miles' router does, to an orphan with fewer requests in flight), miles' body
built from sglang/api.py, the reply translated into a GenerateResult.

It sees its cluster through ``RouterCluster``: the engine slots, the task (prompts and
rewards), the fault points and impairments, the HTTP session and the world's tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

import aiohttp
import ray

from backends.common.sglang import api
from backends.common.sglang.generate_body import generate_request
from backends.common.training.policy import CONTEXT_LENGTH, Trajectory
from backends.common.training.task import Task
from backends.common.world.engine_slot import RayEngine
from backends.common.world.settings import WorldSettings
from miles_core.backend import (
    GenerateRequest,
    GenerateResult,
    RequestRefused,
    RouterFailure,
    VersionOutOfSync,
)
from miles_core.kinds import FaultPoint
from miles_core.scenario.schedule import FaultPoints
from miles_core.scenario.seeds import derive_seed


class RouterCluster(Protocol):
    """What the router sees of its cluster (cluster.py's RayCluster)."""

    settings: WorldSettings
    engines: Mapping[str, RayEngine]
    task: Task
    faults: FaultPoints
    http: aiohttp.ClientSession
    rewards: dict[int, tuple[float, ...]]
    """Each group's rewards as the router scored them (the run's per-step lines)."""

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None: ...
    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...


class RayRouter:
    """Routes each call to the engine process the orchestration chose (sglang-router would
    apply its own policy instead; see docs/cpu.md, "The router"), unless a server it still
    lists whose actor is gone (an orphan) has fewer requests in flight: the least-requests
    policy of miles' router (``_use_url``) sends the call there."""

    def __init__(self, cluster: RouterCluster) -> None:
        self.cluster = cluster
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
        self.cluster.spawn(self._abort(entry[1]), f"abort-{engine}")
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
            async with self.cluster.http.post(url + route, json=body) as reply:
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
        cluster = self.cluster
        if self.poison_armed:  # the first request sent since: its prompt is over-long
            self.poison_armed = False
            self.poisoned.add(request.prompt_id)
        if cluster.impaired("router-delay"):
            await asyncio.sleep(cluster.slowdown("router-delay") - 1.0)
        if cluster.impaired("router-fail"):
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
        cluster = self.cluster
        target = cluster.engines[engine]
        rid = f"g{request.group_id}-s{request.sample}"
        url = None if orphan is None else self.orphans[orphan][1]  # kept if it is removed
        if url is None:
            cluster.faults.fire(FaultPoint.MID_GENERATION, engine=engine)
        if target.doomed and url is None:  # the mid-generation kill: ends the process halfway
            target.doomed = False
            await target.die_midway(incarnation, rid)
        prompt = cluster.task.prompt(request.prompt_id)
        if request.prompt_id in self.poisoned:  # padded past the context: SGLang says 400
            prompt = [*prompt[:-1], *[prompt[-2]] * CONTEXT_LENGTH, prompt[-1]]
        seed = (
            derive_seed(cluster.settings.seed, f"sample-{request.group_id}-{request.sample}")
            % 2**31
        )
        generate = generate_request(  # as miles builds it, per --miles-profile
            today=cluster.settings.miles_today,
            rid=rid,
            input_ids=prompt,
            max_new_tokens=cluster.task.max_new_tokens,
            seed=seed,
            kv_namespace=request.kv_namespace,
            start_weight_version=request.start_weight_version,
        )
        assert generate is not None  # only a --rollout-max-context-len clips a request away
        if url is None:
            reply = await target.request(
                incarnation, generate.METHOD, generate.ROUTE, api.body(generate), refusable=True
            )
        else:
            reply = await self._post(url, generate.ROUTE, api.body(generate))
        meta = reply["meta_info"]
        answered = engine if orphan is None else orphan[0]
        version = reported_version(meta["weight_version"], answered)
        aborted = meta["finish_reason"]["type"] == "abort"
        response = tuple(reply["output_ids"])
        score = await cluster.task.score(request.prompt_id, prompt, response)
        cluster.rewards[request.group_id] = (*cluster.rewards.get(request.group_id, ()), score)
        return GenerateResult(
            engine=engine if orphan is None else orphan[0],
            weight_version=version,
            aborted=aborted,
            reward=score,
            payload=Trajectory(tuple(prompt), response, score),
            engine_seconds=meta.get("e2e_latency"),
            versions=_versions(meta.get("weight_versions", ()), answered),
            kept_kv=bool(meta.get("testbed_kept_kv", False)),
            cached_versions=_versions(meta.get("testbed_cached_versions", ()), answered),
            incarnation=None if orphan is None else orphan[1],
        )


MAX_VERSION_DIGITS = 18
"""A weight version is a short decimal (miles sends ``str(version)``, an int64 holds 18
digits): a longer string is no version (Python's int() of 100,000 digits raises past
sys.int_max_str_digits, and a 4,300-digit one costs a quadratic parse)."""

MAX_REPORTED_VERSIONS = 4096
"""Span versions in one answer, at most (one per update a request lived across)."""


def reported_version(reported: object, engine: str) -> int | None:
    """SGLang's weight_version: "default" before any update, then what the stamp set. SGLang's
    /update_weight_version takes any string, so one that is not a short decimal is the engine
    being out of sync (VersionOutOfSync: the control plane re-syncs it), never a crash."""
    if reported == "default":
        return None
    if (
        isinstance(reported, str)
        and 0 < len(reported) <= MAX_VERSION_DIGITS
        and reported.isascii()
        and reported.isdigit()
    ):
        return int(reported)
    raise VersionOutOfSync(
        engine,
        f"reported weight_version {_shown(reported)}, not a version (a decimal of at most "
        f"{MAX_VERSION_DIGITS} digits, or 'default'): set from outside the control plane",
    )


def _shown(value: object) -> str:
    """A reported value as a message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


def _versions(reported: object, engine: str) -> tuple[int | None, ...]:
    """meta_info's list of versions (each span's, or each cached prefix's), each read as
    ``reported_version`` reads one."""
    if not isinstance(reported, list | tuple) or len(reported) > MAX_REPORTED_VERSIONS:
        shown = _shown(reported)
        raise VersionOutOfSync(engine, f"reported weight_versions {shown}, not a list of versions")
    return tuple(reported_version(v, engine) for v in reported)
