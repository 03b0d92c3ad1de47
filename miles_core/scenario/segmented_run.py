"""A run driven by one controller after another: what a killed job (sim/world/job.py) and a
driver's hot restart (driver_restarts.py) share. Each controller runs until it ends the run
or its life is cut (``_cut``, with the reason, then ``_stop_signal``); a subclass's
``_restart`` puts the next one in place. Between two controllers (``_dead``) the run's end
is recorded as the world sees it, there being no controller to record it; the history is
one, the segments of every controller joined (miles_core.segments)."""

from __future__ import annotations

from typing import Any

from miles_core.events import History, RunEnded
from miles_core.kinds import RunStatus
from miles_core.loop import Orchestrator, RunReport
from miles_core.runtime import Runtime
from miles_core.segments import committed_versions


class SegmentedRun:
    """Runs controllers in turn until one ends the run."""

    def __init__(self, rt: Runtime, history: History, control: Orchestrator) -> None:
        self.rt, self.history = rt, history
        self.control: Orchestrator | None = control
        self._cut: str | None = None
        """Why the running controller's life was cut, until ``_restart`` takes it."""
        self._stop_signal = rt.signal()
        self._dead = False
        """The controller died and was not replaced yet."""

    def _cut_now(self, reason: str) -> None:
        """The controller's life is cut: ``run`` stops waiting for it and restarts."""
        self._cut = reason
        self._stop_signal.set()

    def _take_cut(self) -> str | None:
        """The reason of the cut, cleared, with a new signal for the next controller's."""
        reason, self._cut, self._stop_signal = self._cut, None, self.rt.signal()
        return reason

    async def _restart(self, task: Any) -> None:
        """Stop what is left of the dead controller (``task``) and put the next in place."""
        raise NotImplementedError

    async def run(self) -> RunReport:
        """Run controllers until one ends the run; its report, with the committed versions."""
        while True:
            assert self.control is not None
            task = self.rt.spawn(self.control.run(), "controller")
            await self.rt.wait_any([task, self._stop_signal])
            if self._cut is None:
                report = await task
                report.versions = committed_versions(self.history)
                return report
            await self._restart(task)

    # -- how the run ends, whoever is running ---------------------------------------------

    def end(self, status: RunStatus, reason: str) -> RunReport:
        """End the run: through the live controller, or, between two, as the world records
        it (no controller is there to)."""
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


__all__ = ["SegmentedRun"]
