"""Aimed swarm draws: a seed that must put one fault in a named cell of the coverage map.

A sweep aims some of its seeds at the map's cells still empty (``--aim
KIND@HOW:PHASE`` on the replay line, so an aimed seed replays exactly). The
aimed fault replaces the swarm's own draws of its family (cell faults, engine
faults, or one impairment), so the budget that keeps a cell and an engine alive
still holds:

- at a point, the point is forced, and for ``after_bucket`` the bucket that
  lands in the phase (the last one for ``stamping``);
- at a time, the scenario without the fault is run once first (a probe; the
  simulator is deterministic) and the time is drawn inside a span where the
  phase was under way; the run with the fault is the same up to that moment.

Aims the swarm cannot draw are refused with the list of those it can.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from miles_core.coverage import AT_TIME, PHASES, CoverageCell, coverage_cells, phase_windows
from miles_core.errors import ConfigError
from miles_core.events import SampleGenerated
from miles_core.fault_kinds import TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind
from miles_core.loop import LoopConfig
from miles_core.scenario import Scenario, WorldShape
from miles_core.scenario.faults import AnyFault, make_fault
from sim.search.draw import Draw

CELL, ENGINE, IMPAIRMENT = "cell", "engine", "impairment"
AIMABLE: dict[tuple[str, str], str] = {
    ("kill_cell", AT_TIME): CELL,
    ("kill_cell", "before_allreduce"): CELL,
    ("kill_cell", "after_bucket"): CELL,
    ("kill_cell", "during_heal"): CELL,
    ("start_cell", AT_TIME): CELL,
    ("kill_engine", AT_TIME): ENGINE,
    ("restart_engine", AT_TIME): ENGINE,
    ("restart_engine", "after_bucket"): ENGINE,
    ("kill_engine", "mid_generation"): ENGINE,
    ("kill_engine", "step_begin"): ENGINE,
    ("hang_engine", "step_begin"): ENGINE,
    ("kill_engine", "during_recovery"): ENGINE,
    ("slow_cell", "step_begin"): IMPAIRMENT,
    ("slow_link", "step_begin"): IMPAIRMENT,
    ("partition", "step_begin"): IMPAIRMENT,
    ("delay_router", "step_begin"): IMPAIRMENT,
    ("fail_router", "step_begin"): IMPAIRMENT,
}
"""(fault kind, how) -> the family of the swarm's draws an aim of that row replaces."""

CELL_DOWN_OR_UP = TAKES_A_CELL_DOWN | {FaultKind.START_CELL}
"""The swarm's faults that take a cell down or start it: a heal made for an aim replaces
them all, since dropping a start and keeping its kill leaves that cell down for good (a
rank's death or failure takes its cell down, seed 79; lost heartbeats have it stopped,
seed 90)."""

Probe = Callable[[list[AnyFault]], Any]
"""Runs the drawn scenario with these faults; returns its history."""


def parse_aim(text: str, flag: str = "--aim") -> CoverageCell:
    """``KIND@HOW:PHASE`` as a map cell the swarm can aim at; ConfigError otherwise."""
    kind, _, rest = text.partition("@")
    how, _, phase = rest.partition(":")
    if (kind, how) not in AIMABLE or phase not in PHASES:
        rows = ", ".join(f"{k}@{h}" for k, h in AIMABLE)
        raise ConfigError(
            flag,
            f"cannot aim at {text!r}",
            f"write KIND@HOW:PHASE with KIND@HOW one of {rows} and PHASE one of {list(PHASES)}",
        )
    return CoverageCell(kind, how, phase)


def family(aim: CoverageCell | None) -> str | None:
    return None if aim is None else AIMABLE[(aim.kind, aim.how)]


def adjust(aim: CoverageCell, world: WorldShape, loop: LoopConfig) -> tuple[WorldShape, LoopConfig]:
    """What the aimed fault needs of the world and flags (the rest of the draw is kept)."""
    needs_two = aim.kind in ("kill_engine", "hang_engine") or aim.how == "mid_generation"
    if needs_two and world.num_engines < 2:
        world = dataclasses.replace(world, num_engines=2)
    if aim.phase == "healing" and aim.how == AT_TIME and family(aim) == CELL:
        wanted = 3 if aim.kind == "start_cell" else 2  # a heal's source stays up, and one more
        if world.num_cells < wanted:
            world = dataclasses.replace(world, num_cells=wanted)
    if aim.how in ("step_begin", "during_recovery") and aim.kind in ("kill_engine", "hang_engine"):
        loop = dataclasses.replace(loop, use_fault_tolerance=True)  # only recovery undoes it
    return world, loop


def _bucket(d: Draw, phase: str) -> int:
    last = d.n_buckets - 1
    if phase == "stamping" or last == 0:
        return last
    if phase == "bucket_middle" and last >= 2:
        return d.rng.randrange(1, last)
    return 0


def _slot(d: Draw, spacing: int) -> int:
    slots = d.slots(1, spacing=spacing)
    return slots[0] if slots else 1


def _at_time(
    d: Draw,
    aim: CoverageCell,
    probe: Probe,
    extra: list[AnyFault] | None = None,
    after: float = 0.0,
    in_fault_phase: bool = True,
) -> float:
    """A time after ``after`` inside a span of the aimed phase, in the run with the faults
    drawn so far and ``extra`` (any time in the fault phase if there is none). Spans past
    the fault phase count too when ``in_fault_phase`` is False: a span that ``extra`` made
    on purpose (a heal at a drawn step), where a time drawn anywhere else could strike
    before ``extra`` did and undo it."""
    history = probe([*d.faults, *(extra or [])])
    spans = [(max(a, after), b) for a, b in _spans(d, history, aim.phase, in_fault_phase)]
    spans = [(a, b) for a, b in spans if b > a]
    if not spans:
        return d.rng.uniform(after, max(after, d.fault_phase))
    start, end = d.rng.choice(spans)
    return d.rng.uniform(start, end)


def _spans(d: Draw, history: Any, phase: str, in_fault_phase: bool) -> list[tuple[float, float]]:
    """The spans of ``phase`` in ``history``, cut at the end of the fault phase unless a
    setup made them on purpose (``in_fault_phase`` False)."""
    until = d.fault_phase if in_fault_phase else math.inf
    return [(a, min(b, until)) for a, b in phase_windows(history, phase)]


def _unslow(d: Draw, cells: set[int]) -> None:
    """A slow window on a cell that dies would have nothing to slow: the kill wins."""
    d.faults[:] = [f for f in d.faults if not (f.kind is FaultKind.SLOW_CELL and f.cell in cells)]  # type: ignore[attr-defined]


def _healed(cell: int, s: int) -> list[AnyFault]:
    """A heal of ``cell`` at step s + 1: it dies before step s's allreduce (holding that
    exchange up until it is found dead) and is started as step s + 1 begins."""
    return [
        make_fault("kill_cell", cell=cell, point="before_allreduce", step=s),
        make_fault("start_cell", cell=cell, point="step_begin", step=s + 1),
    ]


def _heal_then(d: Draw, aim: CoverageCell, probe: Probe, s: int) -> list[AnyFault]:
    """A time in ``healing``: a cell (not 0, the heal's source) dies before an allreduce
    and is started at the next step, which heals it; the aimed kill or start strikes
    during that heal, even one past the fault phase (steps slower than the swarm's
    estimate put it there: seed 22's kill, drawn in the fault phase instead, struck before
    the allreduce the setup's kill was waiting for). A start needs a cell that is down: a
    second one dies with the first (adjust gave the world a third cell, which stays up)."""
    F = make_fault
    healed, *others = d.rng.sample(range(1, d.world.num_cells), d.world.num_cells - 1)
    _unslow(d, {healed, *others})
    setup = _healed(healed, s)
    if aim.kind == "start_cell":
        started = others[0]
        setup.append(F("kill_cell", cell=started, point="before_allreduce", step=s))
        at = _at_time(d, aim, probe, setup, in_fault_phase=False)
        return [*setup, F("start_cell", cell=started, at=at)]
    # the healed cell itself, or (with a third cell up) another one
    killed = d.rng.choice([healed, *others])
    t = _at_time(d, aim, probe, setup, in_fault_phase=False)
    restart = F("start_cell", cell=killed, at=t + d.rng.uniform(0.5, d.step_seconds))
    return [*setup, F("kill_cell", cell=killed, at=t), restart]


def _cell_faults(d: Draw, aim: CoverageCell, probe: Probe) -> list[AnyFault]:
    F, s = make_fault, _slot(d, 4)
    slowed = {f.cell for f in d.faults if f.kind is FaultKind.SLOW_CELL}  # type: ignore[attr-defined]
    spared = [c for c in range(d.world.num_cells) if c not in slowed]
    if aim.how == "after_bucket":
        cell = 0  # the updater while it is alive
    elif aim.how == "during_heal":  # cell 0 stays: a heal needs a source
        cell = d.rng.choice([c for c in spared if c > 0] or [1])
    else:
        cell = d.rng.choice(spared or [0])
    if aim.how == AT_TIME and aim.phase == "healing":
        return _heal_then(d, aim, probe, s)
    _unslow(d, {cell})
    if aim.how == AT_TIME and aim.kind == "start_cell":  # down a little before, started in it
        before = _at_time(d, aim, probe) - d.rng.uniform(0.5, d.step_seconds)
        kill = F("kill_cell", cell=cell, at=max(0.0, before))
        return [kill, F("start_cell", cell=cell, at=_at_time(d, aim, probe, [kill], kill.when.at))]  # type: ignore[union-attr]
    if aim.how == AT_TIME:
        t = _at_time(d, aim, probe)
        restart = F("start_cell", cell=cell, at=t + d.rng.uniform(0.5, d.step_seconds))
        return [F("kill_cell", cell=cell, at=t), restart]
    if aim.how == "during_heal":  # killed, started, and killed again while it is healed
        return [
            F("kill_cell", cell=cell, point="before_allreduce", step=s),
            F("start_cell", cell=cell, point="step_begin", step=s + 1),
            F("kill_cell", cell=cell, point="during_heal", after_step=s),
            F("start_cell", cell=cell, point="step_begin", step=s + 3),
        ]
    if aim.how == "before_allreduce":
        kill = F("kill_cell", cell=cell, point="before_allreduce", step=s)
    else:
        bucket = _bucket(d, aim.phase)
        kill = F("kill_cell", cell=cell, point="after_bucket", bucket=bucket, after_step=s - 1)
    return [kill, F("start_cell", cell=cell, point="step_begin", step=s + 2)]


def _engine_faults(d: Draw, aim: CoverageCell, probe: Probe) -> list[AnyFault]:
    F, s = make_fault, _slot(d, 3)
    engine = f"engine-{d.rng.randrange(d.world.num_engines)}"
    if aim.how == AT_TIME:
        t = _at_time(d, aim, probe)
        if aim.kind == "restart_engine":
            return [F("restart_engine", engine=engine, at=t)]
        later = t + d.rng.uniform(1.0, d.step_seconds)
        return [F("kill_engine", engine=engine, at=t), F("restart_engine", engine=engine, at=later)]
    if aim.how == "after_bucket":
        bucket = _bucket(d, aim.phase)
        keys = {"point": "after_bucket", "bucket": bucket, "after_step": s - 1}
        return [F("restart_engine", engine=engine, **keys)]
    if aim.how == "mid_generation" and aim.phase in ("generating", "training"):
        return [
            F("kill_engine", engine=engine, point="mid_generation", after_step=s - 1),
            F("restart_engine", engine=engine, point="step_begin", step=s + 2),
        ]
    if aim.how == "mid_generation":
        return _mid_generation_in(d, aim, probe, s)
    if aim.how == "during_recovery" and aim.phase != "training":
        # the process it strikes is made by a restart at a time inside the phase; fault
        # tolerance (adjust turned it on) recovers the engine from the kill
        kill = F("kill_engine", engine=engine, point="during_recovery")
        return [kill, F("restart_engine", engine=engine, at=_at_time(d, aim, probe, [kill]))]
    faults = [F(aim.kind, engine=engine, point="step_begin", step=s)]  # fault tolerance undoes it
    if aim.how == "during_recovery":
        faults[0] = F("kill_engine", engine=engine, point="step_begin", step=s)
        faults.append(F("kill_engine", engine=engine, point="during_recovery", after_step=s - 1))
    return faults


def _mid_generation_in(d: Draw, aim: CoverageCell, probe: Probe, s: int) -> list[AnyFault]:
    """A mid-generation kill armed at the start of a span of the phase (``after_time``),
    on an engine the probe saw decoding across it: it strikes the first of that engine's
    requests to get halfway after it, in the phase if one gets there before it ends.
    ``healing`` and ``allreduce`` last while a cell is healed, or holds up an exchange it
    died before: a cell other than 0 (the heal's source) does both here, in place of the
    swarm's own cell faults (two sets could leave no cell alive). These phases and
    ``paused`` (one round trip of the pause before requests stop decoding) are short, so
    a request must get halfway inside one: which span start, on which engine, does that is
    not in the probe's history (a request's length is not recorded), so the candidates are
    tried with the kill (``_first_in_phase``), and for a heal, at up to HEAL_SLOTS steps."""
    F = make_fault
    setups: list[list[AnyFault]] = [[]]
    if aim.phase in ("healing", "allreduce"):
        cell = d.rng.randrange(1, d.world.num_cells)
        d.faults[:] = [f for f in d.faults if f.kind not in CELL_DOWN_OR_UP]
        _unslow(d, {cell})
        setups = [_healed(cell, slot) for slot in _heal_slots(d, s)]
    found: tuple[list[AnyFault], float, str] | None = None  # the first drawn, or a hit
    for setup in setups:
        history = probe([*d.faults, *setup])
        inside = _decoding_at_starts(d, aim, history, in_fault_phase=not setup)
        if not inside:
            continue
        if aim.phase not in ("paused", "healing", "allreduce"):
            found = (setup, *d.rng.choice(inside))
            break
        t, engine, hit = _first_in_phase(d, aim, probe, [*d.faults, *setup], inside)
        if found is None or hit:
            found = (setup, t, engine)
        if hit:
            break
    if found is not None:
        setup, t, engine = found
    else:  # no engine decoded across a span of the phase: any time in the fault phase
        setup = setups[0]
        t, engine = (
            d.rng.uniform(0.0, d.fault_phase),
            f"engine-{d.rng.randrange(d.world.num_engines)}",
        )
    restart = F("restart_engine", engine=engine, at=t + d.rng.uniform(1.0, 2.0) * d.step_seconds)
    kill = F("kill_engine", engine=engine, point="mid_generation", after_time=t)
    return [*setup, kill, restart]


def _decoding_at_starts(
    d: Draw, aim: CoverageCell, history: Any, in_fault_phase: bool
) -> list[tuple[float, str]]:
    """Each span start of the phase (``_spans``), with each engine that had a request
    decoding across it."""
    spans = _spans(d, history, aim.phase, in_fault_phase)
    requests = [e for e in history if isinstance(e, SampleGenerated) and not e.aborted]
    return sorted({(a, e.engine) for a, b in spans if b > a for e in requests if e.sent < a < e.t})


HEAL_SLOTS = 4
"""Steps at which ``_mid_generation_in`` tries a heal at the most (a probe each)."""


def _heal_slots(d: Draw, s: int) -> list[int]:
    """``s``, then other steps the swarm could strike at, in a drawn order."""
    last = max(1, min(int(0.6 * d.steps), d.steps - 4))
    others = [x for x in range(1, last + 1) if x != s]
    return [s, *d.rng.sample(others, min(HEAL_SLOTS - 1, len(others)))]


PHASE_TRIES = 8
"""Runs with the kill that ``_first_in_phase`` makes at the most (each is one more run)."""


def _first_in_phase(
    d: Draw, aim: CoverageCell, probe: Probe, faults: list[AnyFault], inside: list[Any]
) -> tuple[float, str, bool]:
    """The first of up to PHASE_TRIES (span start, engine) candidates, drawn in turn, at
    which the mid-generation kill lands in the aim's phase (True); else the first drawn
    (False). The run with the kill is the probe's run up to the kill, so each try is exact."""
    tries = d.rng.sample(inside, min(PHASE_TRIES, len(inside)))
    for t, engine in tries:
        kill = make_fault("kill_engine", engine=engine, point="mid_generation", after_time=t)
        if aim in coverage_cells(probe([*faults, kill])):
            return t, engine, True
    return *tries[0], False


def aimed_faults(d: Draw, aim: CoverageCell, probe: Probe) -> list[AnyFault]:
    """The faults that put ``aim`` in its cell (impairments are forced in the swarm's own
    impairment draw instead)."""
    if family(aim) == CELL:
        return _cell_faults(d, aim, probe)
    return _engine_faults(d, aim, probe)


def probe_with(base: Scenario, seed: int) -> Probe:
    """A probe that runs ``base`` with the faults drawn so far (imported late: the
    simulator's run module is not needed unless a seed aims at a time)."""

    def probe(faults: list[AnyFault]) -> Any:
        from sim.run import run_scenario

        scenario = dataclasses.replace(base, faults=tuple(faults))
        return run_scenario(scenario, seed).history

    return probe


__all__ = ["AIMABLE", "adjust", "aimed_faults", "family", "parse_aim", "probe_with"]
