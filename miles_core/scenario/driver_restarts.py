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

from miles_core.events import DriverRestarted, History
from miles_core.kinds import FaultPoint
from miles_core.loop import Orchestrator
from miles_core.loop.adopt import DRIVER_RESTART_SECONDS, Adoption
from miles_core.runtime import Runtime
from miles_core.scenario.model import Scenario
from miles_core.scenario.schedule import orchestrator_for
from miles_core.scenario.segmented_run import SegmentedRun


class DriverRestarts(SegmentedRun):
    """Runs a scenario's driver; when it dies, records it and has a new one adopt the world.
    ``cluster`` is the world's: it calls ``on_driver_lost`` when the fault strikes, and its
    ``observer`` and ``resumed`` are set here as a killed job's are."""

    def __init__(
        self, scenario: Scenario, rt: Runtime, history: History, cluster: Any, control: Orchestrator
    ) -> None:
        super().__init__(rt, history, control)
        self.scenario, self.cluster = scenario, cluster
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
        self._cut_now(reason)

    async def _restart(self, task: Any) -> None:
        """Stop what is left of the dead driver; a new one adopts the live processes."""
        reason = self._take_cut()
        assert self.control is not None and reason is not None
        self.control.stop(reason)
        task.cancel(reason)
        self.control = None
        await self.rt.sleep(DRIVER_RESTART_SECONDS)
        adoption = await self.adopted()
        self.cluster.resumed = True  # its attach reports the processes restarted before it
        self.control = self.new_control(adoption)
        self._dead = False


__all__ = ["DriverRestarts"]
