"""A real driver hot restart (restart_driver) on Ray: the loop dies alone, a new one adopts.

miles restarts its orchestration script while the trainers and engines stay up
(miles/utils/hot_restart.py at 14aca060, PRs #2963, #3011, #3014, #3018, #3061, #3068,
#3069). In one Ray session here the driver is the Python process that runs the
miles_core loop, and the Ray actors (trainer ranks, engines with their HTTP servers) are
processes of their own. A restart here is the loop torn down and built again in the same
process: the process is not re-executed; what is lost is the loop's state (its buffer,
ledger view, requests' bookkeeping, every task it ran), as a new script would have lost
it. The RayCluster object (the handles to the actors, the router's address list) is the
world's side, kept as the actors are. The order of events mirrors the simulator's
(sim/world/driver_restart.py ``SimDriverRestarts``): the dead loop records nothing more,
the world records DriverRestarted, and after ``DRIVER_RESTART_SECONDS`` of wall time a new
loop reads the state the trainer ranks hold (adopted.py), rolls them back to it, adopts
the engines (miles_core.loop.adopt) and goes on.
"""

from __future__ import annotations

from backends.common.world.adopted import (
    RayDriverHost,
    fresh_transport,
    held_state,
    hold_sink,
    roll_back,
)
from backends.common.world.cluster import RayCluster
from backends.common.world.runtime import AsyncioRuntime
from miles_core.events import History
from miles_core.kinds import FaultKind
from miles_core.loop import LoopConfig, Orchestrator
from miles_core.loop.adopt import Adoption, adopt
from miles_core.scenario import Scenario
from miles_core.scenario.driver_restarts import DriverRestarts
from miles_core.scenario.schedule import orchestrator_for


def restarts_driver(scenario: Scenario) -> bool:
    """Whether a real run of ``scenario`` may lose its driver (it needs RayDriverRestarts)."""
    return any(f.kind is FaultKind.RESTART_DRIVER for f in scenario.faults)


class RayDriverRestarts(DriverRestarts):
    """miles_core.scenario.driver_restarts on Ray: the trainer ranks hold their state at each
    publish; while the driver is down the dead loop's calls go nowhere; a new loop reads the
    held state back, rolls the ranks back to it and adopts the engines over HTTP."""

    def __init__(
        self,
        scenario: Scenario,
        loop: LoopConfig,
        history: History,
        cluster: RayCluster,
        control: Orchestrator,
    ) -> None:
        assert isinstance(cluster.rt, AsyncioRuntime)
        super().__init__(scenario, cluster.rt, history, cluster, control)
        self.loop, self.ray = loop, cluster
        cluster.driver_hold = hold_sink(cluster)

    def driver_lost(self) -> None:
        self.ray.driver_down = True  # what the dead loop still calls goes nowhere

    async def adopted(self) -> Adoption:
        cluster = self.ray
        cluster.driver_down = False  # the new driver's process is up
        await fresh_transport(cluster)
        held = await held_state(cluster)
        if held is not None:  # miles' load_state: the trainer as at its last publish
            await roll_back(cluster, held)
        return await adopt(await RayDriverHost.found(cluster, held), self.rt)

    def new_control(self, adoption: Adoption) -> Orchestrator:
        return orchestrator_for(
            self.scenario, self.rt, self.ray, self.history, None, self.loop, adoption
        )


__all__ = ["RayDriverRestarts", "restarts_driver"]
