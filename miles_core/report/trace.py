"""Chrome trace JSON (opens in Perfetto) from an event history.

One track per cell (its step attempts and the weight updates it sent), one per
engine (paused spans, and an instant per finished request), an instant per
fault, and counters for the published version, the staleness of each trained
group and the buffer depth.
"""

from __future__ import annotations

from typing import Any

from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    EnginesPaused,
    EnginesResumed,
    FaultInjected,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    HealBegan,
    HealEnded,
    History,
    RunStarted,
    SampleGenerated,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.kinds import PutFate

_CELLS, _ENGINES, _CONTROL = 1, 2, 3
_US = 1e6  # trace timestamps are microseconds


def _ts(t: float) -> float:
    return round(t * _US, 3)


def chrome_trace(history: History) -> dict[str, Any]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _CELLS, "name": "process_name", "args": {"name": "trainer cells"}},
        {"ph": "M", "pid": _ENGINES, "name": "process_name", "args": {"name": "engines"}},
        {"ph": "M", "pid": _CONTROL, "name": "process_name", "args": {"name": "control plane"}},
    ]
    engine_tid: dict[str, int] = {}

    def tid(engine: str) -> int:
        if engine not in engine_tid:
            engine_tid[engine] = len(engine_tid)
            events.append(
                {
                    "ph": "M",
                    "pid": _ENGINES,
                    "tid": engine_tid[engine],
                    "name": "thread_name",
                    "args": {"name": engine},
                }
            )
        return engine_tid[engine]

    attempts: dict[tuple[int, int], AttemptBegan] = {}
    updates: dict[int, UpdateBegan] = {}
    heals: dict[int, HealBegan] = {}
    paused: dict[str, float] = {}
    depth = 0
    for e in history:
        if isinstance(e, RunStarted):
            for cell in range(e.num_cells):
                events.append(
                    {
                        "ph": "M",
                        "pid": _CELLS,
                        "tid": cell,
                        "name": "thread_name",
                        "args": {"name": f"cell-{cell}"},
                    }
                )
            for engine in e.engines:
                tid(engine)
        elif isinstance(e, AttemptBegan):
            attempts[(e.step, e.attempt)] = e
        elif isinstance(e, AttemptEnded) and (begin := attempts.pop((e.step, e.attempt), None)):
            outcome = {
                c: o
                for o, cs in (
                    ("normal", e.normal),
                    ("discarded", e.discarded),
                    ("errored", e.errored),
                )
                for c in cs
            }
            for cell in begin.cells:
                events.append(
                    {
                        "ph": "X",
                        "pid": _CELLS,
                        "tid": cell,
                        "ts": _ts(begin.t),
                        "dur": _ts(e.t - begin.t),
                        "name": f"step {e.step} try {e.attempt}",
                        "args": {
                            "outcome": outcome.get(cell),
                            "decision": e.decision.value,
                            "quorum": begin.quorum_id,
                        },
                    }
                )
        elif isinstance(e, UpdateBegan):
            updates[e.update_id] = e
        elif isinstance(e, (VersionPublished, UpdateAborted)) and (
            begin := updates.pop(e.update_id, None)
        ):
            name = f"update v{begin.version}" + (
                " (aborted)" if isinstance(e, UpdateAborted) else ""
            )
            events.append(
                {
                    "ph": "X",
                    "pid": _CELLS,
                    "tid": begin.updater,
                    "ts": _ts(begin.t),
                    "dur": _ts(e.t - begin.t),
                    "name": name,
                    "args": {"buckets": begin.n_buckets},
                }
            )
            if isinstance(e, VersionPublished):
                events.append(
                    {
                        "ph": "C",
                        "pid": _CONTROL,
                        "ts": _ts(e.t),
                        "name": "weight version",
                        "args": {"version": e.version},
                    }
                )
        elif isinstance(e, HealBegan):
            heals[e.dst_cell] = e
        elif isinstance(e, HealEnded) and (begin := heals.pop(e.dst_cell, None)):
            events.append(
                {
                    "ph": "X",
                    "pid": _CELLS,
                    "tid": e.dst_cell,
                    "ts": _ts(begin.t),
                    "dur": _ts(e.t - begin.t),
                    "name": f"heal from cell-{begin.src_cell}",
                    "args": {"ok": e.ok},
                }
            )
        elif isinstance(e, EnginesPaused):
            for engine in e.engines:
                paused.setdefault(engine, e.t)
        elif isinstance(e, EnginesResumed):
            for engine in e.engines:
                if engine in paused:
                    start = paused.pop(engine)
                    events.append(
                        {
                            "ph": "X",
                            "pid": _ENGINES,
                            "tid": tid(engine),
                            "ts": _ts(start),
                            "dur": _ts(e.t - start),
                            "name": "paused for update",
                        }
                    )
        elif isinstance(e, SampleGenerated):
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "pid": _ENGINES,
                    "tid": tid(e.engine),
                    "ts": _ts(e.t),
                    "name": e.outcome.value if e.aborted else f"sample v{e.version}",
                    "args": {"group": e.group_id},
                }
            )
        elif isinstance(e, FaultInjected):
            target = f"cell-{e.cell}" if e.cell is not None else e.engine
            events.append(
                {
                    "ph": "i",
                    "s": "g",
                    "pid": _CONTROL,
                    "ts": _ts(e.t),
                    "name": f"fault {e.fault.value} {target}",
                    "args": {"detail": e.detail},
                }
            )
        elif isinstance(e, GroupGot):
            depth -= 1
            if e.staleness is not None:
                events.append(
                    {
                        "ph": "C",
                        "pid": _CONTROL,
                        "ts": _ts(e.t),
                        "name": "staleness",
                        "args": {"staleness": e.staleness},
                    }
                )
        elif isinstance(e, GroupPut) and e.fate is PutFate.QUEUED:
            depth += 1
        elif isinstance(e, GroupRecycled | GroupDropped) and e.reason.startswith("stale"):
            depth -= 1
        else:
            continue
        if isinstance(e, GroupPut | GroupGot | GroupRecycled | GroupDropped):
            events.append(
                {
                    "ph": "C",
                    "pid": _CONTROL,
                    "ts": _ts(e.t),
                    "name": "buffer depth",
                    "args": {"groups": depth},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
