"""Lost serving capacity, read from the history (so every world and every miles profile reports
it the same way): the engine-seconds in which an engine slot did not serve, and the fault each
such stretch is laid to. The summary's ``serving_capacity``.

Why: today's miles (issue 50) lets a replacement rollout cell join the router only when the
next full update marks its weights ready (``ServerCell.mark_weights_ready``, server_cell.py at
b8afde1e), where miles at 31f1ca9 synced it at once (``recover_updatable_engines``); what a
fault costs in serving is then a number to compare across profiles and presets.

- Every engine serves from RunStarted (the control plane's table starts so); an outage is a
  stretch from an EngineStateChanged out of SERVING to the next one back into it (or the
  history's end, or the next RunStarted: a killed job's restart). Its seconds are split by
  the state it was in: ``down`` (no live process: miles' initializing, errored or stopped
  cell) and ``pending_weights`` (a live process without the published weights, UNSYNCED:
  miles' pending-weights cell).
- Each outage is laid to one fault: of the faults fired (FaultInjected) at or before the
  outage began that name its engine or name no engine (a cell's, the world's), the latest
  (at the same time: one naming the engine first, then the later fired). None fired: it is
  ``unattributed`` (a run resumed from a checkpoint syncs its engines first).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from miles_core.engines import EngineState
from miles_core.events import EngineStateChanged, Event, FaultInjected, RunStarted

_STATE_KEYS = {EngineState.DOWN: "down", EngineState.UNSYNCED: "pending_weights"}


@dataclass(frozen=True)
class Outage:
    """One engine slot out of rotation, from ``began`` to ``ended`` (None: never back)."""

    engine: str
    began: float
    ended: float | None
    down: float
    """Seconds of it without a live process."""
    pending_weights: float
    """Seconds of it with a live process that did not serve (UNSYNCED)."""
    fault: int | None
    """The fault (its index in the scenario) it is laid to, or None."""

    @property
    def seconds(self) -> float:
        return self.down + self.pending_weights


class _Open:
    """An outage under way: its seconds so far, by state."""

    def __init__(self, engine: str, t: float, state: EngineState, fault: int | None) -> None:
        self.engine, self.began, self.fault = engine, t, fault
        self.state, self.since = state, t
        self.seconds = {"down": 0.0, "pending_weights": 0.0}

    def move(self, t: float, state: EngineState) -> None:
        self.seconds[_STATE_KEYS[self.state]] += t - self.since
        self.state, self.since = state, t

    def close(self, t: float, back: bool) -> Outage:
        self.move(t, self.state)
        s = self.seconds
        return Outage(
            self.engine,
            self.began,
            t if back else None,
            s["down"],
            s["pending_weights"],
            self.fault,
        )


def _blamed(fired: list[FaultInjected], engine: str, t: float) -> int | None:
    """The fault an outage of ``engine`` beginning at ``t`` is laid to (module docstring)."""
    best: tuple[float, bool, int] | None = None
    blamed = None
    for order, fault in enumerate(fired):
        if fault.t > t or fault.engine not in (None, engine):
            continue
        key = (fault.t, fault.engine == engine, order)
        if best is None or key > best:
            best, blamed = key, fault.index
    return blamed


def outages(history: Iterable[Event]) -> tuple[list[Outage], list[FaultInjected], float]:
    """Every outage, the faults fired, and the engine-seconds the run's engines had in all."""
    done: list[Outage] = []
    fired: list[FaultInjected] = []
    open_: dict[str, _Open] = {}
    engines: tuple[str, ...] = ()
    began = last = 0.0
    total = 0.0
    for e in history:
        last = e.t
        if isinstance(e, RunStarted):
            total += len(engines) * (e.t - began)
            done += [o.close(e.t, back=False) for o in open_.values()]
            open_, engines, began = {}, e.engines, e.t
        elif isinstance(e, FaultInjected):
            fired.append(e)
        elif isinstance(e, EngineStateChanged):
            outage = open_.get(e.engine)
            if e.new is EngineState.SERVING:
                if outage is not None:
                    done.append(open_.pop(e.engine).close(e.t, back=True))
            elif outage is None:
                open_[e.engine] = _Open(e.engine, e.t, e.new, _blamed(fired, e.engine, e.t))
            else:
                outage.move(e.t, e.new)
    total += len(engines) * (last - began)
    done += [o.close(last, back=False) for o in open_.values()]
    return done, fired, total


def serving_capacity(history: Iterable[Event]) -> dict[str, Any]:
    """{"engine_seconds", "engine_seconds_not_serving", "down", "pending_weights",
    "unattributed", "by_fault": [{"fault", "kind", "target", "engine_seconds_not_serving",
    "down", "pending_weights", "outages"}]} — every fault fired, in the order fired."""
    lost, fired, total = outages(history)
    rows: dict[int, dict[str, Any]] = {}
    for f in fired:
        if f.index not in rows:
            target = f"cell {f.cell}" if f.cell is not None else f.engine or "the world"
            rows[f.index] = {
                "fault": f.index,
                "kind": f.fault.value,
                "target": target,
                "engine_seconds_not_serving": 0.0,
                "down": 0.0,
                "pending_weights": 0.0,
                "outages": 0,
            }
    unattributed = 0.0
    for o in lost:
        row = rows.get(o.fault) if o.fault is not None else None
        if row is None:
            unattributed += o.seconds
            continue
        row["engine_seconds_not_serving"] += o.seconds
        row["down"] += o.down
        row["pending_weights"] += o.pending_weights
        row["outages"] += 1
    return {
        "engine_seconds": total,
        "engine_seconds_not_serving": sum(o.seconds for o in lost),
        "down": sum(o.down for o in lost),
        "pending_weights": sum(o.pending_weights for o in lost),
        "unattributed": unattributed,
        "by_fault": list(rows.values()),
    }


def capacity_line(report: dict[str, Any]) -> str | None:
    """The summary's line for a person (None when every engine served throughout)."""
    lost = report["engine_seconds_not_serving"]
    if not lost:
        return None
    total = report["engine_seconds"]
    share = f" ({lost / total:.1%} of {total:.1f})" if total else ""
    faults = "; ".join(
        f"{r['kind']} {r['target']} {r['engine_seconds_not_serving']:.1f}"
        for r in report["by_fault"]
        if r["outages"]
    )
    return (
        f"  serving capacity lost: {lost:.1f} engine-s not serving{share}: "
        f"{report['down']:.1f} down, {report['pending_weights']:.1f} pending weights"
        + (f"; by fault: {faults}" if faults else "")
        + (f"; unattributed {report['unattributed']:.1f}" if report["unattributed"] else "")
    )
