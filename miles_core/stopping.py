"""When a run may stop: what the Orchestrator asks of the history so far, past its steps.

The testbed's harness, not miles': liveness mode (miles_core.scenario.liveness) runs on
until ``liveness_missing`` finds nothing missing or its deadline passes, and a run with
until_witnessed goes on while a fault is ``awaited``. Both read only the history, as the
oracles do, and give the same answer in any world. They sit here, outside the oracles,
so that the control side imports no checker: the liveness and fault_witness oracles judge
with these same predicates (they import this module, never the reverse).
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.engines import EngineState
from miles_core.event_index import Indexed, select
from miles_core.events import (
    EngineRecoveryAsked,
    EngineStamped,
    EngineStateChanged,
    History,
    LivenessArmed,
    RunStarted,
    StepCommitted,
    VersionPublished,
)
from miles_core.segments import killed, last_segment
from miles_core.witness.effects import unwitnessed
from miles_core.witness.index import WitnessIndex


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


def awaited(history: History) -> bool:
    """Whether a run so far still waits on a fault: one scheduled that has not fired yet
    (a point such as during_recovery comes when it comes), one that fired and has not
    had its witnessed effect yet (a restarted engine that does not serve yet), or, with
    fault tolerance on, an engine out of rotation that does not serve again yet (a hang's
    witness is the engine leaving rotation; the health monitor's recovery, seconds later
    for real, is what such a run is there to show). What a run with until_witnessed goes
    on for."""
    index = WitnessIndex.of(history)
    fired = {e.index for _, e in index.fired} | index.disarmed  # type: ignore[union-attr]
    if any(e.index not in fired for _, e in index.scheduled):  # type: ignore[union-attr]
        return True
    if killed(history):  # a job killed whole: what its last run still waits on
        history, _ = last_segment(history)
        index = WitnessIndex.of(history)
    if recovering(history):
        return True
    now = history[-1].t if len(history) else 0.0
    return any(unwitnessed(e, seq, index, now) is not None for seq, e in index.fired)  # type: ignore[arg-type]


def recovering(history: History) -> set[str]:
    """In a run with fault tolerance, the engines taken out of rotation (down) or asked for
    a new process that have not served since: the health monitor is to bring them back.
    Empty without fault tolerance, where nothing would."""
    started = next((e for _, e in select(history, RunStarted)), None)
    if started is None or not started.fault_tolerance:  # type: ignore[union-attr]
        return set()
    pending: set[str] = set()
    for _, e in select(history, EngineRecoveryAsked, EngineStateChanged):
        if isinstance(e, EngineStateChanged) and e.new is EngineState.SERVING:
            pending.discard(e.engine)
        elif isinstance(e, EngineRecoveryAsked) or e.new is EngineState.DOWN:  # type: ignore[union-attr]
            pending.add(e.engine)  # type: ignore[union-attr]
    return pending


__all__ = ["LivenessPlan", "armed", "awaited", "liveness_missing", "recovering"]
