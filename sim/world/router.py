"""The simulated router: a request goes to the engine process the orchestration chose,
unless the router's own troubles say otherwise (a delay, a failure, an orphan it still
lists with fewer requests in flight, an over-long prompt). The Ray world's twin is
backends/common/world/router.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Mapping
from typing import Protocol

from miles_core.backend import GenerateRequest, GenerateResult, RouterFailure
from miles_core.impairments import Impairments
from miles_core.scenario import TimeModel
from sim.world.engine import SimEngine
from sim.world.runtime import SimRuntime


class RouterCluster(Protocol):
    """What the router sees of its cluster (cluster.py's SimCluster)."""

    rt: SimRuntime
    timing: TimeModel
    engines: Mapping[str, SimEngine]
    impairments: Impairments
    poison_armed: bool
    """The next prompt asked for is over-long (the poison_prompt fault has fired)."""
    poisoned: set[int]

    def slowdown(self, what: str) -> float: ...
    def impaired(self, what: str) -> bool: ...


class SimRouter:
    def __init__(self, cluster: RouterCluster) -> None:
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
        if cluster.impairments or self.orphans or cluster.poison_armed:
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
