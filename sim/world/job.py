"""A simulated job that a kill_job fault kills whole, restarted from its last committed save.

A run with a kill_job fault is driven by a SimJob instead of its controller alone. When the
kill strikes (at a time, or at a point inside some task's call), the world acts at once:
every process of the job dies (cells, engines, orphans, the router's requests), the dead
controller records nothing more, and the world reports the death (JobKilled). Then, as a job
scheduler would, the job starts again: new processes (a new cluster, placed anew, on the
same disk, under the same seed tree: the runtime's streams go on), and after
``job_restart_seconds`` plus the time to read the save back, a new controller resumed from
the newest committed save (miles_core.saves.choose_save; a fresh start when none). The
history is one: the segments of every controller, joined (miles_core.segments).
Faults keep their schedule: those that fired stay fired, the rest act on the new processes.
"""

from __future__ import annotations

from typing import Any

from miles_core import saves
from miles_core.events import History, JobKilled
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop import Orchestrator
from miles_core.saves import Resume
from miles_core.scenario import Scenario
from miles_core.scenario.schedule import FaultSchedule, orchestrator_for
from miles_core.scenario.segmented_run import SegmentedRun
from sim.world.cluster import SimCluster
from sim.world.runtime import SimRuntime
from sim.world.saves import save_seconds


def kills_jobs(scenario: Scenario) -> bool:
    """Whether a run of ``scenario`` may be killed whole (it needs a SimJob)."""
    return any(f.kind is FaultKind.KILL_JOB for f in scenario.faults)


class SimJob(SegmentedRun):
    """Runs a scenario's controller; on a kill, records it and starts the job again."""

    def __init__(
        self,
        scenario: Scenario,
        rt: SimRuntime,
        history: History,
        schedule: FaultSchedule,
        actions: Any,
        cluster: SimCluster,
        control: Orchestrator,
    ) -> None:
        super().__init__(rt, history, control)
        self.scenario, self.schedule, self.actions = scenario, schedule, actions
        self.cluster = cluster
        cluster.on_job_killed = self._on_kill

    def _on_kill(self, point: FaultPoint | None) -> None:
        """The kill strikes: the job's processes die now, the world reports it (a run that
        has ended has nothing left to kill)."""
        control = self.control
        if control is not None and control.report is not None and not self._dead:
            return
        reason = "kill_job" + (f" at {point.value}" if point is not None else "")
        if control is not None and not self._dead:
            control.killed(reason)
        self._dead = True
        self.cluster.end_processes()
        self.history.append(JobKilled(t=self.rt.now(), reason=reason))
        self._cut_now(reason)

    async def _restart(self, task: Any) -> None:
        """Stop what is left of the dead controller, then start the job again (again, if a
        kill strikes while it starts) from its newest committed save."""
        while self._cut is not None:
            reason = self._take_cut()
            if self.control is not None:
                self.control.stop(reason)
                task.cancel(reason)
                self.control = None
            self.schedule.restarted()
            self.cluster = self._new_cluster()
            resume = saves.choose_save(self.cluster.checkpoints.saves())
            delay = self.scenario.timing.job_restart_seconds + self._read_seconds(resume)
            await self.rt.wait_any([self.rt.timer(delay), self._stop_signal])
        resume = saves.choose_save(self.cluster.checkpoints.saves())
        self.control = orchestrator_for(
            self.scenario, self.rt, self.cluster, self.history, None, resume=resume
        )
        self._dead = False

    def _read_seconds(self, resume: Resume) -> float:
        if resume.state is None:
            return 0.0
        return save_seconds(self.scenario.world, self.scenario.timing)

    def _new_cluster(self) -> SimCluster:
        """The restarted job's processes: a new cluster on the same disk, the network's and
        the data set's troubles (impairment windows, over-long prompts) as they were."""
        old, scenario = self.cluster, self.scenario
        timeout = scenario.loop.update_weight_collective_timeout
        new = SimCluster(
            self.rt, scenario.world, scenario.timing, self.schedule, timeout, old.checkpoints.disk
        )
        new.restarted_from(old)
        new.on_job_killed = self._on_kill
        self.actions.cluster = new
        return new


__all__ = ["SimJob", "kills_jobs"]
