"""Idle windows: a window fault that nothing it acts on passed through.

Whether a request enters the router (a full buffer stops submission, as miles'
``_worker_loop`` does while a put waits), an update sends a bucket or a cell
begins a step in a given stretch of time is the run's own pace: generation, the
dynamic filter, dead engines and retries decide it, and no schedule can promise
it. A slow_cell, slow_link, partition, delay_router or fail_router window that met
nothing it acts on has nothing to witness, and so has a slow_start window in which no
start of its engine began (a restart or a recovery is the faults' and the health
monitor's doing, not the schedule's) (fault_witness passes it once it has closed);
``idle_faults`` says which and why, for the run's report and the sweep's count.
drop_heartbeat is not among them: heartbeats go out on the checker's fixed
interval, so a window with none sent to a live cell is the checker's failure.

A run with until_witnessed waits while an idle window is open (it may still meet
something), so this sits with the witnesses, outside the oracles.
"""

from __future__ import annotations

from collections.abc import Callable

from miles_core.events import FaultInjected, History
from miles_core.kinds import FaultKind
from miles_core.witness.index import (
    WitnessIndex,
    bucket_sends_in,
    cut_met_something,
    requests_in,
    retries_in,
    start_begins,
    steps_in,
    window,
)


def _no_requests(fault: FaultInjected, index: WitnessIndex) -> str | None:
    if requests_in(fault, index) or retries_in(fault, index):
        return None
    return "no request was sent through the router in it"


def _no_bucket_sends(fault: FaultInjected, index: WitnessIndex) -> str | None:
    return None if bucket_sends_in(fault, index) else "no bucket send began in it"


def _nothing_crossed(fault: FaultInjected, index: WitnessIndex) -> str | None:
    return None if cut_met_something(fault, index) else "no bucket send began in it"


def _no_cell_steps(fault: FaultInjected, index: WitnessIndex) -> str | None:
    return None if steps_in(fault, index) else f"no step of cell {fault.cell} began in it"


def _no_engine_starts(fault: FaultInjected, index: WitnessIndex) -> str | None:
    start, end = window(fault)
    if any(start <= t < end for _, t in start_begins(fault.engine, index)):
        return None
    return f"no start of engine {fault.engine} began in it"


_IDLE: dict[FaultKind, Callable[[FaultInjected, WitnessIndex], str | None]] = {
    FaultKind.SLOW_START: _no_engine_starts,
    FaultKind.SLOW_CELL: _no_cell_steps,
    FaultKind.SLOW_LINK: _no_bucket_sends,
    FaultKind.PARTITION: _nothing_crossed,
    FaultKind.DELAY_ROUTER: _no_requests,
    FaultKind.FAIL_ROUTER: _no_requests,
}
"""The windows whose traffic is the run's own pace (see the module's docstring)."""


def idle_reason(fault: FaultInjected, index: WitnessIndex) -> str | None:
    """Why the fault's window met nothing it acts on; None when something passed through
    it, or when the kind is judged whatever its window met."""
    idle = _IDLE.get(fault.fault)
    return None if idle is None else idle(fault, index)


def idle_faults(history: History) -> dict[int, str]:
    """The fired faults whose window met nothing they act on, by the fault's index: why."""
    index = WitnessIndex.of(history)
    idle = {e.index: idle_reason(e, index) for _, e in index.fired}  # type: ignore[union-attr]
    return {i: reason for i, reason in idle.items() if reason is not None}
