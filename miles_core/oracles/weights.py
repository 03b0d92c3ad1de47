"""published_weights: every sample came from weights that were published, whole and current.

Judged per engine process (an engine id and the incarnation every event of an
update and every sample names), for every completed sample: the version it
reports was published (not merely reserved or stamped); the process it came
from is not holding part of an update (a mix of two versions); a process that
started (or was outdated by a resumed checkpoint) after a version was published
has since been stamped; the version it reports is the one it was stamped with;
and once an update has completed, nothing is served from an older version. A
real world's weight checksums (WeightsChecked) must equal the trainer's.

A response that arrives while its process is paused was generated before the
pause (a paused engine generates nothing; EnginesPaused is recorded once the
engine answered), so it is judged by what the process held when it was paused:
on a real network it may arrive after the update's first bucket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from miles_core.events import (
    BucketReceived,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    EngineStarted,
    History,
    LedgerRestored,
    RunStarted,
    SampleGenerated,
    UpdateBegan,
    VersionPublished,
    WeightsChecked,
)
from miles_core.oracles.base import ByType, Indexed, Violation, evidence, select, version_number

NAME = "published_weights"


@dataclass
class _Held:
    """What one engine process holds."""

    version: int | None = None
    stamp: Indexed | None = None
    partial: Indexed | None = None
    """The first bucket of an update this process has not completed."""
    buckets: set[int] = field(default_factory=set)
    unsynced: Indexed | None = None
    """Why it must be stamped before it serves: a start (or a resume) after a publication."""
    at_pause: _Held | None = None
    """What it held when it was paused, until it resumes (responses arriving meanwhile were
    generated before the pause)."""


class _Judge:
    """The oracle's state over one history, with one handler per event class it reads."""

    def __init__(self) -> None:
        self.published: dict[int, Indexed] = {}
        self.updates: dict[int, Indexed] = {}
        self.completed: Indexed | None = None
        """The resume of the newest completed publishing update."""
        self.held: dict[tuple[str, int], _Held] = {}
        self.current: dict[str, int] = {}

    def of(self, engine: str, incarnation: int) -> _Held:
        key = (engine, incarnation)
        state = self.held.get(key)
        if state is None:
            state = self.held[key] = _Held()
        return state

    def sample(self, seq: int, e: SampleGenerated) -> Violation | None:
        if e.aborted:
            return None
        state = self.of(e.engine, e.incarnation)
        violation = _judge_sample(seq, e, state.at_pause or state, self.published)
        if violation is not None:
            return violation
        completed = self.completed
        if completed is None:
            return None
        newest = self.updates[completed[1].update_id][1].version  # type: ignore[attr-defined]
        if version_number(e.version) < newest:
            return Violation(
                NAME,
                f"engine {e.engine} served version {e.version} after the update to "
                f"{newest} completed",
                (completed, (seq, e)),
            )
        return None

    def began(self, seq: int, e: UpdateBegan) -> None:
        self.updates[e.update_id] = (seq, e)

    def publication(self, seq: int, e: VersionPublished | LedgerRestored) -> None:
        self.published[e.version] = (seq, e)
        if isinstance(e, LedgerRestored):  # every process holds initial weights
            for state in self.held.values():
                state.unsynced = state.unsynced or (seq, e)

    def run_started(self, seq: int, e: RunStarted) -> None:
        for engine in e.engines:
            self.of(engine, 0)

    def started(self, seq: int, e: EngineStarted) -> None:
        self.current[e.engine] = e.incarnation
        self.of(e.engine, e.incarnation).unsynced = (seq, e) if self.published else None

    def bucket(self, seq: int, e: BucketReceived) -> None:
        for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
            state = self.of(engine, incarnation)
            partial = state.partial
            if partial is None or partial[1].update_id != e.update_id:  # type: ignore[attr-defined]
                state.partial, state.buckets = (seq, e), set()
            state.buckets.add(e.bucket)

    def stamped(self, seq: int, e: EngineStamped) -> None:
        state = self.of(e.engine, e.incarnation)
        began = self.updates.get(e.update_id)
        complete = (
            state.partial is not None
            and state.partial[1].update_id == e.update_id  # type: ignore[attr-defined]
            and began is not None
            and state.buckets == set(range(began[1].n_buckets))  # type: ignore[attr-defined]
        )
        state.version, state.stamp = e.version, (seq, e)
        if complete:  # whole: the process now holds exactly this version
            state.partial, state.buckets, state.unsynced = None, set(), None

    def paused(self, seq: int, e: EnginesPaused) -> None:
        for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
            state = self.of(engine, incarnation)
            if state.at_pause is None:  # a second pause (a retried update) keeps the first
                state.at_pause = dataclasses.replace(state, buckets=set(state.buckets))

    def resumed(self, seq: int, e: EnginesResumed) -> None:
        for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
            self.of(engine, incarnation).at_pause = None
        began = self.updates.get(e.update_id)
        if began and began[1].publishes and began[1].version in self.published:  # type: ignore[attr-defined]
            self.completed = (seq, e)

    def checked(self, seq: int, e: WeightsChecked) -> Violation | None:
        if e.checksum == e.trainer_checksum:
            return None
        return Violation(
            NAME,
            f"engine {e.engine}'s weights at version {e.version} differ from the "
            f"trainer's (checksum {e.checksum} != {e.trainer_checksum})",
            evidence(self.of(e.engine, self.current.get(e.engine, 0)).stamp, (seq, e)),
        )


_HANDLERS: ByType[Callable[[_Judge, int, Any], Violation | None]] = ByType(
    {
        SampleGenerated: _Judge.sample,
        UpdateBegan: _Judge.began,
        VersionPublished: _Judge.publication,
        LedgerRestored: _Judge.publication,
        RunStarted: _Judge.run_started,
        EngineStarted: _Judge.started,
        BucketReceived: _Judge.bucket,
        EngineStamped: _Judge.stamped,
        EnginesPaused: _Judge.paused,
        EnginesResumed: _Judge.resumed,
        WeightsChecked: _Judge.checked,
    }
)
_READ = tuple(_HANDLERS)


def published_weights(history: History) -> Violation | None:
    judge, handlers = _Judge(), _HANDLERS
    for seq, e in select(history, *_READ):
        handler = handlers[type(e)]
        if handler is not None and (violation := handler(judge, seq, e)) is not None:
            return violation
    return None


def _judge_sample(
    seq: int, e: SampleGenerated, state: _Held, published: dict[int, Indexed]
) -> Violation | None:
    """What is wrong with the weights a completed sample came from, if anything."""
    unpublished = [v for v in e.all_versions if v is not None and v not in published]
    if unpublished:
        return Violation(
            NAME,
            f"engine {e.engine} generated tokens under version {unpublished[0]}, which was "
            "never published (or not yet)",
            evidence(state.stamp, (seq, e)),
        )
    if state.partial is not None:
        return Violation(
            NAME,
            f"engine {e.engine} generated while holding part of update "
            f"{state.partial[1].update_id} (a mix of two versions)",  # type: ignore[union-attr]
            (state.partial, (seq, e)),
        )
    if state.unsynced is not None:
        return Violation(
            NAME,
            f"engine {e.engine} (process {e.incarnation}) generated before it received the "
            "published weights",
            (state.unsynced, (seq, e)),
        )
    if e.version != state.version:
        return Violation(
            NAME,
            f"engine {e.engine} reported version {e.version} but was stamped {state.version}",
            evidence(state.stamp, (seq, e)),
        )
    return None
