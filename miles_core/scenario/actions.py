"""What each fault kind has a world do when it fires: the world's FaultActions (each world
acts on itself and records nothing), and the acts, the call the schedule makes for one
fault (miles_core/fault_kinds.py names each kind's act in its row).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from miles_core.kinds import FaultPoint
from miles_core.scenario.faults import (
    AnyFault,
    DelayRouter,
    DropHeartbeat,
    FailRank,
    FailRouter,
    HangCall,
    KillRank,
    Partition,
    RaiseHoldingLock,
    SlowCell,
    SlowLink,
    SlowStart,
    target_cell,
    target_engine,
)

Impairment = SlowCell | SlowStart | SlowLink | Partition | DelayRouter | FailRouter | DropHeartbeat
"""A fault that changes how the world behaves for ``duration`` seconds."""


def impaired_part(fault: Impairment) -> tuple[str, float]:
    """What part of a world an impairment acts on, and its factor, in the one spelling both
    worlds use: ``cell-N`` and ``link`` (slower by the factor), ``router-delay`` and
    ``start-ENGINE`` (seconds added: factor - 1), ``partition`` (the weight link cut),
    ``router-fail``, ``heartbeat-N`` (muted)."""
    if isinstance(fault, SlowCell):
        return f"cell-{fault.cell}", fault.factor
    if isinstance(fault, SlowStart):
        return f"start-{fault.engine}", 1.0 + fault.seconds
    if isinstance(fault, SlowLink):
        return "link", fault.factor
    if isinstance(fault, Partition):
        return "partition", 1.0
    if isinstance(fault, DelayRouter):
        return "router-delay", 1.0 + fault.seconds
    if isinstance(fault, FailRouter):
        return "router-fail", 1.0
    return f"heartbeat-{fault.cell}", 1.0


class FaultActions(Protocol):
    """What a world does when a fault fires: it acts on itself and records nothing."""

    def kill_cell(self, cell: int, point: FaultPoint | None) -> None:
        """Kill every process of the cell; at a point, inside the call about to be made."""
        ...

    def start_cell(self, cell: int) -> None:
        """Start new processes for a stopped cell (the world reports them when they answer)."""
        ...

    def kill_rank(self, cell: int, rank: int, point: FaultPoint | None) -> None:
        """Kill one rank's process of the cell (at a point, inside the call about to be made);
        the others live on until the cell is stopped."""
        ...

    def fail_rank(self, cell: int, rank: int) -> None:
        """Make that rank raise in the cell's step about to exchange, its process alive."""
        ...

    def raise_holding_lock(self, cell: int, rank: int) -> None:
        """Make that rank take the cell's weight-update ticket lock and raise inside it, its
        process alive: the lock stays held (today's profile; a cell of several ranks)."""
        ...

    def kill_engine(self, engine: str, point: FaultPoint | None) -> None: ...

    def restart_engine(self, engine: str) -> None:
        """Replace the engine's process by a new one (reported when it answers)."""
        ...

    def hang_engine(self, engine: str) -> None:
        """Make the engine's process stop answering, alive (until something kills it)."""
        ...

    def hang_call(self, engine: str, call: str) -> None:
        """Make the engine's process leave every ``call`` (an SGLang route name) unanswered
        from now on, answering everything else, until the process is replaced."""
        ...

    def orphan_engine(self, engine: str) -> None:
        """Lose the engine's actor, its server left running and in the router (reported as
        the actor's exit)."""
        ...

    def lying_engine(self, engine: str) -> None:
        """Make the engine's process answer every weight-update call with success and load
        nothing from now on (its weights stay as they are), until it is replaced."""
        ...

    def delta_fault(self, kind: str, engine: str | None) -> None:
        """disk-delta: arm the engine's next pull (``delta_applied_twice``: applies its last
        version a second time, unverified; ``delta_skipped``: applies nothing, answers
        success) or the next version written (``delta_torn``: its file truncated)."""
        ...

    def poison_prompt(self) -> None:
        """Make the next prompt the engines are asked for longer than their context."""
        ...

    def impair(self, fault: Impairment) -> None:
        """Slow or fail part of the world from now for ``fault.duration`` seconds."""
        ...

    def kill_job(self, point: FaultPoint | None) -> None:
        """Kill every process of the run at once, the controller's included (kill_job); the
        world reports the death (JobKilled) and restarts the job from its last save."""
        ...

    def restart_driver(self, point: FaultPoint | None) -> None:
        """Kill the driver alone (restart_driver), its cells and engines up; the world
        reports it (DriverRestarted) and starts a new driver that adopts them."""
        ...

    def heal(self, engines: bool) -> tuple[int, ...]:
        """Liveness mode's heal: end every impairment and (``engines``) restart every engine
        process that is dead or hung; give the cells whose processes are dead (the schedule
        starts them once the control plane has stopped them, as it starts any cell)."""
        ...


Act = Callable[[FaultActions, Any], None]
"""A kind's act: the world's call for one fault of that kind."""


def _cell(fault: AnyFault) -> int:
    cell = target_cell(fault)
    assert cell is not None
    return cell


def _engine(fault: AnyFault) -> str:
    engine = target_engine(fault)
    assert engine is not None
    return engine


def kill_cell(actions: FaultActions, fault: AnyFault) -> None:
    """kill_cell and stop_cell: every process of the cell (a stop is an operator's kill)."""
    actions.kill_cell(_cell(fault), fault.point)


def kill_rank(actions: FaultActions, fault: KillRank) -> None:
    actions.kill_rank(_cell(fault), fault.rank, fault.point)


def fail_rank(actions: FaultActions, fault: FailRank) -> None:
    actions.fail_rank(_cell(fault), fault.rank)


def raise_holding_lock(actions: FaultActions, fault: RaiseHoldingLock) -> None:
    actions.raise_holding_lock(_cell(fault), fault.rank)


def start_cell(actions: FaultActions, fault: AnyFault) -> None:
    """New processes (the schedule calls it once the control plane has stopped the cell)."""
    actions.start_cell(_cell(fault))


def kill_engine(actions: FaultActions, fault: AnyFault) -> None:
    actions.kill_engine(_engine(fault), fault.point)


def restart_engine(actions: FaultActions, fault: AnyFault) -> None:
    actions.restart_engine(_engine(fault))


def hang_engine(actions: FaultActions, fault: AnyFault) -> None:
    actions.hang_engine(_engine(fault))


def hang_call(actions: FaultActions, fault: HangCall) -> None:
    actions.hang_call(_engine(fault), fault.call)


def orphan_engine(actions: FaultActions, fault: AnyFault) -> None:
    actions.orphan_engine(_engine(fault))


def lying_engine(actions: FaultActions, fault: AnyFault) -> None:
    actions.lying_engine(_engine(fault))


def delta_fault(actions: FaultActions, fault: AnyFault) -> None:
    """The three disk-delta faults: one call, its kind named."""
    actions.delta_fault(fault.kind.value, target_engine(fault))


def poison_prompt(actions: FaultActions, fault: AnyFault) -> None:
    del fault
    actions.poison_prompt()


def kill_job(actions: FaultActions, fault: AnyFault) -> None:
    actions.kill_job(fault.point)


def restart_driver(actions: FaultActions, fault: AnyFault) -> None:
    actions.restart_driver(fault.point)


def impair(actions: FaultActions, fault: Impairment) -> None:
    """An impairment: part of the world slowed or failing for ``fault.duration`` seconds
    (``impaired_part`` names the part in the spelling both worlds use)."""
    actions.impair(fault)
