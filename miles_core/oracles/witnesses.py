"""fault_witness: every fault that fired took effect, as the world (not the injector) reports.

Each fault kind has its witness, read from what the world and the control plane recorded
after the fault fired (miles_core.witness.effects lists them: a run with until_witnessed
reads them too, so they sit outside the oracles).

A fault that fired and changed nothing fails its witness, and so does one that
had nothing to act on, unless its window's traffic is the run's own pace: a
slow_cell, slow_link, partition, delay_router or fail_router window that nothing it acts
on passed through is idle (``miles_core.witness.idle`` says why no schedule
can promise otherwise); once closed it has nothing to witness and passes. In a
run that completed, every scheduled fault must have fired; ``unfired_reason``
says why one did not (the run ended first, or its point was never reached). A run
interrupted from outside (Ctrl-C) is not judged: the effect of a fault that fired
just before may have been on its way. In a job killed whole, each fault is judged within
the segment it fired in (``miles_core.oracles.job_witness``).
"""

from __future__ import annotations

from miles_core.events import (
    FaultInjected,
    FaultScheduled,
    History,
    RunEnded,
    RunStarted,
    StepCommitted,
)
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Violation
from miles_core.oracles.job_witness import Missed, excused_unfired, segmented_miss
from miles_core.segments import killed
from miles_core.witness.effects import unwitnessed
from miles_core.witness.index import WitnessIndex

NAME = "fault_witness"


def fault_witness(history: History) -> Violation | None:
    index = WitnessIndex.of(history)
    if index.ended is not None and index.ended[1].status is RunStatus.INTERRUPTED:  # type: ignore[union-attr]
        return None  # cut from outside: a fault's effect may have been on its way
    unfired = never_fired(history, index)
    if unfired is not None:
        return unfired
    # a job killed whole: each fault judged in its own segment
    miss = segmented_miss(history, index) if killed(history) else _first_miss(index)
    if miss is None:
        return None
    e = miss.fault
    return Violation(
        NAME, f"fault {e.fault.value} ({e.detail}) had no effect: {miss.missing}", ((miss.seq, e),)
    )


def _first_miss(index: WitnessIndex) -> Missed | None:
    """The first fault that fired whose witness misses its effect."""
    for seq, e in index.fired:
        assert isinstance(e, FaultInjected)
        missing = unwitnessed(e, seq, index)
        if missing is not None:
            return Missed(seq, e, missing)
    return None


def never_fired(history: History, index: WitnessIndex) -> Violation | None:
    """In a run that completed, a scheduled fault that never fired (and was not disarmed)."""
    if index.ended is None or index.ended[1].status is not RunStatus.COMPLETED:  # type: ignore[union-attr]
        return None
    fired = {e.index for _, e in index.fired} | index.disarmed  # type: ignore[union-attr]
    excused = excused_unfired if killed(history) else (lambda e: False)
    for seq, e in index.scheduled:
        if e.index not in fired and not excused(e):  # type: ignore[union-attr, arg-type]
            return Violation(
                NAME,
                f"scheduled fault {e.fault.value} ({e.detail}) never fired: "  # type: ignore[union-attr]
                f"{unfired_reason(e, history)}",  # type: ignore[arg-type]
                ((seq, e), index.ended),
            )
    return None


def unfired_reason(fault: FaultScheduled, history: History) -> str:
    """Why a scheduled fault never fired: the run ended first, or it never reached the point."""
    end = next((e for e in history if isinstance(e, RunEnded)), None)
    started = next((e for e in history if isinstance(e, RunStarted)), None)
    steps = sum(isinstance(e, StepCommitted) for e in history)
    planned = started.steps if started is not None and started.steps else steps
    end_t = history[-1].t if len(history) else 0.0
    if end is None:
        return "the run was cut off before it"
    if end.status is not RunStatus.COMPLETED:
        return f"the run ended early ({end.status.value} after {steps} of {planned} steps)"
    if fault.at is not None:
        return f"the run ended at t={end_t:g}, before its time t={fault.at:g}; move it earlier"
    if fault.detail.startswith("after "):
        return (
            f"the run completed before what it waits for ({fault.detail}) came, or before its "
            "seconds after it ran out; wait on something the run reaches, or make it longer"
        )
    target = f"cell {fault.cell}" if fault.cell is not None else fault.engine or "the world"
    return (
        f"the run completed its {max(planned, steps)} steps without reaching that point for "
        f"{target} "
        "(the point is unreachable in this run; move the fault or make the run longer)"
    )


__all__ = ["NAME", "fault_witness", "never_fired", "unfired_reason"]
