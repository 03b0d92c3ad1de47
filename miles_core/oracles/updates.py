"""update_order: each weight update ran miles' sequence, for every engine process it names.

For each update (and each sync of restarted engines), per engine of its
transfer plan and per process behind that engine (every event of an update
names the process, its incarnation, that answered):

- it was paused, then its cache flushed (unless in_place, whose frozen
  requests still hold their KV), then its update session opened;
- its buckets arrived only inside that session;
- it was stamped with the update's version only after every bucket of the
  update had arrived at that same process (a process restarted anywhere in the
  update holds none of them), then its session closed;
- the version was published only after every engine of the plan was stamped,
  so every engine named in a transfer plan received every bucket;
- the engines resumed only after the publish (for a publishing update), and
  only engines stamped by this update whose session closed;
- an aborted update does nothing more and publishes nothing;
- an engine the update gave up (EngineGivenUp, the today profile's per-cell isolation) is
  left out of what its publish waits for (its stamp, its session's close): it gets nothing
  more from the update (a later event naming that process in the update is judged as any
  other).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miles_core.event_index import Indexed, select
from miles_core.events import (
    BucketReceived,
    EngineGivenUp,
    EnginesFlushed,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    Event,
    History,
    RunStarted,
    UpdateAborted,
    UpdateBegan,
    UpdateSessionClosed,
    UpdateSessionOpened,
    VersionPublished,
)
from miles_core.kinds import PauseMode
from miles_core.oracles.base import ByType, Process, Violation, process_set

NAME = "update_order"


@dataclass
class _Update:
    began: Indexed
    mode: PauseMode
    paused: set[Process] = field(default_factory=set)
    flushed: set[Process] = field(default_factory=set)
    opened: set[Process] = field(default_factory=set)
    closed: set[Process] = field(default_factory=set)
    arrived: dict[int, set[Process]] = field(default_factory=dict)
    """The processes each bucket reached: a bucket to 256 engines is one set update."""
    stamped: set[Process] = field(default_factory=set)
    published: Indexed | None = None
    aborted: Indexed | None = None
    plan: frozenset[str] = frozenset()
    """The engines of its transfer plan, as a set: a bucket to 256 engines asks 256 times."""
    given_up: set[str] = field(default_factory=set)
    """The engines of the plan the update gave up (EngineGivenUp): its publish needs no stamp
    of theirs, nor their session closed."""
    event: UpdateBegan = field(init=False)
    _whole: set[Process] | None = None
    """The processes that received every bucket (None: a bucket arrived since it was
    computed)."""

    def __post_init__(self) -> None:
        assert isinstance(self.began[1], UpdateBegan)
        self.event = self.began[1]
        self.plan = frozenset(self.event.engines)

    def receive(self, bucket: int, processes: frozenset[Process]) -> None:
        self.arrived.setdefault(bucket, set()).update(processes)
        self._whole = None

    def received(self, process: Process) -> int:
        """How many of the update's buckets reached the process."""
        return sum(process in reached for reached in self.arrived.values())

    def has_every_bucket(self, process: Process) -> bool:
        """Whether every bucket of the update reached the process (only valid buckets are
        recorded, so having as many as the update has is having all of them)."""
        n = self.event.n_buckets
        if self._whole is None:
            reached = [self.arrived.get(b, set()) for b in range(n)]
            self._whole = set.intersection(*reached) if n else set()
        return not n or process in self._whole


def update_order(history: History) -> Violation | None:
    updates: dict[int, _Update] = {}
    mode = PauseMode.RETRACT
    judges = _JUDGES
    for seq, e in select(history, *_JUDGED, RunStarted, UpdateBegan):
        judge = judges[type(e)]
        if judge is None:
            if isinstance(e, RunStarted):
                mode = e.pause_mode
            elif isinstance(e, UpdateBegan):
                updates[e.update_id] = _Update((seq, e), mode)
            continue
        update = updates.get(e.update_id)  # type: ignore[attr-defined]
        if update is None:
            return Violation(NAME, f"{e.type_name} for an update that never began", ((seq, e),))
        if update.aborted is not None:
            return Violation(
                NAME,
                f"update {e.update_id} recorded {e.type_name} after it was aborted",  # type: ignore[attr-defined]
                (update.aborted, (seq, e)),
            )
        problem = judge(update, seq, e)  # what is wrong with it, if anything; recorded if not
        if problem is not None:
            return _violation(update, problem, seq, e)
    return None


def _violation(update: _Update, problem: str, seq: int, e: Event) -> Violation:
    began = update.event
    return Violation(
        NAME,
        f"update {began.update_id} (version {began.version}){problem}",
        (update.began, (seq, e)),
    )


def _processes(e: Any) -> frozenset[Process]:
    """The processes an event names, as a set: each judge first checks them all at once
    and walks them in order only to name the first that is wrong."""
    return process_set(e.engines, e.incarnations)


def _paused(update: _Update, seq: int, e: EnginesPaused) -> str | None:
    update.paused |= _processes(e)
    return None


def _flushed(update: _Update, seq: int, e: EnginesFlushed) -> str | None:
    if update.mode is PauseMode.IN_PLACE:
        return ": flushed the cache under in_place, whose frozen requests still hold their KV"
    processes = _processes(e)
    if processes <= update.paused:
        update.flushed |= processes
        return None
    engine, inc = next(
        p for p in zip(e.engines, e.incarnations, strict=True) if p not in update.paused
    )
    return f": {engine} (process {inc}) was flushed before it was paused"


def _opened(update: _Update, seq: int, e: UpdateSessionOpened) -> str | None:
    processes = _processes(e)
    flushed = update.mode is PauseMode.IN_PLACE or processes <= update.flushed
    if processes <= update.paused and flushed:
        update.opened |= processes
        return None
    for process in zip(e.engines, e.incarnations, strict=True):
        if process not in update.paused:
            return f": {process[0]} (process {process[1]}) opened its session unpaused"
        if update.mode is not PauseMode.IN_PLACE and process not in update.flushed:
            return (
                f": {process[0]} (process {process[1]}) opened its session before its cache "
                f"was flushed (pause mode {update.mode.value})"
            )
    raise AssertionError("a process was unpaused or unflushed")


def _closed(update: _Update, seq: int, e: UpdateSessionClosed) -> str | None:
    processes = _processes(e)
    if processes <= update.stamped:
        update.closed |= processes
        return None
    engine, inc = next(
        p for p in zip(e.engines, e.incarnations, strict=True) if p not in update.stamped
    )
    return f": {engine} (process {inc}) closed its session unstamped"


def _bucket(update: _Update, seq: int, e: BucketReceived) -> str | None:
    began = update.event
    if not 0 <= e.bucket < began.n_buckets or e.n_buckets != began.n_buckets:
        return (
            f": bucket {e.bucket} of {e.n_buckets} arrived, but the update has buckets "
            f"0..{began.n_buckets - 1}"
        )
    processes = _processes(e)
    if (
        update.plan.issuperset(e.engines)
        and processes <= update.paused
        and processes <= update.opened
    ):
        update.receive(e.bucket, processes)
        return None
    return _misdelivered(update, e)


def _misdelivered(update: _Update, e: BucketReceived) -> str:
    """The first process, in the event's order, that a bucket should not have reached."""
    for engine, inc in zip(e.engines, e.incarnations, strict=True):
        if engine not in update.plan:
            return f": bucket {e.bucket} reached {engine}, not in its plan"
        if (engine, inc) not in update.paused:
            return (
                f": bucket {e.bucket} reached {engine} (process {inc}), which was not paused for "
                "this update"
            )
        if (engine, inc) not in update.opened:
            return (
                f": bucket {e.bucket} reached {engine} (process {inc}) outside an update "
                "session (/begin_weight_update)"
            )
    raise AssertionError("every process was ready for the bucket")


def _stamped(update: _Update, seq: int, e: EngineStamped) -> str | None:
    began = update.event
    process = (e.engine, e.incarnation)
    if e.engine not in update.plan or e.version != began.version:
        return f": {e.engine} was stamped {e.version}, which this update does not carry to it"
    if not update.has_every_bucket(process):
        return (
            f": {e.engine} (process {e.incarnation}) was stamped after it received "
            f"{update.received(process)} of {began.n_buckets} buckets"
        )
    if process not in update.opened or process in update.closed:
        return f": {e.engine} (process {e.incarnation}) was stamped outside its update session"
    update.stamped.add(process)
    return None


def _published(update: _Update, seq: int, e: VersionPublished) -> str | None:
    began = update.event
    if not began.publishes or e.version != began.version:
        return f" published version {e.version}"
    stamped = {engine for engine, _ in update.stamped}
    missing = sorted(set(began.engines) - stamped - update.given_up)
    if missing:
        reached = set().union(*update.arrived.values())
        got = max((update.received(p) for p in reached if p[0] == missing[0]), default=0)
        return (
            f": version {e.version} was published before {missing[0]} (named in the transfer "
            f"plan) was stamped; it received {got} of {began.n_buckets} buckets"
        )
    # a process given up after its stamp (end_update failed or outlived its deadline, or the
    # process was replaced) gets no further call, so its session never closes: it is out of
    # rotation and the router, as miles' errored cell (cell_session.py _call, 2209c9c0)
    unclosed = sorted(p for p in update.stamped - update.closed if p[0] not in update.given_up)
    if unclosed:
        return f": version {e.version} was published before {unclosed[0][0]}'s session closed"
    update.published = (seq, e)
    return None


def _resumed(update: _Update, seq: int, e: EnginesResumed) -> str | None:
    began = update.event
    if began.publishes and update.published is None:
        return (
            f": engines {list(e.engines)} resumed before version {began.version} was published "
            "(they may serve it while the rollout side believes an older one)"
        )
    processes = _processes(e)
    if processes <= update.stamped and processes <= update.closed:
        return None
    for engine, inc in zip(e.engines, e.incarnations, strict=True):
        if (engine, inc) not in update.stamped:
            return f": {engine} (process {inc}) resumed without being stamped by this update"
        if (engine, inc) not in update.closed:
            return f": {engine} (process {inc}) resumed before its update session closed"
    raise AssertionError("every process was stamped and closed")


def _given_up(update: _Update, seq: int, e: EngineGivenUp) -> str | None:
    if e.engine not in update.plan:
        return f": gave up {e.engine}, not in its plan"
    update.given_up.add(e.engine)
    return None


def _aborted(update: _Update, seq: int, e: UpdateAborted) -> str | None:
    if update.published is not None:
        return f" was aborted after it published version {update.event.version}"
    update.aborted = (seq, e)
    return None


_Judge = Callable[[_Update, int, Any], str | None]

_JUDGES: ByType[_Judge] = ByType(
    {
        EnginesPaused: _paused,
        EnginesFlushed: _flushed,
        UpdateSessionOpened: _opened,
        UpdateSessionClosed: _closed,
        BucketReceived: _bucket,
        EngineStamped: _stamped,
        VersionPublished: _published,
        EnginesResumed: _resumed,
        UpdateAborted: _aborted,
        EngineGivenUp: _given_up,
    }
)
_JUDGED = tuple(_JUDGES)
