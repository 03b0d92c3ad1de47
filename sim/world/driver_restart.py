"""A simulated driver hot restart (restart_driver): the driver dies alone, a new one adopts.

A run with a restart_driver fault is driven by a SimDriverRestarts instead of its
controller alone (as a kill_job's run is by sim.world.job.SimJob). When the fault strikes,
the driver (the controller: its buffer, ledger view, requests' bookkeeping) dies and
records nothing more; its tasks stop; every other process (cells, engines, router, orphans)
stays up as it was, the world reports the death (DriverRestarted). After
``DRIVER_RESTART_SECONDS`` a new driver adopts the live processes (miles_core.loop.adopt:
the state the trainer held at its last published version, the engines as the world reports
them, their open window closed and requests aborted) and goes on, one history of segments
(miles_core.segments). miles: miles/utils/hot_restart.py (14aca060) and the take-over line
at index id 68796729424.
"""

from __future__ import annotations

from miles_core.errors import ConfigError
from miles_core.events import History
from miles_core.kinds import FaultKind
from miles_core.loop import Orchestrator
from miles_core.loop.adopt import DRIVER_RESTART_SECONDS, Adoption, EngineView, adopt
from miles_core.saves import SaveState
from miles_core.scenario import Scenario
from miles_core.scenario.driver_restarts import DriverRestarts
from sim.world.cluster import SimCluster
from sim.world.engine import EngineHandle
from sim.world.runtime import SimRuntime


def restarts_driver(scenario: Scenario) -> bool:
    """Whether a run of ``scenario`` may lose its driver (it needs a SimDriverRestarts)."""
    kinds = {f.kind for f in scenario.faults}
    if FaultKind.RESTART_DRIVER in kinds and FaultKind.KILL_JOB in kinds:
        raise ConfigError(
            "faults",
            "hold a restart_driver beside a kill_job: the simulator runs one or the other",
            "keep one of them",
        )
    return FaultKind.RESTART_DRIVER in kinds


class _Host:
    """The live world as a new driver finds it (miles_core.loop.adopt.DriverHost)."""

    def __init__(self, cluster: SimCluster, held: SaveState | None) -> None:
        self.cluster, self.held = cluster, held

    def held_state(self) -> SaveState | None:
        return self.held

    def engine_views(self) -> tuple[EngineView, ...]:
        return tuple(
            EngineView(e.id, e.incarnation, not e.dead, e.version, e.paused, e.session_open)
            for e in self.cluster.engines.values()
        )

    async def abort_all(self) -> int:
        aborted = 0
        for engine in self.cluster.engines.values():
            if not engine.dead and not engine.hung:
                aborted += len(engine.jobs)
                engine.abort_all()
        return aborted

    def engine(self, engine_id: str, incarnation: int) -> EngineHandle:
        return self.cluster.engine(engine_id, incarnation)


class SimDriverRestarts(DriverRestarts):
    """miles_core.scenario.driver_restarts in the simulator: the trainer's held state is
    handed here as each version is published; a new driver finds the engines as they are."""

    def __init__(
        self,
        scenario: Scenario,
        rt: SimRuntime,
        history: History,
        cluster: SimCluster,
        control: Orchestrator,
    ) -> None:
        super().__init__(scenario, rt, history, cluster, control)
        self.held: SaveState | None = None
        cluster.driver_hold = self._hold

    def _hold(self, state: SaveState) -> None:
        self.held = state

    async def adopted(self) -> Adoption:
        return await adopt(_Host(self.cluster, self.held), self.rt)


__all__ = ["DRIVER_RESTART_SECONDS", "SimDriverRestarts", "restarts_driver"]
