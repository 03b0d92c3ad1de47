"""liveness: once every fault is healed, the run commits K steps and every engine reaches the
newest version, within a bound computed from the configuration.

Only a run in liveness mode (miles_core.scenario.liveness) has a heal; any other run passes.
After LivenessArmed (recorded as the heal happens, with its deadline and the bound's terms),
the run must commit ``steps`` steps by the deadline, and every engine must be stamped with
the version published after the last of them (or a later one) by the deadline too. A run
that stalled before the deadline fails it as well: a stall is what this oracle is for. The
wait-for graph recorded when the run stopped (TasksWaiting) is cited with the verdict.

The same judgement decides, during the run, whether it may stop (``liveness_missing``,
miles_core.stopping): the Orchestrator goes on past its configured steps until it is met or
the deadline passes.
"""

from __future__ import annotations

from miles_core.event_index import select
from miles_core.events import History, LivenessArmed, RunEnded, TasksWaiting
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Violation
from miles_core.stopping import armed, liveness_missing

NAME = "liveness"


def liveness(history: History) -> Violation | None:
    start = armed(history)
    if start is None:
        return None
    arm = start[1]
    assert isinstance(arm, LivenessArmed)
    ended = select(history, RunEnded)
    end = ended[0][1] if ended else None
    if end is not None and end.status is RunStatus.INTERRUPTED:  # type: ignore[union-attr]
        return None  # cut from outside before the deadline was reached or not
    missing = liveness_missing(history)
    if missing is None:
        return None
    waits = select(history, TasksWaiting)
    graph = ""
    if waits:
        w = waits[len(waits) - 1][1]
        assert isinstance(w, TasksWaiting)
        graph = f"; wait-for graph: root {w.root} ({len(w.waits)} tasks waiting)"
    evidence = (start, ended[0]) if ended else (start,)
    return Violation(
        NAME,
        f"after the heal at t={arm.t:.6g}: {missing} (deadline t={arm.deadline:.6g}, "
        f"bound {arm.bound}){graph}",
        evidence,
    )
