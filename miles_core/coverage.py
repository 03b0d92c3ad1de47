"""Fault coverage: which fault struck in which phase of the loop's work, read from a history.

A cell of the map is (fault kind, how it was scheduled, loop phase). "How" is
the fault's point (``after_bucket``, ``before_allreduce``...) or ``at_time``.
The phase is what the control plane was doing when the world reported the
fault (``FaultInjected``), read from the events recorded before it, so any
world's history gets a map, the real ones included:

    healing         a heal had begun (HealBegan) and not ended
    paused          an update had begun (UpdateBegan) and no bucket had arrived yet
                    (engines pausing, flushing, opening their session)
    bucket_first    the update's first bucket was on its way
    bucket_middle   a bucket between the first and the last was on its way
    bucket_last     the last bucket was on its way
    stamping        every bucket had arrived; the stamp, publish and resume were due
    allreduce       a cell was about to exchange its gradients (the fault's point
                    says so, or another cell of the attempt had already exchanged)
    training        an attempt was under way
    generating      none of the above: the engines were generating

When phases overlap (a fully async run generates while it trains), the most
specific wins, in the order listed. A fault at ``after_bucket k`` strikes as
bucket k arrives: its phase is that of bucket k (``stamping`` when k is the last,
the window between the last bucket and the stamp).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    BucketReceived,
    CellTrained,
    EnginesResumed,
    Event,
    FaultInjected,
    HealBegan,
    HealEnded,
    UpdateAborted,
    UpdateBegan,
    UpdateSessionOpened,
)
from miles_core.kinds import FaultPoint

AT_TIME = "at_time"
PHASES = (
    "generating",
    "training",
    "allreduce",
    "paused",
    "bucket_first",
    "bucket_middle",
    "bucket_last",
    "stamping",
    "healing",
)
_BUCKET_PHASES = ("bucket_first", "bucket_middle", "bucket_last", "stamping")


@dataclass(frozen=True, order=True)
class CoverageCell:
    """One cell of the map."""

    kind: str
    how: str
    phase: str

    def key(self) -> str:
        return f"{self.kind}@{self.how}:{self.phase}"


@dataclass
class _Open:
    """What was under way at a moment of the history."""

    heals: set[int] = field(default_factory=set)
    updates: dict[int, int] = field(default_factory=dict)
    """update id -> its bucket count."""
    arrived: dict[int, set[int]] = field(default_factory=dict)
    """update id -> the buckets that arrived."""
    sessions: set[int] = field(default_factory=set)
    """updates whose engines opened their update session (buckets may be on their way)."""
    attempts: dict[tuple[int, int], bool] = field(default_factory=dict)
    """(step, attempt) -> whether a cell of it has exchanged already."""

    def see(self, e: Event) -> None:
        if isinstance(e, HealBegan):
            self.heals.add(e.dst_cell)
        elif isinstance(e, HealEnded):
            self.heals.discard(e.dst_cell)
        elif isinstance(e, UpdateBegan):
            self.updates[e.update_id] = e.n_buckets
            self.arrived[e.update_id] = set()
        elif isinstance(e, UpdateSessionOpened):
            self.sessions.add(e.update_id)
        elif isinstance(e, BucketReceived) and e.update_id in self.arrived:
            self.arrived[e.update_id].add(e.bucket)
        elif isinstance(e, EnginesResumed | UpdateAborted):
            self.updates.pop(e.update_id, None)
            self.arrived.pop(e.update_id, None)
            self.sessions.discard(e.update_id)
        elif isinstance(e, AttemptBegan):
            self.attempts[(e.step, e.attempt)] = False
        elif isinstance(e, CellTrained) and (e.step, e.attempt) in self.attempts:
            self.attempts[(e.step, e.attempt)] = True
        elif isinstance(e, AttemptEnded):
            self.attempts.pop((e.step, e.attempt), None)

    def update_phase(self, arriving: int | None) -> str | None:
        """The phase of the newest open update; ``arriving`` is the bucket a fault at
        after_bucket names (it strikes as that bucket arrives, before it is recorded)."""
        if not self.updates:
            return None
        update_id = max(self.updates)
        n, got = self.updates[update_id], self.arrived[update_id]
        if arriving is not None:
            return "stamping" if arriving >= n - 1 else _bucket_position(arriving, n)
        if len(got) >= n:
            return "stamping"
        if not got and update_id not in self.sessions:
            return "paused"
        return _bucket_position(len(got), n)

    def phase(self, fault: FaultInjected, arriving: int | None) -> str:
        if fault.point is FaultPoint.AFTER_BUCKET:
            return self.update_phase(arriving) or self.phase_now()
        if fault.point is FaultPoint.DURING_HEAL:
            return "healing"
        if fault.point is FaultPoint.BEFORE_ALLREDUCE:
            return "allreduce"
        return self.phase_now()

    def phase_now(self) -> str:
        """The most specific phase under way, from the state alone."""
        if self.heals:
            return "healing"
        update = self.update_phase(None)
        if update is not None:
            return update
        if any(self.attempts.values()):
            return "allreduce"
        return "training" if self.attempts else "generating"


def _bucket_position(bucket: int, n: int) -> str:
    if bucket == n - 1:
        return "bucket_last"
    return "bucket_first" if bucket == 0 else "bucket_middle"


def coverage_cells(
    history: Iterable[Event], buckets: Sequence[int | None] = ()
) -> list[CoverageCell]:
    """One cell per fault that struck, in history order. ``buckets[i]`` is the bucket
    that fault ``i`` of the scenario names (for after_bucket faults), when known."""
    state = _Open()
    cells = []
    for e in history:
        if isinstance(e, FaultInjected):
            arriving = buckets[e.index] if e.index < len(buckets) else None
            how = e.point.value if e.point is not None else AT_TIME
            cells.append(CoverageCell(e.fault.value, how, state.phase(e, arriving)))
        state.see(e)
    return cells


def phase_windows(history: Iterable[Event], phase: str) -> list[tuple[float, float]]:
    """The spans of time during which ``phase`` was the phase under way (from the state
    alone: what a fault at a time would have struck)."""
    state, windows = _Open(), []
    opened: float | None = None
    for e in history:
        state.see(e)
        now = state.phase_now() == phase
        if now and opened is None:
            opened = e.t
        elif not now and opened is not None:
            if e.t > opened:
                windows.append((opened, e.t))
            opened = None
    return windows


# -- the cells a fault can reach ----------------------------------------------------------------

_ANY = frozenset(PHASES)
"""What a time can land in: every phase that lasts. ``paused`` (pausing, flushing, opening
the update session) and ``stamping`` last as long as the engines' control calls take: in
the simulator the world's ``control_reply_seconds``, which the swarm draws (0 for some
seeds: then those windows close, and a map of only such runs leaves them empty)."""
_POINT_PHASES: dict[str, frozenset[str]] = {
    FaultPoint.BEFORE_ALLREDUCE.value: frozenset({"allreduce"}),
    FaultPoint.DURING_HEAL.value: frozenset({"healing"}),
    # bucket k < last arrives mid-update; the last one opens the window before the stamp
    FaultPoint.AFTER_BUCKET.value: frozenset({"bucket_first", "bucket_middle", "stamping"}),
    # a step begins once the update before it has ended and before its attempt (and any
    # heal, which an attempt begins) starts
    FaultPoint.STEP_BEGIN.value: frozenset({"generating"}),
    # halfway through a request: no request decodes from the moment the engines are paused
    # until they are resumed, so never while a bucket is on its way or the stamp is due
    # (the pause's own round trip is ``paused``, and requests decode through it)
    FaultPoint.MID_GENERATION.value: _ANY - set(_BUCKET_PHASES),
    # a save follows its step's update and comes before the next step: the engines generate
    # (or a sync of a restarted engine is under way)
    FaultPoint.DURING_SAVE.value: _ANY - {"training", "allreduce", "healing"},
}


def reachable(kind: str, how: str) -> frozenset[str]:
    """The phases a fault of ``kind`` scheduled as ``how`` can strike in, in the simulator:
    a point pins its phase down; a time and a recovery (a restart at any time makes one)
    can fall in any phase that lasts, mid-generation in any where requests decode."""
    del kind  # every kind reaches what its trigger reaches
    return _POINT_PHASES.get(how, _ANY)


__all__ = [
    "AT_TIME",
    "PHASES",
    "CoverageCell",
    "coverage_cells",
    "phase_windows",
    "reachable",
]
