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

A joined history (a job whose processes all died, then resumed from a save) is judged run
by run: each controller's run that ended by itself before the resume (a save, then a
``--load`` that goes on) is held to its own ending, with nothing after it but the join's
JobKilled; one killed before it ended has none to judge; the last must end as above.
"""

from __future__ import annotations

from collections.abc import Sequence

from miles_core.event_index import Indexed, select
from miles_core.events import History, RunEnded, RunStarted
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Violation
from miles_core.segments import killed, segments

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
    marks = select(history, RunStarted, RunEnded)
    job_started = next(((seq, e) for seq, e in marks if isinstance(e, RunStarted)), None)
    for first, stop, last in _runs(history):
        inside = [(seq, e) for seq, e in marks if first <= seq < stop]
        violation = _run_ended(history, inside, stop, last, job_started)
        if violation is not None:
            return violation
    return None


def _runs(history: History) -> list[tuple[int, int, bool]]:
    """Each controller's run as positions [first, stop) and whether it is the job's last:
    the whole history without a kill; with one, each segment, less the JobKilled after it
    (the join's, or the world's: not the run's own)."""
    if not killed(history):
        return [(0, len(history), True)]
    found = segments(history)
    runs = [(s.first, s.stop if s.killed is None else s.killed, False) for s in found[:-1]]
    return [*runs, (found[-1].first, found[-1].stop, True)]


def _run_ended(
    history: History,
    marks: Sequence[Indexed],
    stop: int,
    last: bool,
    job_started: Indexed | None,
) -> Violation | None:
    """One run's ending; a run before the job's last one may have none (it was killed)."""
    started = next(((seq, e) for seq, e in marks if isinstance(e, RunStarted)), job_started)
    ended = next(((seq, e) for seq, e in marks if isinstance(e, RunEnded)), None)
    if ended is not None and ended[0] + 1 < stop:
        after = ended[0] + 1
        return Violation(
            NAME,
            f"{history[after].type_name} was recorded after the run ended: some part of the "
            "world kept acting on a finished run",
            (ended, (after, history[after])),
        )
    if ended is None:
        if not last or not len(history):
            return None
        return Violation(NAME, "the run never recorded its end (it was cut off)", ())
    return _judged(ended, started)


def _judged(ended: Indexed, started: Indexed | None) -> Violation | None:
    """A recorded ending against the one its run's RunStarted expects."""
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
