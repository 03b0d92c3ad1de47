"""The soak's observer of the run's history: a line for each fault once it is recovered,
and the safety oracles' verdicts on the history so far after each recovery and every
``JUDGE_EVERY`` steps (the whole-run oracles judge the whole history at the end).

A fault is recovered at the first committed step at which its witness saw its effect (or
its window closed on nothing to act on), its window is over, no engine waits for fault
tolerance's recovery, every engine serves and every cell is alive: the world is whole
again and training goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from miles_core.cells import CellState
from miles_core.engines import EngineState
from miles_core.event_index import index_bytes
from miles_core.events import (
    CellStateChanged,
    EngineStateChanged,
    Event,
    FaultInjected,
    History,
    StepCommitted,
)
from miles_core.oracles import SAFETY
from miles_core.stopping import recovering
from miles_core.witness.effects import unwitnessed
from miles_core.witness.index import WitnessIndex

JUDGE_EVERY = 50
"""Steps between two judgements of the history so far when no fault recovers."""


@dataclass(frozen=True)
class FaultLine:
    """One fault's story: what, when, recovered or not, how long it took."""

    index: int
    kind: str
    target: str
    t: float
    recovered_at: float | None

    @property
    def seconds(self) -> float | None:
        return None if self.recovered_at is None else self.recovered_at - self.t

    def text(self) -> str:
        what = f"fault {self.index:3d} {self.kind:15s} {self.target:9s} at t={self.t:8.2f}"
        if self.seconds is None:
            return f"{what}  NOT recovered"
        return f"{what}  recovered in {self.seconds:6.2f} s"


@dataclass(frozen=True)
class Failure:
    """An oracle that failed on the history so far: which, when, what it found."""

    oracle: str
    t: float
    message: str


class Tracker:
    """Reads the run's history (``history``, given to the run to record into, and this an
    observer of it), tells ``say`` of each recovered fault and records the oracles that fail
    as it goes. One history rather than a second list of the same events: a pointer an
    event saved (the events themselves were always shared), and the sampler reads its
    length as the run's."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.history = History()
        self.say = say
        self.open: dict[int, tuple[int, FaultInjected]] = {}
        self.lines: list[FaultLine] = []
        self.failures: list[Failure] = []
        self.judged = 0
        self.cells: dict[int, CellState] = {}
        self.engines: dict[str, EngineState] = {}
        self._since_judged = 0
        self.indexed_per_event = 0.0
        """The oracles' index over the history, in bytes an event, as the last judgement left
        it (the run's own judging at the end drops it, so it is read here)."""
        self.first_step_at: float | None = None
        """time.monotonic() when the first step committed: the world is up."""

    def __call__(self, event: Event) -> None:
        """Called by the history once ``event`` is its last."""
        seq = len(self.history) - 1
        if isinstance(event, FaultInjected):
            self.open[event.index] = (seq, event)
        elif isinstance(event, CellStateChanged):
            self.cells[event.cell] = event.new
        elif isinstance(event, EngineStateChanged):
            self.engines[event.engine] = event.new
        elif isinstance(event, StepCommitted):
            if self.first_step_at is None:
                self.first_step_at = time.monotonic()
            self._since_judged += 1
            if self.open and self._whole():
                self._recover(event.t)
            if self._since_judged >= JUDGE_EVERY:
                self.judge()

    def _whole(self) -> bool:
        cells = all(state is CellState.ALIVE for state in self.cells.values())
        engines = all(state is EngineState.SERVING for state in self.engines.values())
        return cells and engines and not recovering(self.history)

    def _recover(self, now: float) -> None:
        index = WitnessIndex.of(self.history)
        done = [
            (seq, fault)
            for seq, fault in self.open.values()
            if fault.t + (fault.duration or 0.0) <= now
            and fault.t < now
            and unwitnessed(fault, seq, index, now) is None
        ]
        for _, fault in done:
            del self.open[fault.index]
            self._line(fault, now)
        if done:
            self.judge()

    def _line(self, fault: FaultInjected, recovered_at: float | None) -> None:
        target = f"cell {fault.cell}" if fault.cell is not None else fault.engine or "world"
        line = FaultLine(fault.index, fault.fault.value, target, fault.t, recovered_at)
        self.lines.append(line)
        self.say(line.text())

    def judge(self) -> None:
        """The safety oracles on the history so far; a failure is kept with its time."""
        self._since_judged = 0
        self.judged += 1
        now = self.history[-1].t if len(self.history) else 0.0
        for name, oracle in SAFETY.items():
            found = oracle(self.history)
            if found is not None and name not in {f.oracle for f in self.failures}:
                self.failures.append(Failure(name, now, str(found)))
                self.say(f"oracle {name} FAILED at t={now:.2f}: {found}")
        self.indexed_per_event = index_bytes(self.history) / max(1, len(self.history))

    def finish(self) -> list[FaultLine]:
        """The run ended: every fault still open is not recovered; the lines in fault order."""
        for _, fault in sorted(self.open.values(), key=lambda pair: pair[1].index):
            self._line(fault, None)
        self.open.clear()
        return sorted(self.lines, key=lambda line: line.index)
