"""progress: after the last fault, steps keep committing and engines catch up.

No span longer than the window passes without a step commit (from the last
fault, or the start, to the end of the history), and every live engine reaches
the newest published version within the window of its publication (or of
coming back). Only spans the run actually lasted are judged; how a run that
did not complete ended is end_state's verdict.
"""

from __future__ import annotations

import itertools

from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.event_index import Indexed, select
from miles_core.events import (
    EngineStamped,
    EngineStateChanged,
    Event,
    FaultInjected,
    History,
    RunEnded,
    RunStarted,
    StepCommitted,
    VersionPublished,
)
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Violation
from miles_core.segments import killed, last_segment

NAME = "progress"


def progress(history: History, window: float) -> Violation | None:
    """After the last fault, no span longer than ``window`` passes without a step
    commit (until the end of the history), and every live engine reaches the newest
    published version within ``window`` of its publication."""
    if window <= 0:
        raise ConfigError("progress_window", f"got {window!r}", "pass seconds > 0")
    if not len(history):
        return None
    # one pass picks out the few events this oracle reads
    started: Indexed | None = None
    ended: Indexed | None = None
    last_fault: Indexed | None = None
    all_commits: list[Indexed] = []
    publications: list[Indexed] = []
    engine_events: list[Event] = []  # events, not pairs: a stamp per engine per update
    followed = (StepCommitted, EngineStateChanged, EngineStamped, VersionPublished, FaultInjected)
    for seq, e in select(history, *followed, RunStarted, RunEnded):
        if isinstance(e, StepCommitted):
            all_commits.append((seq, e))
        elif isinstance(e, EngineStateChanged | EngineStamped):
            engine_events.append(e)
        elif isinstance(e, VersionPublished):
            publications.append((seq, e))
        elif isinstance(e, FaultInjected):
            last_fault = (seq, e)
        elif isinstance(e, RunStarted):
            started = started or (seq, e)
        elif isinstance(e, RunEnded):
            ended = ended or (seq, e)
    if ended is not None and ended[1].status is not RunStatus.COMPLETED:  # type: ignore[union-attr]
        return None  # end_state judges how a run that did not complete ended
    last: Indexed = (len(history) - 1, history[-1])
    since: Indexed = last_fault or (0, history[0])
    commits = [(s, e) for s, e in all_commits if e.t > since[1].t]
    marks = [since, *commits, last]
    for before, after in itertools.pairwise(marks):
        if after[1].t - before[1].t > window:
            what = "the last fault" if before is last_fault else "the start"
            if isinstance(before[1], StepCommitted):
                what = f"step {before[1].step} committed"
            return Violation(
                NAME,
                f"no step committed for {after[1].t - before[1].t:g}s (> window {window:g}s) "
                f"after {what} at t={before[1].t:g}",
                (before, after),
            )
    if killed(history):  # engines catch up within the last run of a job killed whole
        tail, offset = last_segment(history)
        return _moved(_caught_up(tail, window), offset)
    return _caught_up_from(started, publications, engine_events, last, window)


def _caught_up(history: History, window: float) -> Violation | None:
    """The engine part alone, on ``history`` (a killed job's last segment)."""
    started: Indexed | None = None
    publications: list[Indexed] = []
    engine_events: list[Event] = []
    for seq, e in select(history, EngineStateChanged, EngineStamped, VersionPublished, RunStarted):
        if isinstance(e, VersionPublished):
            publications.append((seq, e))
        elif isinstance(e, RunStarted):
            started = started or (seq, e)
        else:
            engine_events.append(e)
    last: Indexed = (len(history) - 1, history[-1])
    return _caught_up_from(started, publications, engine_events, last, window)


def _moved(violation: Violation | None, offset: int) -> Violation | None:
    if violation is None or not offset:
        return violation
    evidence = tuple((seq + offset, e) for seq, e in violation.evidence)
    return Violation(violation.oracle, violation.message, evidence)


def _caught_up_from(
    started: Indexed | None,
    publications: list[Indexed],
    engine_events: list[Event],
    last: Indexed,
    window: float,
) -> Violation | None:
    """Every live engine reached the newest published version within ``window``."""
    if not publications:
        return None
    end_t = last[1].t
    newest = publications[-1]
    live: dict[str, float] = {}
    stamped: dict[str, float] = {}
    if started:
        live = {eng: started[1].t for eng in started[1].engines}
    for e in engine_events:
        if isinstance(e, EngineStateChanged):
            if e.new is EngineState.DOWN:
                live.pop(e.engine, None)
                stamped.pop(e.engine, None)
            elif e.new is EngineState.UNSYNCED:  # a new process: it must catch up from now
                live[e.engine] = e.t
                stamped.pop(e.engine, None)
        elif e.version == newest[1].version:  # type: ignore[union-attr]
            stamped[e.engine] = e.t
    for eng, up_since in sorted(live.items()):
        due = max(newest[1].t, up_since) + window
        if eng not in stamped and end_t > due:
            return Violation(
                NAME,
                f"live engine {eng} did not reach version {newest[1].version} within {window}s",
                (newest, last),
            )
    return None
