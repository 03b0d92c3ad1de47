"""The order of a driver hot restart, the same in every world (restart_driver).

A run that may lose its driver is driven by a ``DriverRestarts`` instead of its controller
alone. When the fault strikes, the driver (the controller: its buffer, ledger view and
requests' bookkeeping) dies and records nothing more; the world's processes stay up and the
world records DriverRestarted. After ``DRIVER_RESTART_SECONDS`` a new driver adopts the live
processes (``adopted``: each world's way to find them, miles_core.loop.adopt) and goes on,
one history of segments (miles_core.segments). miles: miles/utils/hot_restart.py (14aca060).

A world subclasses it with ``adopted`` (and, where the dead driver's calls must be stopped,
``driver_lost``); sim/world/driver_restart.py and backends/common/run/driver_restart.py.
"""

from __future__ import annotations

from typing import Any

from miles_core.events import DriverRestarted, History, RunEnded
from miles_core.kinds import FaultPoint, RunStatus
from miles_core.loop import Orchestrator, RunReport
from miles_core.loop.adopt import DRIVER_RESTART_SECONDS, Adoption
from miles_core.runtime import Runtime
from miles_core.scenario.model import Scenario
from miles_core.scenario.schedule import orchestrator_for
from miles_core.segments import committed_versions


class DriverRestarts:
    """Runs a scenario's driver; when it dies, records it and has a new one adopt the world.
    ``cluster`` is the world's: it calls ``on_driver_lost`` when the fault strikes, and its
    ``observer`` and ``resumed`` are set here as a killed job's are."""

    def __init__(
        self, scenario: Scenario, rt: Runtime, history: History, cluster: Any, control: Orchestrator
    ) -> None:
        self.scenario, self.rt, self.history, self.cluster = scenario, rt, history, cluster
        self.control: Orchestrator | None = control
        self._lost: str | None = None
        self._signal = rt.signal()
        self._dead = False
        cluster.on_driver_lost = self._on_lost

    # -- what a world adds ----------------------------------------------------------------

    def driver_lost(self) -> None:
        """The world's part of the death (the dead driver's calls stopped, where needed)."""

    async def adopted(self) -> Adoption:
        """The world's processes found by a new driver (miles_core.loop.adopt.adopt)."""
        raise NotImplementedError

    def new_control(self, adoption: Adoption) -> Orchestrator:
        """The new driver's controller, resuming from ``adoption``."""
        return orchestrator_for(
            self.scenario, self.rt, self.cluster, self.history, None, resume=adoption
        )

    # -- the restart ----------------------------------------------------------------------

    def _on_lost(self, point: FaultPoint | None) -> None:
        """The driver dies now; nothing else does (a run that ended has no driver to lose)."""
        control = self.control
        if control is None or control.report is not None or self._dead:
            return
        reason = "restart_driver" + (f" at {point.value}" if point is not None else "")
        control.killed(reason)
        self._dead = True
        self.driver_lost()
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
        adoption = await self.adopted()
        self.cluster.resumed = True  # its attach reports the processes restarted before it
        self.control = self.new_control(adoption)
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


__all__ = ["DriverRestarts"]
