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
- an aborted update does nothing more and publishes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miles_core.events import (
    BucketReceived,
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
from miles_core.oracles.base import ByType, Indexed, Violation, select

NAME = "update_order"


Process = tuple[str, int]


@dataclass
class _Update:
    began: Indexed
    mode: PauseMode
    paused: dict[Process, Indexed] = field(default_factory=dict)
    flushed: set[Process] = field(default_factory=set)
    opened: set[Process] = field(default_factory=set)
    closed: set[Process] = field(default_factory=set)
    received: dict[Process, set[int]] = field(default_factory=dict)
    stamped: dict[Process, Indexed] = field(default_factory=dict)
    published: Indexed | None = None
    aborted: Indexed | None = None
    plan: frozenset[str] = frozenset()
    """The engines of its transfer plan, as a set: a bucket to 256 engines asks 256 times."""
    all_buckets: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.plan = frozenset(self.event.engines)
        self.all_buckets = frozenset(range(self.event.n_buckets))

    @property
    def event(self) -> UpdateBegan:
        assert isinstance(self.began[1], UpdateBegan)
        return self.began[1]

    def stamped_engines(self) -> dict[str, int]:
        return {engine: inc for engine, inc in self.stamped}


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
        violation = _step(judge, update, seq, e)
        if violation is not None:
            return violation
    return None


def _step(judge: _Judge, update: _Update, seq: int, e: Event) -> Violation | None:
    """What is wrong with one event of an update, if anything; records it otherwise."""
    problem = judge(update, seq, e)
    if problem is None:
        return None
    began = update.event
    return Violation(
        NAME,
        f"update {began.update_id} (version {began.version}){problem}",
        (update.began, (seq, e)),
    )


def _paused(update: _Update, seq: int, e: EnginesPaused) -> str | None:
    for process in zip(e.engines, e.incarnations, strict=True):
        update.paused[process] = (seq, e)
    return None


def _processes(e: Any) -> list[Process]:
    return list(zip(e.engines, e.incarnations, strict=True))


def _flushed(update: _Update, seq: int, e: EnginesFlushed) -> str | None:
    if update.mode is PauseMode.IN_PLACE:
        return ": flushed the cache under in_place, whose frozen requests still hold their KV"
    for process in _processes(e):
        if process not in update.paused:
            return f": {process[0]} (process {process[1]}) was flushed before it was paused"
        update.flushed.add(process)
    return None


def _opened(update: _Update, seq: int, e: UpdateSessionOpened) -> str | None:
    for process in _processes(e):
        if process not in update.paused:
            return f": {process[0]} (process {process[1]}) opened its session unpaused"
        if update.mode is not PauseMode.IN_PLACE and process not in update.flushed:
            return (
                f": {process[0]} (process {process[1]}) opened its session before its cache "
                f"was flushed (pause mode {update.mode.value})"
            )
        update.opened.add(process)
    return None


def _closed(update: _Update, seq: int, e: UpdateSessionClosed) -> str | None:
    for process in _processes(e):
        if process not in update.stamped:
            return f": {process[0]} (process {process[1]}) closed its session unstamped"
        update.closed.add(process)
    return None


def _bucket(update: _Update, seq: int, e: BucketReceived) -> str | None:
    began = update.event
    if not 0 <= e.bucket < began.n_buckets or e.n_buckets != began.n_buckets:
        return (
            f": bucket {e.bucket} of {e.n_buckets} arrived, but the update has buckets "
            f"0..{began.n_buckets - 1}"
        )
    plan, paused, opened, received = update.plan, update.paused, update.opened, update.received
    for process in zip(e.engines, e.incarnations, strict=True):
        engine, inc = process
        if engine not in plan:
            return f": bucket {e.bucket} reached {engine}, not in its plan"
        if process not in paused:
            return (
                f": bucket {e.bucket} reached {engine} (process {inc}), which was not paused for "
                "this update"
            )
        if process not in opened:
            return (
                f": bucket {e.bucket} reached {engine} (process {inc}) outside an update "
                "session (/begin_weight_update)"
            )
        got = received.get(process)
        if got is None:
            received[process] = {e.bucket}
        else:
            got.add(e.bucket)
    return None


def _stamped(update: _Update, seq: int, e: EngineStamped) -> str | None:
    began = update.event
    process = (e.engine, e.incarnation)
    got = update.received.get(process, set())
    if e.engine not in update.plan or e.version != began.version:
        return f": {e.engine} was stamped {e.version}, which this update does not carry to it"
    if got != update.all_buckets:
        return (
            f": {e.engine} (process {e.incarnation}) was stamped after it received {len(got)} "
            f"of {began.n_buckets} buckets"
        )
    if process not in update.opened or process in update.closed:
        return f": {e.engine} (process {e.incarnation}) was stamped outside its update session"
    update.stamped[process] = (seq, e)
    return None


def _published(update: _Update, seq: int, e: VersionPublished) -> str | None:
    began = update.event
    if not began.publishes or e.version != began.version:
        return f" published version {e.version}"
    missing = sorted(set(began.engines) - set(update.stamped_engines()))
    if missing:
        got = max(
            (len(b) for (eng, _), b in update.received.items() if eng == missing[0]), default=0
        )
        return (
            f": version {e.version} was published before {missing[0]} (named in the transfer "
            f"plan) was stamped; it received {got} of {began.n_buckets} buckets"
        )
    unclosed = sorted(p for p in update.stamped if p not in update.closed)
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
    for engine, inc in zip(e.engines, e.incarnations, strict=True):
        if (engine, inc) not in update.stamped:
            return f": {engine} (process {inc}) resumed without being stamped by this update"
        if (engine, inc) not in update.closed:
            return f": {engine} (process {inc}) resumed before its update session closed"
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
    }
)
_JUDGED = tuple(_JUDGES)
