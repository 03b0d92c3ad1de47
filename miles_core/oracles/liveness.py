"""liveness: once every fault is healed, the run commits K steps and every engine reaches the
newest version, within a bound computed from the configuration.

Only a run in liveness mode (miles_core.scenario.liveness) has a heal; any other run passes.
After LivenessArmed (recorded as the heal happens, with its deadline and the bound's terms),
the run must commit ``steps`` steps by the deadline, and every engine must be stamped with
the version published after the last of them (or a later one) by the deadline too. A run
that stalled before the deadline fails it as well: a stall is what this oracle is for. The
wait-for graph recorded when the run stopped (TasksWaiting) is cited with the verdict.

The same judgement decides, during the run, whether it may stop (``liveness_missing``): the
Orchestrator goes on past its configured steps until it is met or the deadline passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.events import (
    EngineStamped,
    History,
    LivenessArmed,
    RunEnded,
    StepCommitted,
    TasksWaiting,
    VersionPublished,
)
from miles_core.kinds import RunStatus
from miles_core.oracles.base import Indexed, Violation, select

NAME = "liveness"


@dataclass(frozen=True)
class LivenessPlan:
    """What the Orchestrator is told of liveness mode: where the heal comes, how many steps
    must follow it, and the bound (seconds, and how it was computed)."""

    heal_step: int
    steps: int
    seconds: float
    bound: str


def armed(history: History) -> Indexed | None:
    found = select(history, LivenessArmed)
    return found[0] if found else None


def liveness_missing(history: History) -> str | None:
    """What liveness still misses in the history so far, judging only what happened by the
    deadline (None: met)."""
    start = armed(history)
    if start is None:
        return "the heal has not come yet"
    seq0, arm = start
    assert isinstance(arm, LivenessArmed)
    until = arm.deadline
    commits = [(s, e) for s, e in select(history, StepCommitted) if s > seq0 and e.t <= until]
    if len(commits) < arm.steps:
        return f"{len(commits)} of {arm.steps} step(s) committed after the heal by t={until:.6g}"
    last_commit = commits[arm.steps - 1][0]
    target = next(
        (e for s, e in select(history, VersionPublished) if s > last_commit and e.t <= until),
        None,
    )
    if target is None:
        return f"no version was published after step {commits[-1][1].step} by t={until:.6g}"
    assert isinstance(target, VersionPublished)
    best: dict[str, int] = {}
    for s, e in select(history, EngineStamped):
        if s > seq0 and e.t <= until:
            best[e.engine] = max(best.get(e.engine, -1), e.version)
    behind = [engine for engine in arm.engines if best.get(engine, -1) < target.version]
    if behind:
        at = ", ".join(f"{e} at {'v' + str(best[e]) if e in best else 'no stamp'}" for e in behind)
        return f"not every engine reached v{target.version} by t={until:.6g} ({at})"
    return None


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
