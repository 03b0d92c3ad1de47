"""end_state: the run ended the way its scenario says it must, and then stopped.

A scenario expects a completed run (the default) or a failure with a named
miles_core error (``expect = { status = "failed", error = "NoAliveCellError" }``).
Any other ending is a violation carrying the exception's type, message and
traceback: a crash (an exception the control plane does not raise on purpose),
a stall, an unexpected error such as RetriesExhaustedError, or a run that
completed when it should have failed. A history with no RunEnded was cut off,
and an event after RunEnded means some part of a world kept acting on a run
that was over. A run interrupted from outside (Ctrl-C) has no ending of its own
to judge: only those two checks apply to it.
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import History, RunEnded, RunStarted
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Violation

NAME = "end_state"


def _expected(started: Indexed | None) -> tuple[RunStatus, str | None]:
    if started is None:
        return RunStatus.COMPLETED, None
    event = started[1]
    assert isinstance(event, RunStarted)
    return event.expected_status, event.expected_error


def _describe(status: RunStatus, error: str | None) -> str:
    return "complete" if status is RunStatus.COMPLETED else f"fail with {error}"


def end_state(history: History) -> Violation | None:
    started: Indexed | None = None
    ended: Indexed | None = None
    for seq, e in select(history, RunStarted, RunEnded):
        if isinstance(e, RunStarted) and started is None:
            started = (seq, e)
        elif isinstance(e, RunEnded):
            ended = (seq, e)
            break
    if ended is not None and ended[0] + 1 < len(history):
        after = ended[0] + 1
        return Violation(
            NAME,
            f"{history[after].type_name} was recorded after the run ended: some part of the "
            "world kept acting on a finished run",
            (ended, (after, history[after])),
        )
    if ended is None:
        if not len(history):
            return None
        return Violation(NAME, "the run never recorded its end (it was cut off)", ())
    end = ended[1]
    assert isinstance(end, RunEnded)
    status, error = _expected(started)
    evidence = tuple(x for x in (started, ended) if x is not None)
    trace = f"\n{end.traceback}" if end.traceback else ""
    if end.status is RunStatus.INTERRUPTED:
        return None  # stopped from outside: how it would have ended is unknown, not wrong
    if end.status is RunStatus.CRASHED:
        return Violation(NAME, f"the run crashed: {end.reason}{trace}", evidence)
    if end.status is RunStatus.STALLED:
        return Violation(NAME, f"the run stalled: {end.reason}{trace}", evidence)
    if end.status is status and (error is None or end.error == error):
        return None
    got = "completed" if end.status is RunStatus.COMPLETED else f"failed with {end.reason}"
    return Violation(
        NAME,
        f"the run {got}, but the scenario expects it to {_describe(status, error)}{trace}",
        evidence,
    )
