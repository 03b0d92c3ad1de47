"""The events the fault witnesses read, picked out of a history in one pass, and what
passed through a fault's window.

Part of miles_core.witness (what a fault's effect looks like), which the fault_witness
oracle and the run's until_witnessed stop both read.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

from miles_core.backend import LINK_CUT
from miles_core.event_index import Indexed, select
from miles_core.events import (
    AttemptBegan,
    BucketReceived,
    CellStarted,
    CellStateChanged,
    CellTrained,
    EngineExited,
    EngineRecoveryAsked,
    EngineStarted,
    EngineStateChanged,
    FaultInjected,
    FaultScheduled,
    FaultsHealed,
    HealEnded,
    HeartbeatMissed,
    History,
    JobKilled,
    JobResumed,
    OrphanRemoved,
    PlacementMade,
    QuorumChanged,
    RequestRetried,
    RunEnded,
    RunStarted,
    SampleGenerated,
    StepCommitted,
    UpdateAborted,
    UpdateBegan,
    WeightsChecked,
)
from miles_core.kinds import FaultKind

_FOLLOWED = (
    EngineExited,
    WeightsChecked,
    CellStateChanged,
    QuorumChanged,
    HealEnded,
    RunEnded,
    CellStarted,
    EngineStarted,
    EngineStateChanged,
    EngineRecoveryAsked,
    OrphanRemoved,
    JobKilled,
    JobResumed,
)
"""What the kill, start and restart witnesses read after their fault."""

_PICKED = (
    UpdateAborted,
    FaultInjected,
    FaultScheduled,
    AttemptBegan,
    CellTrained,
    BucketReceived,
    HeartbeatMissed,
    StepCommitted,
    RunStarted,
    RequestRetried,
    FaultsHealed,
    UpdateBegan,
    PlacementMade,
)
"""The other events the index keeps (RunEnded is followed)."""


@dataclass
class WitnessIndex:
    """The events the witnesses read, picked out of the history in one pass."""

    events: list[Indexed] = field(default_factory=list)
    fired: list[Indexed] = field(default_factory=list)
    scheduled: list[Indexed] = field(default_factory=list)
    attempts: dict[tuple[int, int], float] = field(default_factory=dict)
    trained: list[CellTrained] = field(default_factory=list)
    buckets: list[BucketReceived] = field(default_factory=list)
    aborted: list[UpdateAborted] = field(default_factory=list)
    updaters: dict[int, int] = field(default_factory=dict)
    """update id -> the cell that sent it (a bucket's route is its sender and engines)."""
    samples: list[SampleGenerated] = field(default_factory=list)
    retries: list[RequestRetried] = field(default_factory=list)
    """The tries the router failed that were sent again (a request's last is a sample)."""
    misses: list[HeartbeatMissed] = field(default_factory=list)
    started: RunStarted | None = None
    placement: PlacementMade | None = None
    """Where the world put the cells and engines (a send within a node is faster)."""
    ended: Indexed | None = None
    healed: FaultsHealed | None = None
    """Liveness mode's heal: the faults it disarmed never fire, and it ends every window."""
    steps: int = 0

    @classmethod
    def of(cls, history: History) -> WitnessIndex:
        index = cls()
        for seq, e in select(history, SampleGenerated, *_FOLLOWED, *_PICKED):
            if isinstance(e, SampleGenerated):
                index.samples.append(e)
                continue
            if isinstance(e, _FOLLOWED):
                index.events.append((seq, e))
            if isinstance(e, FaultInjected):
                index.fired.append((seq, e))
            elif isinstance(e, FaultScheduled):
                index.scheduled.append((seq, e))
            elif isinstance(e, AttemptBegan):
                index.attempts[(e.step, e.attempt)] = e.t
            elif isinstance(e, CellTrained):
                index.trained.append(e)
            elif isinstance(e, BucketReceived):
                index.buckets.append(e)
            elif isinstance(e, UpdateAborted):
                index.aborted.append(e)
            elif isinstance(e, UpdateBegan):
                index.updaters[e.update_id] = e.updater
            elif isinstance(e, HeartbeatMissed):
                index.misses.append(e)
            elif isinstance(e, RequestRetried):
                index.retries.append(e)
            elif isinstance(e, FaultsHealed):
                index.healed = index.healed or e
            elif isinstance(e, StepCommitted):
                index.steps += 1
            elif isinstance(e, RunStarted):
                index.started = index.started or e
            elif isinstance(e, PlacementMade):
                index.placement = index.placement or e
            elif isinstance(e, RunEnded):
                index.ended = index.ended or (seq, e)
        return index

    def after(self, seq: int) -> list[Indexed]:
        """The events a witness follows (``_FOLLOWED``) recorded after position ``seq``."""
        return self.events[bisect_left(self.events, seq + 1, key=lambda x: x[0]) :]

    @property
    def disarmed(self) -> frozenset[int]:
        return frozenset(self.healed.disarmed) if self.healed is not None else frozenset()

    def cut_by_heal(self, fault: FaultInjected) -> bool:
        """The heal ended the fault's window before it would have closed by itself."""
        healed = self.healed
        return healed is not None and fault.t <= healed.t < window(fault)[1]

    def within_a_node(self, cell: int | None, engines: tuple[str, ...]) -> bool | None:
        """Whether a send from ``cell`` to ``engines`` stays within one node, by the world's
        placement (None when it is not known)."""
        placement = self.placement
        if placement is None or cell is None or cell >= len(placement.cells):
            return None
        nodes = {placement.nodes[p] for p in placement.cells[cell]}
        if len(nodes) != 1:
            return False
        for engine in engines:
            index = int(engine.rpartition("-")[2])
            if index >= len(placement.engines):
                return None
            if not {placement.nodes[p] for p in placement.engines[index]} <= nodes:
                return False
        return True

    def windows(self, kind: FaultKind, cell: int | None = None) -> list[tuple[float, float]]:
        return [
            window(e)  # type: ignore[arg-type]
            for _, e in self.fired
            if e.fault is kind and (cell is None or e.cell == cell)  # type: ignore[union-attr]
        ]


# -- what passed through a fault's window ------------------------------------------------


def window(fault: FaultInjected) -> tuple[float, float]:
    """The fault's window: [fired, fired + duration)."""
    return fault.t, fault.t + (fault.duration or 0.0)


def requests_in(fault: FaultInjected, index: WitnessIndex) -> list[SampleGenerated]:
    """The requests sent through the router during the fault's window."""
    start, end = window(fault)
    return [s for s in index.samples if start <= s.sent < end]


def retries_in(fault: FaultInjected, index: WitnessIndex) -> list[RequestRetried]:
    """The tries sent through the router during the fault's window that failed there and
    were sent again later (``requests_in`` has each request's last try)."""
    start, end = window(fault)
    return [r for r in index.retries if start <= r.sent < end]


def bucket_sends_in(fault: FaultInjected, index: WitnessIndex) -> list[BucketReceived]:
    """The bucket sends that began during the fault's window."""
    start, end = window(fault)
    return [b for b in index.buckets if start <= b.t - b.seconds < end]


def cut_sends_in(fault: FaultInjected, index: WitnessIndex) -> list[UpdateAborted]:
    """The updates that failed on a collective this cut stalled past its timeout: after the
    window opened (the failure comes a timeout after the send began, maybe past the window's
    end), before the next partition opened."""
    start = fault.t
    later = [w for w, _ in index.windows(FaultKind.PARTITION) if w > start]
    until = min(later, default=math.inf)
    return [a for a in index.aborted if start <= a.t < until and LINK_CUT in a.reason]


def cut_met_something(fault: FaultInjected, index: WitnessIndex) -> bool:
    """A bucket send began in the partition's window, or an update failed on it."""
    return bool(bucket_sends_in(fault, index) or cut_sends_in(fault, index))


def steps_in(fault: FaultInjected, index: WitnessIndex) -> list[CellTrained]:
    """The fault's cell's steps (attempts) that began during its window."""
    start, end = window(fault)
    began = index.attempts
    return [
        r
        for r in index.trained
        if r.cell == fault.cell and start <= began.get((r.step, r.attempt), -1.0) < end
    ]


def start_begins(engine: str | None, index: WitnessIndex) -> list[tuple[int, float]]:
    """(position, time) of each start of the engine's new process: a restart_engine fault
    or a recovery the control plane asked for."""
    faults = [
        (seq, e.t)
        for seq, e in index.fired
        if e.fault is FaultKind.RESTART_ENGINE and e.engine == engine  # type: ignore[union-attr]
    ]
    asked = [
        (seq, e.t)
        for seq, e in index.events
        if isinstance(e, EngineRecoveryAsked) and e.engine == engine
    ]
    return sorted(faults + asked)
