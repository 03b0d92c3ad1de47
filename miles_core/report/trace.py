"""Chrome trace JSON (opens in Perfetto) from an event history.

One track per cell (its step attempts and the weight updates it sent), one per
engine (paused spans, and an instant per finished request, per try the router
failed and per refused flush), an instant per fault, and counters: miles'
rollout metrics of each step, the published version, the staleness of each
trained group and the buffer depth.
"""

from __future__ import annotations

from typing import Any

from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    EnginesPaused,
    EnginesResumed,
    Event,
    FaultInjected,
    FlushRefused,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    HealBegan,
    HealEnded,
    History,
    RequestRetried,
    RunStarted,
    SampleGenerated,
    StepMetrics,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.kinds import PutFate
from miles_core.report.story import update_name

_CELLS, _ENGINES, _CONTROL = 1, 2, 3
_US = 1e6  # trace timestamps are microseconds


def _ts(t: float) -> float:
    return round(t * _US, 3)


class _Trace:
    """Builds the trace events; one method per kind of history event it draws."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
            for pid, name in (
                (_CELLS, "trainer cells"),
                (_ENGINES, "engines"),
                (_CONTROL, "control plane"),
            )
        ]
        self.engine_tid: dict[str, int] = {}
        self.attempts: dict[tuple[int, int], AttemptBegan] = {}
        self.updates: dict[int, UpdateBegan] = {}
        self.heals: dict[int, HealBegan] = {}
        self.paused: dict[str, float] = {}
        self.depth = 0

    def thread(self, pid: int, tid: int, name: str) -> None:
        self.events.append(
            {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}
        )

    def tid(self, engine: str) -> int:
        if engine not in self.engine_tid:
            self.engine_tid[engine] = len(self.engine_tid)
            self.thread(_ENGINES, self.engine_tid[engine], engine)
        return self.engine_tid[engine]

    def span(self, pid: int, tid: int, start: float, end: float, name: str, **args: Any) -> None:
        event = {"ph": "X", "pid": pid, "tid": tid, "ts": _ts(start), "dur": _ts(end - start)}
        self.events.append(event | {"name": name, **({"args": args} if args else {})})

    def counter(self, t: float, name: str, **values: Any) -> None:
        self.events.append({"ph": "C", "pid": _CONTROL, "ts": _ts(t), "name": name, "args": values})

    def run_started(self, e: RunStarted) -> None:
        for cell in range(e.num_cells):
            self.thread(_CELLS, cell, f"cell-{cell}")
        for engine in e.engines:
            self.tid(engine)

    def attempt_ended(self, e: AttemptEnded) -> None:
        begin = self.attempts.pop((e.step, e.attempt), None)
        if begin is None:
            return
        outcome = {c: o for o, cs in (("normal", e.normal), ("discarded", e.discarded),
                                      ("errored", e.errored)) for c in cs}  # fmt: skip
        for cell in begin.cells:
            self.span(
                _CELLS,
                cell,
                begin.t,
                e.t,
                f"step {e.step} try {e.attempt}",
                outcome=outcome.get(cell),
                decision=e.decision.value,
                quorum=begin.quorum_id,
            )

    def update_ended(self, e: VersionPublished | UpdateAborted | EnginesResumed) -> None:
        """An update's span on its updater's track, named as the story names it; a sync
        (which publishes nothing) ends when its engines resume."""
        begin = self.updates.get(e.update_id)
        if begin is None or (isinstance(e, EnginesResumed) and begin.publishes):
            return
        del self.updates[e.update_id]
        aborted = " aborted" if isinstance(e, UpdateAborted) else ""
        name = update_name(begin.update_id, begin.version, begin.publishes) + aborted
        self.span(_CELLS, begin.updater, begin.t, e.t, name, buckets=begin.n_buckets)
        if isinstance(e, VersionPublished):
            self.counter(e.t, "weight version", version=e.version)

    def heal_ended(self, e: HealEnded) -> None:
        begin = self.heals.pop(e.dst_cell, None)
        if begin is not None:
            name = f"heal from cell-{begin.src_cell}"
            self.span(_CELLS, e.dst_cell, begin.t, e.t, name, ok=e.ok)

    def resumed(self, e: EnginesResumed) -> None:
        self.update_ended(e)
        for engine in e.engines:
            if engine in self.paused:
                start = self.paused.pop(engine)
                self.span(_ENGINES, self.tid(engine), start, e.t, "paused for update")

    def sample(self, e: SampleGenerated) -> None:
        name = e.outcome.value if e.aborted else f"sample v{e.version}"
        self.events.append(
            {
                "ph": "i",
                "s": "t",
                "pid": _ENGINES,
                "tid": self.tid(e.engine),
                "ts": _ts(e.t),
                "name": name,
                "args": {"group": e.group_id},
            }
        )

    def retried(self, e: RequestRetried | FlushRefused) -> None:
        """A try the router failed (sent again later) or a refused flush, on its engine's
        track: where a router outage or a slow drain cost time."""
        if isinstance(e, RequestRetried):
            name, args = "request retried", {"group": e.group_id, "try": e.attempt}
        else:
            name, args = "flush refused", {"update": e.update_id, "try": e.attempt}
        tid = self.tid(e.engine)
        self.events.append(
            {"ph": "i", "s": "t", "pid": _ENGINES, "tid": tid, "ts": _ts(e.t), "name": name}
            | {"args": args}
        )

    def fault(self, e: FaultInjected) -> None:
        target = f"cell-{e.cell}" if e.cell is not None else e.engine
        self.events.append(
            {
                "ph": "i",
                "s": "g",
                "pid": _CONTROL,
                "ts": _ts(e.t),
                "name": f"fault {e.fault.value} {target}",
                "args": {"detail": e.detail},
            }
        )

    def buffer(self, e: Event) -> None:
        """Queued groups raise the buffer's depth; got, or dropped and recycled as stale,
        lower it."""
        if isinstance(e, GroupGot):
            self.depth -= 1
            if e.staleness is not None:
                self.counter(e.t, "staleness", staleness=e.staleness)
        elif isinstance(e, GroupPut):
            if e.fate is not PutFate.QUEUED:
                return
            self.depth += 1
        elif not e.reason.startswith("stale"):  # type: ignore[attr-defined]
            return
        else:
            self.depth -= 1
        self.counter(e.t, "buffer depth", groups=self.depth)

    def add(self, e: Event) -> None:
        if isinstance(e, SampleGenerated):
            self.sample(e)
        elif isinstance(e, GroupPut | GroupGot | GroupRecycled | GroupDropped):
            self.buffer(e)
        elif isinstance(e, RunStarted):
            self.run_started(e)
        elif isinstance(e, AttemptBegan):
            self.attempts[(e.step, e.attempt)] = e
        elif isinstance(e, AttemptEnded):
            self.attempt_ended(e)
        elif isinstance(e, UpdateBegan):
            self.updates[e.update_id] = e
        elif isinstance(e, VersionPublished | UpdateAborted):
            self.update_ended(e)
        elif isinstance(e, HealBegan):
            self.heals[e.dst_cell] = e
        elif isinstance(e, HealEnded):
            self.heal_ended(e)
        elif isinstance(e, EnginesPaused):
            for engine in e.engines:
                self.paused.setdefault(engine, e.t)
        elif isinstance(e, EnginesResumed):
            self.resumed(e)
        elif isinstance(e, FaultInjected):
            self.fault(e)
        elif isinstance(e, RequestRetried | FlushRefused):
            self.retried(e)
        elif isinstance(e, StepMetrics):
            for name, value in e.metrics:
                self.counter(e.t, name, value=value)


def chrome_trace(history: History) -> dict[str, Any]:
    trace = _Trace()
    for event in history:
        trace.add(event)
    return {"traceEvents": trace.events, "displayTimeUnit": "ms"}
