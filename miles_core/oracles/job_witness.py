"""fault_witness in a job killed whole: each fault judged within the segment it fired in.

A segment is one controller's run (miles_core.segments): its processes, numbered
afresh, are not those of the segment before. So a fault's witness reads the segment the
fault fired in, except kill_job's, which reads the joined history (the death ends one
segment, the resume begins the next). Two faults a kill overtakes pass:

- one whose segment the kill ended before its effect showed: the kill took the processes it
  acted on, as a run's end overtakes a fault that never fired;
- a start_cell with no fault taking its cell down before it in its segment: the job's
  restart gave every cell new processes already, so an operator has nothing to start (the
  schedule does nothing for it either).

In a job killed whole, a scheduled fault at a heal or a recovery, or after an event or
another fault, may never come: the restart undid what would have led to it
(``excused_unfired``); every other one must still fire.

It finds what is missed; the fault_witness oracle (miles_core.oracles.witnesses), which
imports it, words the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.event_index import select
from miles_core.events import FaultInjected, FaultScheduled, History
from miles_core.fault_kinds import TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.segments import Segment, part, segment_at
from miles_core.witness.effects import unwitnessed
from miles_core.witness.index import WitnessIndex


@dataclass(frozen=True)
class Missed:
    """A fault that fired, where, and what its witness missed."""

    seq: int
    fault: FaultInjected
    missing: str


def segmented_miss(history: History, joined: WitnessIndex) -> Missed | None:
    """The first fault that fired without its effect, each judged in its segment (None:
    every one took effect, or was overtaken)."""
    indexes: dict[int, WitnessIndex] = {}
    for seq, e in joined.fired:
        assert isinstance(e, FaultInjected)
        if e.fault in (FaultKind.KILL_JOB, FaultKind.RESTART_DRIVER):  # ends its segment
            missing = unwitnessed(e, seq, joined)
        else:
            segment = segment_at(history, seq)
            own = part(history, segment)
            index = indexes.get(segment.index)
            if index is None:
                index = indexes[segment.index] = WitnessIndex.of(own)
            missing = unwitnessed(e, seq - segment.first, index)
            if missing is not None and _overtaken(e, segment, own):
                missing = None
        if missing is not None:
            return Missed(seq, e, missing)
    return None


def _overtaken(fault: FaultInjected, segment: Segment, own: History) -> bool:
    """The kill ended the fault's segment before its effect could show, or a start_cell
    found nothing to start in a restarted job (no fault took its cell down since)."""
    if segment.killed is not None:
        return True
    if fault.fault is not FaultKind.START_CELL or segment.resumed is None:
        return False
    return not any(
        e.cell == fault.cell and e.fault in TAKES_A_CELL_DOWN and e.t <= fault.t  # type: ignore[attr-defined]
        for _, e in select(own, FaultInjected)
    )


def excused_unfired(scheduled: FaultScheduled) -> bool:
    """A fault that never fired in a job killed whole, whose moment the restart may have
    undone: a heal or a recovery that followed a fault the kill overtook, an event or a
    fault it waited for that the restarted job never repeated."""
    return scheduled.point in _UNDONE or scheduled.detail.startswith("after ")


_UNDONE = frozenset({FaultPoint.DURING_HEAL, FaultPoint.DURING_RECOVERY})


__all__ = ["Missed", "excused_unfired", "segmented_miss"]
