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

from typing import Any

from backends.common.world.adopted import (
    RayDriverHost,
    fresh_transport,
    held_state,
    hold_sink,
    roll_back,
)
from backends.common.world.cluster import RayCluster
from backends.common.world.runtime import AsyncioRuntime
from miles_core.events import DriverRestarted, History, RunEnded
from miles_core.kinds import FaultKind, FaultPoint, RunStatus
from miles_core.loop import LoopConfig, Orchestrator, RunReport
from miles_core.loop.adopt import DRIVER_RESTART_SECONDS, adopt
from miles_core.scenario import Scenario
from miles_core.scenario.schedule import orchestrator_for
from miles_core.segments import committed_versions


def restarts_driver(scenario: Scenario) -> bool:
    """Whether a real run of ``scenario`` may lose its driver (it needs RayDriverRestarts)."""
    return any(f.kind is FaultKind.RESTART_DRIVER for f in scenario.faults)


class RayDriverRestarts:
    """Runs a scenario's loop; when it dies, records it and has a new loop adopt the world."""

    def __init__(
        self,
        scenario: Scenario,
        loop: LoopConfig,
        history: History,
        cluster: RayCluster,
        control: Orchestrator,
    ) -> None:
        self.scenario, self.loop, self.history, self.cluster = scenario, loop, history, cluster
        assert isinstance(cluster.rt, AsyncioRuntime)
        self.rt: AsyncioRuntime = cluster.rt
        self.control: Orchestrator | None = control
        self._lost: str | None = None
        self._signal = self.rt.signal()
        self._dead = False
        cluster.on_driver_lost = self._on_lost
        cluster.driver_hold = hold_sink(cluster)

    def _on_lost(self, point: FaultPoint | None) -> None:
        """The loop dies now; nothing else does (a run that ended has no driver to lose)."""
        control = self.control
        if control is None or control.report is not None or self._dead:
            return
        reason = "restart_driver" + (f" at {point.value}" if point is not None else "")
        control.killed(reason)
        self._dead = True
        self.cluster.driver_down = True  # what the dead loop still calls goes nowhere
        self.cluster.observer = None  # the processes' news goes to the next driver
        self.history.append(DriverRestarted(t=self.rt.now(), reason=reason))
        self._lost = reason
        self._signal.set()

    async def run(self) -> RunReport:
        """Run loops until one ends the run; its report, with the committed versions."""
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
        """Stop what is left of the dead loop; a new one adopts the live processes."""
        reason, self._lost, self._signal = self._lost, None, self.rt.signal()
        assert self.control is not None and reason is not None
        self.control.stop(reason)
        task.cancel(reason)
        self.control = None
        await self.rt.sleep(DRIVER_RESTART_SECONDS)
        self.cluster.driver_down = False  # the new driver's process is up
        await fresh_transport(self.cluster)
        held = await held_state(self.cluster)
        if held is not None:  # miles' load_state: the trainer as at its last publish
            await roll_back(self.cluster, held)
        adoption = await adopt(await RayDriverHost.found(self.cluster, held))
        self.cluster.resumed = True  # its attach reports the processes restarted before it
        self.control = orchestrator_for(
            self.scenario, self.rt, self.cluster, self.history, None, self.loop, adoption
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


__all__ = ["RayDriverRestarts", "restarts_driver"]
