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
on a real network it may arrive after the update's first bucket. One that
reports the version the process was stamped with since was generated after
the resume: EnginesResumed is recorded once every engine of the update has
answered, and a resumed engine's response can come first (seen on the CPU
backend under in_place), so it is judged by what the process holds now.

Today's miles gives up one engine whose update call outlives its deadline
(EngineGivenUp; rollout_cell_updater.py ``submit_client_call``, 3eacefd0): the
update goes on without it, so no pause fences that process, and a request it was
sent before the give-up may answer after the update completed. Such an answer is
not judged "older than the completed update" when it reports the version the
process was stamped with (published, whole: the checks above still apply), since
its staleness is then what it says; one sent after the give-up is (the errored
engine is out of rotation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from miles_core.event_index import Indexed, select
from miles_core.events import (
    BucketReceived,
    EngineGivenUp,
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
from miles_core.oracles.base import (
    ByType,
    Process,
    Violation,
    evidence,
    process_set,
    version_number,
)

NAME = "published_weights"


class _Held:
    """What one engine process holds."""

    __slots__ = ("at_pause", "partial", "since", "stamp", "unsynced", "version")

    def __init__(self) -> None:
        self.version: int | None = None
        self.stamp: Indexed | None = None
        self.partial: Indexed | None = None
        """The first bucket of an update this process has not completed."""
        self.since = 0
        """Where, in that update's arrivals, its part begins (the buckets it holds came
        from there on)."""
        self.unsynced: Indexed | None = None
        """Why it must be stamped before it serves: a start (or a resume) after a
        publication."""
        self.at_pause: _Held | None = None
        """What it held when it was paused, until it resumes (responses arriving meanwhile
        were generated before the pause)."""

    def copy(self) -> _Held:
        held = _Held()
        held.version, held.stamp, held.partial = self.version, self.stamp, self.partial
        held.since, held.unsynced = self.since, self.unsynced
        return held


class _Arrivals:
    """The buckets of one update, as they arrived: which processes each reached.

    A bucket to 256 engines is one entry, not 256 set insertions; whether a process
    holds the whole update is asked of the processes that got every bucket since
    their part began, worked out once per starting point with C set operations.
    """

    def __init__(self) -> None:
        self.log: list[tuple[int, frozenset[Process]]] = []
        self.holding: set[Process] = set()
        """The processes whose unfinished part is of this update."""
        self._whole: dict[tuple[int, int], tuple[int, set[Process]]] = {}

    def whole(self, since: int, n_buckets: int) -> set[Process]:
        """The processes that got exactly buckets 0..n_buckets-1 from ``since`` on."""
        key = (since, n_buckets)
        known = self._whole.get(key)
        if known is None or known[0] != len(self.log):
            known = self._whole[key] = (len(self.log), _whole(self.log[since:], n_buckets))
        return known[1]


def _whole(log: list[tuple[int, frozenset[Process]]], n_buckets: int) -> set[Process]:
    """The processes that every bucket in 0..n_buckets-1 reached and no other bucket did."""
    reached: dict[int, set[Process]] = {}
    for bucket, processes in log:
        reached.setdefault(bucket, set()).update(processes)
    if not n_buckets:  # a part always holds the bucket that began it
        return set()
    whole = set.intersection(*(reached.get(b, set()) for b in range(n_buckets)))
    for bucket, processes in reached.items():
        if not 0 <= bucket < n_buckets:
            whole -= processes
    return whole


class _Judge:
    """The oracle's state over one history, with one handler per event class it reads."""

    def __init__(self) -> None:
        self.published: dict[int, Indexed] = {}
        self.updates: dict[int, Indexed] = {}
        self.completed: Indexed | None = None
        """The resume of the newest completed publishing update."""
        self.newest: int = 0
        """The version that update published."""
        self.held: dict[Process, _Held] = {}
        self.current: dict[str, int] = {}
        self.arrivals: dict[int, _Arrivals] = {}
        self.given_up: dict[Process, float] = {}
        """When an update gave up each process (today's miles), the first time."""

    def of(self, engine: str, incarnation: int) -> _Held:
        key = (engine, incarnation)
        state = self.held.get(key)
        if state is None:
            state = self.held[key] = _Held()
        return state

    def sample(self, seq: int, e: SampleGenerated) -> Violation | None:
        if e.aborted:
            return None
        state = self.held.get((e.engine, e.incarnation)) or self.of(e.engine, e.incarnation)
        held = state.at_pause
        version, versions = e.version, e.versions
        if held is None or version == state.version != held.version:
            held = state  # not paused, or generated after a resume not yet recorded
        if not (  # what _judge_sample finds nothing in (most samples: asked before the call)
            held.partial is None
            and held.unsynced is None
            and version == held.version
            and (not versions or (len(versions) == 1 and versions[0] == version))
            and (version is None or version in self.published)
        ):
            violation = _judge_sample(seq, e, held, self.published)
            if violation is not None:
                return violation
        if self.completed is None:
            return None
        if version_number(version) < self.newest and not self._unfenced(e, state):
            return Violation(
                NAME,
                f"engine {e.engine} served version {e.version} after the update to "
                f"{self.newest} completed",
                (self.completed, (seq, e)),
            )
        return None

    def _unfenced(self, e: SampleGenerated, state: _Held) -> bool:
        """Whether the sample was sent, before any update gave its process up, to a process
        no pause fenced since, and reports the version that process was stamped with."""
        given_up = self.given_up.get((e.engine, e.incarnation))
        return given_up is not None and e.sent <= given_up and e.version == state.version

    def gave_up(self, seq: int, e: EngineGivenUp) -> None:
        self.given_up.setdefault((e.engine, e.incarnation), e.t)

    def began(self, seq: int, e: UpdateBegan) -> None:
        self.updates[e.update_id] = (seq, e)
        self._newest()

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
        """A process not yet holding part of this update begins one here; the others add
        the bucket to theirs (recorded once, for all of them, in the update's arrivals)."""
        processes = process_set(e.engines, e.incarnations)
        arrivals = self.arrivals.get(e.update_id)
        if arrivals is None:
            arrivals = self.arrivals[e.update_id] = _Arrivals()
        for process in processes - arrivals.holding:
            state = self.of(*process)
            if state.partial is not None:
                self.arrivals[state.partial[1].update_id].holding.discard(process)  # type: ignore[attr-defined]
            state.partial, state.since = (seq, e), len(arrivals.log)
        arrivals.holding |= processes
        arrivals.log.append((e.bucket, processes))

    def stamped(self, seq: int, e: EngineStamped) -> None:
        process = (e.engine, e.incarnation)
        state = self.held.get(process) or self.of(*process)
        state.version, state.stamp = e.version, (seq, e)
        partial, began = state.partial, self.updates.get(e.update_id)
        if partial is None or partial[1].update_id != e.update_id or began is None:  # type: ignore[attr-defined]
            return
        arrivals = self.arrivals[e.update_id]
        if process in arrivals.whole(state.since, began[1].n_buckets):  # type: ignore[attr-defined]
            arrivals.holding.discard(process)  # whole: it now holds exactly this version
            state.partial, state.unsynced = None, None

    def paused(self, seq: int, e: EnginesPaused) -> None:
        for process in process_set(e.engines, e.incarnations):
            state = self.held.get(process) or self.of(*process)
            if state.at_pause is None:  # a second pause (a retried update) keeps the first
                state.at_pause = state.copy()

    def resumed(self, seq: int, e: EnginesResumed) -> None:
        for process in process_set(e.engines, e.incarnations):
            (self.held.get(process) or self.of(*process)).at_pause = None
        began = self.updates.get(e.update_id)
        if began and began[1].publishes and began[1].version in self.published:  # type: ignore[attr-defined]
            self.completed = (seq, e)
            self._newest()

    def _newest(self) -> None:
        """The version the newest completed update published, as its UpdateBegan says now."""
        if self.completed is not None:
            self.newest = self.updates[self.completed[1].update_id][1].version  # type: ignore[attr-defined]

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
        EngineGivenUp: _Judge.gave_up,
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
    for version in e.all_versions:
        if version is not None and version not in published:
            return Violation(
                NAME,
                f"engine {e.engine} generated tokens under version {version}, which was "
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
