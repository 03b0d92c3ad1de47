"""Firing a scenario's faults at their moments, in any world.

The schedule is world-neutral: it knows when each fault strikes (a time, or a
named point that the world's code passes through) and records that it fired.
What a fault *does* is the world's FaultActions, which act and record nothing:
a killed process, a new one, a slower step are reported by the world itself,
the way it reports them without any fault, and the oracles judge those reports.

Each fault fires once. ``after_step`` arms a point fault once that step has
committed, ``after_time`` once the run's clock has reached that time (a world
that prepares a point's moment asks whether it will be armed by then). A
start_cell acts only once the control plane has stopped the cell (an operator
restarts what the control plane gave up on, not a cell it still believes
alive).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from miles_core.cells import CellState
from miles_core.errors import ConfigError
from miles_core.events import (
    CellStateChanged,
    Event,
    FaultInjected,
    FaultScheduled,
    FaultsHealed,
    History,
    StepBegan,
    StepCommitted,
)
from miles_core.fault_kinds import BY_KIND, TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop import LoopConfig, Orchestrator
from miles_core.runtime import Runtime
from miles_core.scenario.actions import FaultActions
from miles_core.scenario.faults import (
    After,
    AnyFault,
    AtTime,
    target_cell,
    target_engine,
)

if TYPE_CHECKING:
    from miles_core.backend import Cluster
    from miles_core.saves import Resume
    from miles_core.scenario.model import Scenario
    from miles_core.versions import VersionLedger


class FaultPoints(Protocol):
    """What a world's code calls at a named point: fire whatever strikes there."""

    def fire(self, point: FaultPoint, **where: Any) -> bool: ...

    def armed(self, point: FaultPoint, by: float | None = None, **where: Any) -> bool:
        """Whether a fault would fire here now, or at time ``by`` if that is when the point's
        moment comes (a world that must prepare the moment, such as halfway through a
        request, asks before it does; ``after_time`` is judged at ``by``)."""
        ...


class NoFaults:
    """The points of a world run without faults: nothing fires."""

    def fire(self, point: FaultPoint, **where: Any) -> bool:
        del point, where
        return False

    def armed(self, point: FaultPoint, by: float | None = None, **where: Any) -> bool:
        del point, where
        return False


"""The faults after which a start_cell of their cell has something to start."""

_OBSERVED = (StepCommitted, StepBegan, CellStateChanged)
"""The events the schedule acts on (every other event of a run is passed over)."""


class FaultSchedule:
    """The faults of one run, fired at their moments through a world's FaultActions."""

    def __init__(
        self,
        faults: Sequence[AnyFault],
        heal_step: int | None = None,
        heal_after_stall: float | None = None,
        heal_engines: bool = True,
        heal_point: FaultPoint = FaultPoint.STEP_BEGIN,
    ) -> None:
        """Liveness mode: the heal comes at ``heal_point`` once step ``heal_step`` has begun
        (as it begins, or as the first bucket from then on arrives), or once no step has
        committed for ``heal_after_stall`` seconds (a run the faults stopped before that
        step must still be healed and judged); ``heal_engines``: the heal restarts dead and
        hung engine processes (off with fault tolerance, whose job that is)."""
        self.faults = tuple(faults)
        self.heal_step = heal_step
        self.heal_point = heal_point
        self._heal_due = False
        """Step heal_step has begun: the heal strikes at the next firing of heal_point."""
        self.heal_after_stall = heal_after_stall
        self.heal_engines = heal_engines
        self._last_commit = 0.0
        """When a step last committed, or the schedule was installed (the run's start: a
        real world's clock has run through its start-up before it, 10 s of a CPU run's and
        60 s under load, which a bound of 12.7 s took for a stall, healing before step 0)."""
        self._disarmed: set[int] = set()
        self._healed = False
        self._points = frozenset(f.point for f in self.faults)
        self._fired: set[int] = set()
        self._committed = -1
        self._cell_states: dict[int, CellState] = {}
        self._pending_starts: list[int] = []
        self._struck: set[int] | None = None
        """Once the job was killed whole and restarted: the cells a fault took down since
        (None before any restart: every start_cell waits for its cell's stop)."""
        self._rt: Runtime | None = None
        self._history: History | None = None
        self._actions: FaultActions | None = None
        self._after = {i: f.when for i, f in enumerate(self.faults) if isinstance(f.when, After)}
        """Faults that strike after another fault or an event, not yet set off."""
        self._after_events = frozenset(a.event for a in self._after.values() if a.event)

    def install(self, rt: Runtime, history: History, actions: FaultActions) -> None:
        """Record the schedule, start the timers, and watch the history for step points."""
        if any(f.kind is FaultKind.KILL_JOB for f in self.faults) and not hasattr(
            actions, "kill_job"
        ):
            raise ConfigError(
                "faults (kill_job)",
                "this world cannot kill a whole job and resume it yet",
                "run the scenario in the simulator (python -m sim run), or remove the kill_job",
            )
        self._rt, self._history, self._actions = rt, history, actions
        self._last_commit = rt.now()
        history.observe(self._observe)
        for index, fault in enumerate(self.faults):
            at = fault.when.at if isinstance(fault.when, AtTime) else None
            history.append(FaultScheduled(t=rt.now(), **_recorded(index, fault), at=at))
        timed = sorted(
            (fault.when.at, index)
            for index, fault in enumerate(self.faults)
            if isinstance(fault.when, AtTime)
        )
        rt.spawn(self._clock(timed), "fault-clock", eager=True)
        if self.heal_step is not None and self.heal_after_stall is not None:
            rt.spawn(self._stall_watch(self.heal_after_stall), "heal-on-stall", eager=True)

    @property
    def fired(self) -> frozenset[int]:
        return frozenset(self._fired)

    def restarted(self) -> None:
        """The job was killed whole and restarts with new processes everywhere: the cells'
        states the schedule followed, and the starts it held until the control plane
        stopped a cell, belonged to the dead job (its new cells start alive)."""
        self._cell_states.clear()
        self._pending_starts.clear()
        self._struck = set()

    # -- when --------------------------------------------------------------------------

    async def _clock(self, timed: list[tuple[float, int]]) -> None:
        """Fire the faults at times, in time order, from one timer started at once (eager: no
        start event). It schedules nothing for a moment before the next fault's, so a run
        with one more fault at t is the run without it up to t (the simulator's tie-breaks
        depend on the time an event is for, sim/world/runtime.py ``_tie``): an aimed fault's
        probe (sim/search/aim.py) relies on it. A task per fault put a start event at time 0
        for each fault, which reordered the run's first instant."""
        rt = self._rt
        assert rt is not None
        for at, index in timed:
            await rt.sleep(max(0.0, at - rt.now()))
            self._apply(index)

    async def _stall_watch(self, seconds: float) -> None:
        """Heal once no step has committed for ``seconds`` (if the heal has not come yet)."""
        rt = self._rt
        assert rt is not None
        while not self._healed:
            left = self._last_commit + seconds - rt.now()
            if left <= 0:
                self._heal(None)
                return
            await rt.sleep(left)

    def _matches(
        self, fault: AnyFault, point: FaultPoint, where: dict[str, Any], by: float | None = None
    ) -> bool:
        when = fault.when
        if when.point is not point:
            return False
        after = getattr(when, "after_step", None)
        if after is not None and self._committed < after:
            return False
        after_time = getattr(when, "after_time", None)
        if after_time is not None and (self._now() if by is None else by) < after_time:
            return False
        for key in ("step", "bucket"):
            wanted = getattr(when, key, None)
            if wanted is not None and where.get(key) != wanted:
                return False
        cell, engine = target_cell(fault), target_engine(fault)
        if cell is not None and "cell" in where and where["cell"] != cell:
            return False
        return engine is None or "engine" not in where or where["engine"] == engine

    def _now(self) -> float:
        assert self._rt is not None, "install the schedule before its points are asked"
        return self._rt.now()

    def armed(self, point: FaultPoint, by: float | None = None, **where: Any) -> bool:
        if point not in self._points:  # asked for every request: most runs have none there
            return False
        return any(
            index not in self._fired
            and index not in self._disarmed
            and self._matches(fault, point, where, by)
            for index, fault in enumerate(self.faults)
        )

    def fire(self, point: FaultPoint, **where: Any) -> bool:
        """Fire every fault that strikes here, now (after the heal, if it strikes here)."""
        if self._heal_due and point is self.heal_point and not self._healed:
            self._heal(self.heal_step)
        fired = False
        for index, fault in enumerate(self.faults):
            if index in self._fired or index in self._disarmed:
                continue
            if not self._matches(fault, point, where):
                continue
            fired = True
            self._apply(index)
        return fired

    def _observe(self, event: Event) -> None:
        if isinstance(event, FaultInjected):
            return  # its own: what follows it is set off once it has acted (``_apply``)
        if self._after and type(event).__name__ in self._after_events:
            self._set_off(event)
        if not isinstance(event, _OBSERVED):  # one test for the many events it ignores
            return
        if isinstance(event, StepCommitted):
            self._committed = max(self._committed, event.step)
            self._last_commit = event.t
        elif isinstance(event, StepBegan):
            if event.step == self.heal_step:
                self._heal_due = True
            self.fire(FaultPoint.STEP_BEGIN, step=event.step)
        elif isinstance(event, CellStateChanged):
            self._cell_states[event.cell] = event.new
            if event.new is CellState.STOPPED and event.cell in self._pending_starts:
                self._pending_starts.remove(event.cell)
                self._start(event.cell)

    def _set_off(self, event: Event) -> None:
        """Start the faults whose ``after`` is this event (or this fault's firing): at once,
        or after their seconds, each once."""
        due = [
            index
            for index, after in self._after.items()
            if (
                after.matches(event)
                if after.event
                else isinstance(event, FaultInjected) and event.index == after.fault
            )
        ]
        for index in due:
            seconds = self._after.pop(index).seconds
            if seconds == 0:
                self._apply(index)
            else:
                assert self._rt is not None
                self._rt.spawn(self._later(index, seconds), f"fault-{index}-after", eager=True)

    async def _later(self, index: int, seconds: float) -> None:
        assert self._rt is not None
        await self._rt.sleep(seconds)
        self._apply(index)

    # -- what ----------------------------------------------------------------------------

    def _heal(self, step: int | None) -> None:
        """Liveness mode: every fault not fired yet is disarmed (it never fires), the world
        repairs itself, and each dead cell is started (once the control plane has stopped
        it, as a start_cell fault does). From here the run must make progress unaided."""
        assert self._rt is not None and self._history is not None and self._actions is not None
        self._healed = True
        disarmed = [i for i in range(len(self.faults)) if i not in self._fired]
        self._disarmed.update(disarmed)
        self._history.append(FaultsHealed(t=self._rt.now(), step=step, disarmed=tuple(disarmed)))
        for cell in self._actions.heal(self.heal_engines):
            if self._cell_states.get(cell, CellState.ALIVE) is CellState.STOPPED:
                self._start(cell)
            elif cell not in self._pending_starts:
                self._pending_starts.append(cell)

    def _apply(self, index: int) -> None:
        if index in self._fired or index in self._disarmed:
            return
        self._fired.add(index)
        fault = self.faults[index]
        assert self._rt is not None and self._history is not None and self._actions is not None
        injected = FaultInjected(
            t=self._rt.now(),
            **_recorded(index, fault),
            factor=getattr(fault, "factor", None),
            seconds=getattr(fault, "seconds", None),
            duration=getattr(fault, "duration", None),
        )
        self._history.append(injected)
        self._act(fault)
        if self._after:  # after the fault has acted: ``after = {fault = N}`` follows its effect
            self._set_off(injected)

    def _act(self, fault: AnyFault) -> None:
        """The world acts (its FaultActions, as the kind's act says: fault_kinds.BY_KIND); a
        start_cell waits until the control plane has stopped the cell."""
        assert self._actions is not None
        cell, kind = target_cell(fault), fault.kind
        if self._struck is not None and cell is not None and kind in TAKES_A_CELL_DOWN:
            self._struck.add(cell)
        if kind is FaultKind.START_CELL:
            assert cell is not None
            if self._struck is not None and cell not in self._struck:
                return  # the job's restart gave the cell new processes: nothing to start
            if self._cell_states.get(cell, CellState.ALIVE) is CellState.STOPPED:
                self._start(cell)
            else:  # the control plane has not given up on the cell yet
                self._pending_starts.append(cell)
            return
        BY_KIND[kind].act(self._actions, fault)

    def _start(self, cell: int) -> None:
        assert self._actions is not None
        self._actions.start_cell(cell)


def _recorded(index: int, fault: AnyFault) -> dict[str, Any]:
    """What FaultScheduled and FaultInjected both record of a fault."""
    return {
        "index": index,
        "fault": fault.kind,
        "cell": target_cell(fault),
        "engine": target_engine(fault),
        "detail": fault.detail,
        "point": fault.point,
    }


def schedule_for(scenario: Scenario) -> FaultSchedule:
    """The fault schedule of a run of ``scenario``: its faults and, in liveness mode, its
    heal (as the heal step begins, or after the bound without a commit)."""
    plan = scenario.liveness_plan()
    return FaultSchedule(
        scenario.faults,
        plan.heal_step if plan is not None else None,
        plan.seconds if plan is not None else None,
        heal_engines=not scenario.loop.use_fault_tolerance,
        heal_point=scenario.liveness.heal_point if scenario.liveness else FaultPoint.STEP_BEGIN,
    )


def orchestrator_for(
    scenario: Scenario,
    rt: Runtime,
    cluster: Cluster,
    history: History,
    ledger: VersionLedger | None,
    loop: LoopConfig | None = None,
    resume: Resume | None = None,
) -> Orchestrator:
    """The control plane of a run of ``scenario`` in any world: its loop (or ``loop``, a
    real world's run of it), the ending it expects, until_witnessed and liveness mode;
    ``resume``: a killed job's restart from that save (miles_core.saves.choose_save)."""
    return Orchestrator(
        rt,
        cluster,
        scenario.loop if loop is None else loop,
        history,
        ledger,
        expected_status=scenario.expect.status,
        expected_error=scenario.expect.error,
        until_witnessed=scenario.until_witnessed,
        liveness=scenario.liveness_plan(),
        resume=resume,
    )
