"""Ctrl-C in every command: the run stops where its state is whole, it ends as interrupted
(RunEnded records it), and the command prints what ran, what the oracles found in the time
left, and the line that replays the run; then exits 130, as a shell reports a Ctrl-C.

Python raises KeyboardInterrupt at whatever line runs, and the simulator's runtime or a
task half-way through a step then fails in ways that read as a bug of the control plane
(a task finished twice: "argument of type 'NoneType' is not iterable", reported as a
crash). So a run asks to be told instead (``ctrl_c_calls``) and stops at its own next
safe point. Judging and summarising a long prefix can take seconds; a command cut short
has under two, so that work runs under ``time_limit`` and what did not fit is said to be
missing. With miles_core/ctrl_c.py (a command's first instants, before this is imported),
the only place in miles_core that touches signals; it reads no clock (the limit is the
system's interval timer).
"""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from miles_core.ctrl_c import INTERRUPTED_EXIT as INTERRUPTED_EXIT
from miles_core.ctrl_c import lost_ctrl_c
from miles_core.events import History
from miles_core.loop import RunReport
from miles_core.oracles import SAFETY, WHOLE_RUN, Violation, verdict_lines
from miles_core.oracles.base import forget
from miles_core.scenario import Scenario

JUDGE_SECONDS = 0.5
"""How long an interrupted run's safety oracles may take, together."""

REPORT_SECONDS = 0.4
"""How long an interrupted run's summary may take to build; past it, the short form."""

NOT_WHOLE = "the run was interrupted: only a run that ended by itself has an ending to judge"
CUT = "Ctrl-C came while the oracles judged the run, before this one"


class OutOfTime(BaseException):
    """``time_limit``'s time ran out (not an Exception: nothing in the block may take it for
    its own failure)."""


@contextmanager
def _handled(signum: int, handler: Callable[[int, object], None]) -> Iterator[bool]:
    """``handler`` for ``signum`` while the block runs (yields True); where Python delivers
    no signal (any thread but the main one) nothing is installed (yields False)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # "signal only works in main thread of the main interpreter"
        yield False
        return
    try:
        yield True
    finally:  # None: a handler from outside Python, which cannot be put back; the default
        signal.signal(signum, signal.SIG_DFL if previous is None else previous)


@contextmanager
def ctrl_c_calls(action: Callable[[], None]) -> Iterator[None]:
    """While the block runs, Ctrl-C calls ``action`` (which must only ask the owner to stop:
    it runs between two lines of whatever was running) instead of raising KeyboardInterrupt
    there. A second Ctrl-C raises it: the first did not stop what runs. Outside the main
    thread, where Python delivers no signal, the block runs as it is. A Ctrl-C that Python
    dropped before the block (``lost_ctrl_c``) asks at once: what runs stops at its start."""
    asked: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)
        action()

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield  # (a shell's background job ignores Ctrl-C: so does the run)
        return
    with _handled(signal.SIGINT, handler) as handled:
        if handled and lost_ctrl_c():
            handler(signal.SIGINT, None)
        yield


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise OutOfTime in the block once ``seconds`` have passed (SIGALRM; on the main thread
    only, elsewhere no limit). For work with no effect outside itself (judging, summarising),
    which can be dropped half-way. The cyclic collector is paused meanwhile: the objects of
    the run just ended are garbage, and a collection of a long run's took 0.7 s."""

    def expire(signum: int, frame: object) -> None:
        raise OutOfTime

    enabled = gc.isenabled()
    gc.disable()
    try:
        with _handled(signal.SIGALRM, expire) as timed:
            if timed:
                signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                yield
            finally:
                if timed:
                    signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        if enabled:
            gc.enable()


def judge_prefix(
    history: History, seconds: float = JUDGE_SECONDS
) -> tuple[dict[str, Violation | None], dict[str, str]]:
    """The safety oracles' verdicts on an interrupted run, as many as ``seconds`` (or a second
    Ctrl-C) allow, in their order; and, by name, why each other oracle gave none."""
    verdicts: dict[str, Violation | None] = {}
    try:
        with time_limit(seconds):
            for name, oracle in SAFETY.items():
                verdicts[name] = oracle(history)
    except (OutOfTime, KeyboardInterrupt):
        pass
    finally:
        forget(history)  # an index cut half-way through its update must not be read again
    events = f"{len(history)} events"
    late = f"no time left after Ctrl-C to judge the {events} that ran"
    not_judged = {name: late for name in SAFETY if name not in verdicts}
    return verdicts, not_judged | {name: NOT_WHOLE for name in WHOLE_RUN}


def not_judged_lines(not_judged: dict[str, str]) -> list[str]:
    """One line per oracle that gave no verdict, with why (beside verdict_lines' pass/FAIL)."""
    return [f"  oracle {name:20s} not judged: {why}" for name, why in not_judged.items()]


def short_summary(
    scenario: Scenario,
    seed: int,
    history: History,
    report: RunReport,
    verdicts: dict[str, Violation | None],
    clock: str,
) -> dict[str, Any]:
    """An interrupted run's summary when the full one (``summary``) does not fit in the time
    left: what ran, how it ended, the verdicts (``short``: it is this one)."""
    return {
        "scenario": scenario.name,
        "seed": seed,
        "status": report.status.value,
        "reason": report.reason,
        "steps": report.steps_done,
        "steps_asked": scenario.loop.steps,
        "versions": report.versions,
        "seconds": history[len(history) - 1].t if len(history) else 0.0,
        "clock": clock,
        "oracles": {k: "pass" if v is None else "fail" for k, v in verdicts.items()},
        "violations": {k: str(v) for k, v in verdicts.items() if v is not None},
        "short": True,
    }


def short_lines(info: dict[str, Any], verdicts: dict[str, Violation | None]) -> list[str]:
    """``short_summary`` for a person: what ran, in one line, and the verdicts."""
    what = f"{info['steps']}/{info['steps_asked']} steps, at {info['seconds']:.1f} s"
    head = f"{info['scenario']} seed={info['seed']}: {info['reason']}; {what} {info['clock']} time"
    return [head, *verdict_lines(verdicts)]
