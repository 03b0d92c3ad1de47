"""update_order: each weight update ran miles' sequence, for every engine process it names.

For each update (and each sync of restarted engines), per engine of its
transfer plan and per process behind that engine (every event of an update
names the process, its incarnation, that answered):

- its buckets arrived only while it was paused for this update;
- it was stamped with the update's version only after every bucket of the
  update had arrived at that same process (a process restarted anywhere in the
  update holds none of them);
- the version was published only after every engine of the plan was stamped,
  so every engine named in a transfer plan received every bucket;
- the engines resumed only after the publish (for a publishing update), and
  only engines stamped by this update;
- an aborted update does nothing more and publishes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miles_core.events import (
    BucketReceived,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    Event,
    History,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.oracles.base import Indexed, Violation

NAME = "update_order"


Process = tuple[str, int]


@dataclass
class _Update:
    began: Indexed
    paused: dict[Process, Indexed] = field(default_factory=dict)
    received: dict[Process, set[int]] = field(default_factory=dict)
    stamped: dict[Process, Indexed] = field(default_factory=dict)
    published: Indexed | None = None
    aborted: Indexed | None = None

    @property
    def event(self) -> UpdateBegan:
        assert isinstance(self.began[1], UpdateBegan)
        return self.began[1]

    def stamped_engines(self) -> dict[str, int]:
        return {engine: inc for engine, inc in self.stamped}


_STEPS = (EnginesPaused, BucketReceived, EngineStamped, VersionPublished, EnginesResumed)


def update_order(history: History) -> Violation | None:
    updates: dict[int, _Update] = {}
    for seq, e in history.indexed():
        if isinstance(e, UpdateBegan):
            updates[e.update_id] = _Update((seq, e))
            continue
        if not isinstance(e, (*_STEPS, UpdateAborted)):
            continue
        update = updates.get(e.update_id)  # type: ignore[union-attr]
        if update is None:
            return Violation(NAME, f"{e.type_name} for an update that never began", ((seq, e),))
        if update.aborted is not None:
            return Violation(
                NAME,
                f"update {e.update_id} recorded {e.type_name} after it was aborted",  # type: ignore[union-attr]
                (update.aborted, (seq, e)),
            )
        violation = _step(update, seq, e)
        if violation is not None:
            return violation
    return None


def _step(update: _Update, seq: int, e: Event) -> Violation | None:
    """What is wrong with one event of an update, if anything; records it otherwise."""
    problem = _JUDGES[type(e)](update, seq, e)
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


def _bucket(update: _Update, seq: int, e: BucketReceived) -> str | None:
    began = update.event
    if not 0 <= e.bucket < began.n_buckets or e.n_buckets != began.n_buckets:
        return (
            f": bucket {e.bucket} of {e.n_buckets} arrived, but the update has buckets "
            f"0..{began.n_buckets - 1}"
        )
    for engine, inc in zip(e.engines, e.incarnations, strict=True):
        if engine not in began.engines:
            return f": bucket {e.bucket} reached {engine}, not in its plan"
        if (engine, inc) not in update.paused:
            return (
                f": bucket {e.bucket} reached {engine} (process {inc}), which was not paused for "
                "this update"
            )
        update.received.setdefault((engine, inc), set()).add(e.bucket)
    return None


def _stamped(update: _Update, seq: int, e: EngineStamped) -> str | None:
    began = update.event
    process = (e.engine, e.incarnation)
    got = update.received.get(process, set())
    if e.engine not in began.engines or e.version != began.version:
        return f": {e.engine} was stamped {e.version}, which this update does not carry to it"
    if got != set(range(began.n_buckets)):
        return (
            f": {e.engine} (process {e.incarnation}) was stamped after it received {len(got)} "
            f"of {began.n_buckets} buckets"
        )
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
    return None


def _aborted(update: _Update, seq: int, e: UpdateAborted) -> str | None:
    if update.published is not None:
        return f" was aborted after it published version {update.event.version}"
    update.aborted = (seq, e)
    return None


_JUDGES: dict[type[Event], Callable[[_Update, int, Any], str | None]] = {
    EnginesPaused: _paused,
    BucketReceived: _bucket,
    EngineStamped: _stamped,
    VersionPublished: _published,
    EnginesResumed: _resumed,
    UpdateAborted: _aborted,
}
