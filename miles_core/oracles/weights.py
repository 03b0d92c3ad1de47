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
from dataclasses import dataclass, field

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
from miles_core.oracles.base import Indexed, Violation, evidence, version_number

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


def published_weights(history: History) -> Violation | None:
    published: dict[int, Indexed] = {}
    updates: dict[int, Indexed] = {}
    completed: Indexed | None = None  # the resume of the newest completed publishing update
    held: dict[tuple[str, int], _Held] = {}
    current: dict[str, int] = {}

    def of(engine: str, incarnation: int) -> _Held:
        key = (engine, incarnation)
        if key not in held:
            held[key] = _Held()
        return held[key]

    for seq, e in history.indexed():
        if isinstance(e, SampleGenerated):  # the commonest event: tested first
            if e.aborted:
                continue
            state = of(e.engine, e.incarnation)
            violation = _judge_sample(seq, e, state.at_pause or state, published)
            if violation is not None:
                return violation
            if completed is not None:
                newest = updates[completed[1].update_id][1].version  # type: ignore[union-attr]
                if version_number(e.version) < newest:
                    return Violation(
                        NAME,
                        f"engine {e.engine} served version {e.version} after the update to "
                        f"{newest} completed",
                        (completed, (seq, e)),
                    )
        elif isinstance(e, UpdateBegan):
            updates[e.update_id] = (seq, e)
        elif isinstance(e, VersionPublished | LedgerRestored):
            published[e.version] = (seq, e)
            if isinstance(e, LedgerRestored):  # every process holds initial weights
                for state in held.values():
                    state.unsynced = state.unsynced or (seq, e)
        elif isinstance(e, RunStarted):
            for engine in e.engines:
                of(engine, 0)
        elif isinstance(e, EngineStarted):
            current[e.engine] = e.incarnation
            of(e.engine, e.incarnation).unsynced = (seq, e) if published else None
        elif isinstance(e, BucketReceived):
            for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
                state = of(engine, incarnation)
                if state.partial is None or state.partial[1].update_id != e.update_id:  # type: ignore[union-attr]
                    state.partial, state.buckets = (seq, e), set()
                state.buckets.add(e.bucket)
        elif isinstance(e, EngineStamped):
            state = of(e.engine, e.incarnation)
            began = updates.get(e.update_id)
            complete = (
                state.partial is not None
                and state.partial[1].update_id == e.update_id  # type: ignore[union-attr]
                and began is not None
                and state.buckets == set(range(began[1].n_buckets))  # type: ignore[union-attr]
            )
            state.version, state.stamp = e.version, (seq, e)
            if complete:  # whole: the process now holds exactly this version
                state.partial, state.buckets, state.unsynced = None, set(), None
        elif isinstance(e, EnginesPaused):
            for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
                state = of(engine, incarnation)
                if state.at_pause is None:  # a second pause (a retried update) keeps the first
                    state.at_pause = dataclasses.replace(state, buckets=set(state.buckets))
        elif isinstance(e, EnginesResumed):
            for engine, incarnation in zip(e.engines, e.incarnations, strict=True):
                of(engine, incarnation).at_pause = None
            began = updates.get(e.update_id)
            if began and began[1].publishes and began[1].version in published:  # type: ignore[union-attr]
                completed = (seq, e)
        elif isinstance(e, WeightsChecked) and e.checksum != e.trainer_checksum:
            return Violation(
                NAME,
                f"engine {e.engine}'s weights at version {e.version} differ from the "
                f"trainer's (checksum {e.checksum} != {e.trainer_checksum})",
                evidence(of(e.engine, current.get(e.engine, 0)).stamp, (seq, e)),
            )
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
