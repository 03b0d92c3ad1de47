"""A job killed whole leaves a joined history: its segments, and its committed timeline.

Each segment is one controller's run, from the start (or a resume) to its death (JobKilled)
or the run's end: a new job has new processes, numbered afresh, a fresh update and group
count, and its steps and versions go on from its save.

A driver hot restart (restart_driver: DriverRestarted, a JobKilled of the driver alone, and
DriverAdopted, a JobResumed) ends a segment too; its timeline is cut where the trainer held
the state the new driver adopted: at the VersionPublished of the adopted version.

The committed timeline is what the job kept: each segment up to the moment the save its
successor resumed from began (what that save holds was taken then), followed by that
successor; the lost tail of a segment (from that moment to its kill) is dropped with
everything the dead job did in it, and a resume from no save drops all before it. A
history without a kill is its own only segment and its own timeline.

It sits beside events.py, not among the oracles, because the control side reads it too:
the simulated job reports the versions its timeline kept, and a run with until_witnessed
waits on its last segment. The oracles judge with it (miles_core.oracles.joined).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from weakref import WeakKeyDictionary

from miles_core.event_index import Indexed, forget, select
from miles_core.events import (
    DriverAdopted,
    History,
    JobKilled,
    JobResumed,
    SaveBegan,
    VersionPublished,
)


@dataclass(frozen=True)
class Segment:
    index: int
    first: int
    """The position of its first event in the joined history."""
    stop: int
    """The position after its last event."""
    resumed: int | None
    """Where its JobResumed is (None: the job's first run)."""
    killed: int | None
    """Where its JobKilled is (None: the segment that ended the run, or goes on)."""

    def label(self, history: History) -> str:
        if self.killed is not None:
            return f"segment {self.index} of the job, killed at t={history[self.killed].t:g}"
        return f"segment {self.index} of the job, resumed at t={history[self.first].t:g}"


@dataclass(frozen=True)
class _Split:
    length: int
    segments: tuple[Segment, ...]
    parts: dict[int, History]
    timeline: tuple[History, list[int]] | None = None


_SPLITS: WeakKeyDictionary[History, _Split] = WeakKeyDictionary()


def killed(history: History) -> bool:
    """Whether the job was ever killed whole (the history has more than one segment)."""
    return bool(select(history, JobKilled))


def _split(history: History) -> _Split:
    cached = _SPLITS.get(history)
    if cached is not None and cached.length == len(history):
        return cached
    kills = [seq for seq, _ in select(history, JobKilled)]
    resumes = [seq for seq, _ in select(history, JobResumed)]
    bounds = [0, *(k + 1 for k in kills), len(history)]
    segments = []
    for i, (first, stop) in enumerate(pairwise(bounds)):
        if first >= stop and i:
            continue  # a kill as the last event: nothing after it yet
        resumed = next((r for r in resumes if first <= r < stop), None)
        end = kills[i] if i < len(kills) else None
        segments.append(Segment(len(segments), first, stop, resumed, end))
    split = _Split(len(history), tuple(segments), {})
    _SPLITS[history] = split
    return split


def segments(history: History) -> tuple[Segment, ...]:
    return _split(history).segments


def part(history: History, segment: Segment) -> History:
    """The segment's events, as a history of their own (positions from its start)."""
    split = _split(history)
    found = split.parts.get(segment.index)
    if found is None:
        found = split.parts[segment.index] = History(
            history[i] for i in range(segment.first, segment.stop)
        )
    return found


def last_segment(history: History) -> tuple[History, int]:
    """The last segment's history and where it begins (the whole history without a kill)."""
    if not killed(history):
        return history, 0
    segment = segments(history)[-1]
    return part(history, segment), segment.first


def _kept(history: History) -> list[tuple[int, int]]:
    """The committed timeline as ranges of positions [first, stop) of the joined history."""
    began: Sequence[Indexed] = select(history, SaveBegan)
    ranges: list[tuple[int, int]] = []
    for segment in segments(history):
        if segment.resumed is not None:
            resumed = history[segment.resumed]
            assert isinstance(resumed, JobResumed)
            if isinstance(resumed, DriverAdopted):  # a hot restart: cut where the state was held
                published = select(history, VersionPublished)
                ranges = _cut_at_publish(ranges, published, resumed.version, segment.resumed)
            else:
                ranges = _cut(ranges, began, resumed.save_step, segment.resumed)
        ranges.append((segment.first, segment.stop))
    return ranges


def _cut(
    ranges: list[tuple[int, int]], began: Sequence[Indexed], step: int | None, before: int
) -> list[tuple[int, int]]:
    """``ranges`` up to (and with) the latest SaveBegan of ``step`` they hold before
    ``before``: the moment the save resumed from was taken. None, or a save never begun
    in them: nothing is kept (a fresh start)."""
    if step is None:
        return []
    for seq, e in reversed(began):
        if seq < before and e.step == step:  # type: ignore[attr-defined]
            inside = [(a, b) for a, b in ranges if a <= seq < b]
            if inside:
                kept = [(a, b) for a, b in ranges if b <= inside[0][0]]
                return [*kept, (inside[0][0], seq + 1)]
    return []


def _cut_at_publish(
    ranges: list[tuple[int, int]], published: Sequence[Indexed], version: int | None, before: int
) -> list[tuple[int, int]]:
    """``ranges`` up to (and with) the VersionPublished of ``version`` they hold before
    ``before``: the trainer holds its state for a hot restart as each version is published
    (miles_core.loop.adopt). None, or not found: nothing is kept (the driver started over)."""
    if version is None:
        return []
    for seq, e in reversed(published):
        if seq < before and e.version == version:  # type: ignore[attr-defined]
            inside = [(a, b) for a, b in ranges if a <= seq < b]
            if inside:
                kept = [(a, b) for a, b in ranges if b <= inside[0][0]]
                return [*kept, (inside[0][0], seq + 1)]
    return []


def timeline(history: History) -> tuple[History, list[int]]:
    """The committed timeline as a history, and each of its events' position in the
    joined one. Without a kill, the history itself."""
    if not killed(history):
        return history, []
    split = _split(history)
    if split.timeline is None:
        seqs = [seq for a, b in _kept(history) for seq in range(a, b)]
        made = (History(history[seq] for seq in seqs), seqs)
        split = _Split(split.length, split.segments, split.parts, made)
        _SPLITS[history] = split
    assert split.timeline is not None
    return split.timeline


def committed_versions(history: History) -> list[int]:
    """The versions published in the committed timeline, in order."""
    kept, _ = timeline(history)
    return [e.version for _, e in select(kept, VersionPublished)]  # type: ignore[attr-defined]


def segment_at(history: History, seq: int) -> Segment:
    """The segment holding position ``seq``."""
    found = segments(history)
    return found[max(0, bisect_right([s.first for s in found], seq) - 1)]


def forget_segments(history: History) -> None:
    """Drop the segments and timeline kept for ``history`` (judging is over)."""
    split = _SPLITS.pop(history, None)
    if split is not None:
        for kept in (*split.parts.values(), *(split.timeline[:1] if split.timeline else ())):
            forget(kept)


__all__ = [
    "Segment",
    "committed_versions",
    "forget_segments",
    "killed",
    "last_segment",
    "part",
    "segment_at",
    "segments",
    "timeline",
]
