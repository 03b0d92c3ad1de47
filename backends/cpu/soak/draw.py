"""The soak's fault schedule, drawn from its seed: pure (no Ray, no clock, no global random
state), so that a seed names the same faults on every machine and a test can hold the draw.

Every fault form the CPU world honours is drawn: each kind of ``miles_core.fault_kinds``
that ``check_real`` accepts (all but kill_job, which would kill the soak's own driver).
Forms are drawn in shuffled rounds, each round every form once, so that ``len(FORMS)``
draws in a row cover them all. Each form is a motif: the fault and, where nothing in the
loop undoes it, the fault that does (a start_cell a moment after a cell is lost). Motifs
strike as a step begins (or at the step's named point), one at a time, each given the
steps its recovery takes on this machine before the next one strikes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from miles_core.fault_kinds import ROWS
from miles_core.kinds import FaultKind
from miles_core.scenario.faults import HUNG_CALLS, After, AnyFault, make_fault

SECONDS_PER_STEP = 0.3
"""A step of the soak's world on the 2-core VM when quiet (a 30-minute soak: 4,267 steps in
19.7 min, 0.28 s; python -m backends.cpu run under load: 0.42 s): how minutes become steps.
A slower or busier machine soaks longer than asked; the summary says how long."""

FASTEST_SECONDS_PER_STEP = 0.2
"""The least a step takes here: seconds of recovery become steps of spacing at this pace,
so a faster machine cannot bring the next motif before the last one recovered (at 0.45 s
the 30-minute soak's steps came 1.6 times faster than planned, a fail_rank struck a cell
that a lost heartbeat still held down, never fired, and fault_witness failed)."""

FIRST_STEP = 4
"""The first motif strikes as this step begins (the world has warmed up)."""

FAULT_SHARE = 0.8
"""Motifs strike in the first 80 % of the steps: the rest shows the run recovered."""

HEARTBEAT_DETECTION = 5.0 * 2 + 5.0
"""Seconds until a cell whose heartbeats are lost is declared dead (the soak's loop:
interval 5 s x 2 misses + 5 s timeout, see command.soak_scenario)."""

HEALTH_PATIENCE = 2.0 + 5.0
"""Fault tolerance's health check interval + timeout in the soak's loop."""

REFUSED_FOR_REAL = (FaultKind.KILL_JOB,)
"""The kinds ``check_real`` refuses (the CPU world cannot kill its own job; it restarts its
driver's loop with the actors kept: backends/common/run/driver_restart.py)."""

HONOURED: tuple[FaultKind, ...] = tuple(
    row.kind for row in ROWS if row.kind not in REFUSED_FOR_REAL and row.caught_by is None
)
"""The kinds the CPU world runs (``check_real`` refuses ``REFUSED_FOR_REAL``; the tests hold
it), but those an oracle must catch (lying_engine: a soak's run must pass)."""


@dataclass(frozen=True)
class Motif:
    """One drawn form: its faults (an ``after`` names a fault by its place in the motif)
    and the seconds its recovery takes before the next motif may strike."""

    form: FaultKind
    faults: tuple[AnyFault, ...]
    settle: float


@dataclass(frozen=True)
class Shape:
    """What a draw needs of the world: its cells and engines."""

    cells: int
    engines: int


def _cell(rng: random.Random, shape: Shape) -> int:
    return rng.randrange(shape.cells)


def _engine(rng: random.Random, shape: Shape) -> str:
    return f"engine-{rng.randrange(shape.engines)}"


def _lost_cell(kind: str, **keys: object) -> Callable[[random.Random, Shape, int], Motif]:
    """A cell lost at ``step`` and started again 2 s later (healed from its peer)."""

    def draw(rng: random.Random, shape: Shape, step: int) -> Motif:
        cell = _cell(rng, shape)
        point = {"point": "before_allreduce"} if kind != "stop_cell" else {"point": "step_begin"}
        lost = make_fault(kind, cell=cell, step=step, **point, **keys)  # type: ignore[arg-type]
        back = make_fault("start_cell", cell=cell, after={"fault": 0, "seconds": 2.0})
        return Motif(FaultKind(kind), (lost, back), 30.0)

    return draw


def _start_cell(rng: random.Random, shape: Shape, step: int) -> Motif:
    """A cell killed at the step's beginning, its start the form drawn."""
    motif = _lost_cell("kill_cell")(rng, shape, step)
    return Motif(FaultKind.START_CELL, motif.faults, motif.settle)


def _drop_heartbeat(rng: random.Random, shape: Shape, step: int) -> Motif:
    cell, duration = _cell(rng, shape), rng.uniform(1.5, 2.0) * HEARTBEAT_DETECTION
    lost = make_fault("drop_heartbeat", cell=cell, duration=duration, point="step_begin", step=step)
    back = make_fault("start_cell", cell=cell, after={"fault": 0, "seconds": duration + 2.0})
    return Motif(FaultKind.DROP_HEARTBEAT, (lost, back), duration + 30.0)


def _engine_fault(kind: str) -> Callable[[random.Random, Shape, int], Motif]:
    """An engine that fault tolerance takes out and brings back with a new process."""

    def draw(rng: random.Random, shape: Shape, step: int) -> Motif:
        keys: dict[str, object] = {"engine": _engine(rng, shape)}
        if kind == "hang_call":
            keys["call"] = rng.choice(HUNG_CALLS)
        if kind == "kill_engine" and rng.random() < 0.5:  # halfway through a request
            keys |= {"point": "mid_generation", "after_step": step - 1}
        else:
            keys |= {"point": "step_begin", "step": step}
        return Motif(FaultKind(kind), (make_fault(kind, **keys),), 40.0)

    return draw


def _slow_start(rng: random.Random, shape: Shape, step: int) -> Motif:
    """The next process of an engine starts slower than the health monitor's patience,
    and the engine is killed: its recovery must be waited for, not replaced."""
    engine, seconds = _engine(rng, shape), rng.uniform(1.5, 3.0) * HEALTH_PATIENCE
    duration = 3 * HEALTH_PATIENCE + seconds
    slow = make_fault(
        "slow_start",
        engine=engine,
        seconds=seconds,
        duration=duration,
        point="step_begin",
        step=step,
    )
    kill = make_fault("kill_engine", engine=engine, after={"fault": 0})
    return Motif(FaultKind.SLOW_START, (slow, kill), duration + 40.0)


def _window(
    kind: str, **ranges: tuple[float, float]
) -> Callable[[random.Random, Shape, int], Motif]:
    """An impairment open for ``duration`` seconds from the step's beginning."""

    def draw(rng: random.Random, shape: Shape, step: int) -> Motif:
        keys = {name: rng.uniform(*bounds) for name, bounds in ranges.items()}
        if kind == "slow_cell":
            keys["cell"] = _cell(rng, shape)
        fault = make_fault(kind, point="step_begin", step=step, **keys)
        return Motif(FaultKind(kind), (fault,), keys["duration"] + 8.0)

    return draw


def _poison(rng: random.Random, shape: Shape, step: int) -> Motif:
    return Motif(
        FaultKind.POISON_PROMPT, (make_fault("poison_prompt", point="step_begin", step=step),), 5.0
    )


def _restart_driver(rng: random.Random, shape: Shape, step: int) -> Motif:
    """The driver's loop dies as a step begins; a new one adopts the actors after
    DRIVER_RESTART_SECONDS (10 s) and syncs the engines: settled some seconds after."""
    fault = make_fault("restart_driver", point="step_begin", step=step)
    return Motif(FaultKind.RESTART_DRIVER, (fault,), 15.0)


FORMS: dict[FaultKind, Callable[[random.Random, Shape, int], Motif]] = {
    FaultKind.KILL_CELL: _lost_cell("kill_cell"),
    FaultKind.KILL_RANK: _lost_cell("kill_rank", rank=0),
    FaultKind.FAIL_RANK: _lost_cell("fail_rank", rank=0),
    FaultKind.STOP_CELL: _lost_cell("stop_cell"),
    FaultKind.START_CELL: _start_cell,
    FaultKind.SLOW_CELL: _window("slow_cell", factor=(1.5, 5.0), duration=(3.0, 6.0)),
    FaultKind.DROP_HEARTBEAT: _drop_heartbeat,
    FaultKind.KILL_ENGINE: _engine_fault("kill_engine"),
    FaultKind.RESTART_ENGINE: _engine_fault("restart_engine"),
    FaultKind.HANG_ENGINE: _engine_fault("hang_engine"),
    FaultKind.HANG_CALL: _engine_fault("hang_call"),
    FaultKind.ORPHAN_ENGINE: _engine_fault("orphan_engine"),
    FaultKind.POISON_PROMPT: _poison,
    FaultKind.RESTART_DRIVER: _restart_driver,
    FaultKind.SLOW_START: _slow_start,
    FaultKind.SLOW_LINK: _window("slow_link", factor=(1.5, 100.0), duration=(4.0, 8.0)),
    FaultKind.PARTITION: _window("partition", duration=(2.0, 6.0)),  # under the 15 s timeout
    FaultKind.DELAY_ROUTER: _window("delay_router", seconds=(0.5, 3.0), duration=(2.0, 4.0)),
    FaultKind.FAIL_ROUTER: _window("fail_router", duration=(2.0, 4.0)),
}
"""A motif for each honoured kind (the tests hold the keys to ``HONOURED``)."""


def steps_for(minutes: float) -> int:
    """The steps that take about ``minutes`` on this machine, at least enough for one motif."""
    return max(FIRST_STEP + 8, math.ceil(minutes * 60.0 / SECONDS_PER_STEP))


def forms(rng: random.Random, count: int) -> list[FaultKind]:
    """``count`` forms in shuffled rounds: each round holds every form once."""
    out: list[FaultKind] = []
    while len(out) < count:
        round_ = list(FORMS)
        rng.shuffle(round_)
        out += round_
    return out[:count]


def draw_motifs(seed: int, steps: int, shape: Shape) -> tuple[tuple[int, Motif], ...]:
    """The motifs of a soak of ``steps`` steps, each with the step it strikes at."""
    rng = random.Random(seed)
    last = max(FIRST_STEP, int(FAULT_SHARE * steps))
    drawn: list[tuple[int, Motif]] = []
    step = FIRST_STEP
    order = forms(rng, len(FORMS))
    while step <= last:
        if not order:
            order = forms(rng, len(FORMS))
        motif = FORMS[order.pop(0)](rng, shape, step)
        drawn.append((step, motif))
        step += max(4, math.ceil(motif.settle / FASTEST_SECONDS_PER_STEP))
    return tuple(drawn)


def schedule(motifs: tuple[tuple[int, Motif], ...]) -> tuple[AnyFault, ...]:
    """The motifs' faults as one scenario's list, each ``after = {fault = N}`` renumbered
    from its place in its motif to its place in the list."""
    out: list[AnyFault] = []
    for _, motif in motifs:
        base = len(out)
        for fault in motif.faults:
            when = fault.when
            if isinstance(when, After) and when.fault is not None:
                fault = dataclasses.replace(
                    fault, when=dataclasses.replace(when, fault=when.fault + base)
                )
            out.append(fault)
    return tuple(out)
