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

from typing import Any

from miles_core.errors import ConfigError
from miles_core.events import DriverRestarted, History, RunEnded
from miles_core.kinds import FaultKind, FaultPoint, RunStatus
from miles_core.loop import Orchestrator, RunReport
from miles_core.loop.adopt import DRIVER_RESTART_SECONDS, EngineView, adopt
from miles_core.saves import SaveState
from miles_core.scenario import Scenario
from miles_core.scenario.schedule import orchestrator_for
from miles_core.segments import committed_versions
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


class SimDriverRestarts:
    """Runs a scenario's driver; when it dies, records it and has a new one adopt the world."""

    def __init__(
        self,
        scenario: Scenario,
        rt: SimRuntime,
        history: History,
        cluster: SimCluster,
        control: Orchestrator,
    ) -> None:
        self.scenario, self.rt, self.history, self.cluster = scenario, rt, history, cluster
        self.control: Orchestrator | None = control
        self.held: SaveState | None = None
        self._lost: str | None = None
        self._signal = rt.signal()
        self._dead = False
        cluster.on_driver_lost = self._on_lost
        cluster.driver_hold = self._hold

    def _hold(self, state: SaveState) -> None:
        self.held = state

    def _on_lost(self, point: FaultPoint | None) -> None:
        """The driver dies now; nothing else does (a run that ended has no driver to lose)."""
        control = self.control
        if control is None or control.report is not None or self._dead:
            return
        reason = "restart_driver" + (f" at {point.value}" if point is not None else "")
        control.killed(reason)
        self._dead = True
        self.cluster.observer = None  # the processes' news goes to the next driver
        self.history.append(DriverRestarted(t=self.rt.now(), reason=reason))
        self._lost = reason
        self._signal.set()

    async def run(self) -> RunReport:
        """Run drivers until one ends the run; its report, with the committed versions."""
        while True:
            assert self.control is not None
            task = self.rt.spawn(self.control.run(), "controller")
            await self.rt.wait_any([task, self._signal])
            if self._lost is None:
                report = await task
                report.versions = committed_versions(self.history)
                return report
            await self._restart(task)

    async def _restart(self, task: Any) -> None:
        """Stop what is left of the dead driver; a new one adopts the live processes."""
        reason, self._lost, self._signal = self._lost, None, self.rt.signal()
        assert self.control is not None and reason is not None
        self.control.stop(reason)
        task.cancel(reason)
        self.control = None
        await self.rt.sleep(DRIVER_RESTART_SECONDS)
        adoption = await adopt(_Host(self.cluster, self.held))
        self.cluster.resumed = True  # its attach reports the processes restarted before it
        self.control = orchestrator_for(
            self.scenario, self.rt, self.cluster, self.history, None, resume=adoption
        )
        self._dead = False

    # -- how the run ends, whoever is running ---------------------------------------------

    def end(self, status: RunStatus, reason: str) -> RunReport:
        if self.control is not None and not self._dead:
            return self.control.end(status, reason)
        self.history.append(
            RunEnded(t=self.rt.now(), status=status, reason=reason, outstanding_prompts=())
        )
        return RunReport(status, reason, 0, committed_versions(self.history))

    def end_with(self, error: BaseException, where: str) -> RunReport:
        if self.control is not None and not self._dead:
            return self.control.end_with(error, where)
        return self.end(RunStatus.CRASHED, f"{type(error).__name__}: {error} ({where})")

    def record_waits(self, reason: str) -> None:
        if self.control is not None and not self._dead:
            self.control.record_waits(reason)


__all__ = ["DRIVER_RESTART_SECONDS", "SimDriverRestarts", "restarts_driver"]
