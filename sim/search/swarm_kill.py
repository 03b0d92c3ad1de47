"""The swarm's kill_job: in a share of its seeds the whole job dies once and resumes from its
last committed save, from a stream of its own (the rest of a seed's drawing is the same
either way, and a seed that draws no kill runs as before: no saves).

A seed that draws one saves every 1 to 3 steps (``[loop] save_interval``) and is killed at a
step of the run drawn at random, by one of: a time, a step's beginning, a cell's exchange, a
bucket's arrival, a request halfway, or halfway through a save (twice as often: the torn
save). Its other faults stay as drawn: those the kill overtakes, and those that strike the
restarted job, are part of what is judged; but for a cell killed while it is healed, with
the start that follows: that kill is armed once a step has committed, which a restart's
replayed steps have, so it could strike the heal of another cell instead and take down its
source too, the last cell alive (seed 994, with every seed drawing a kill). Not in liveness
mode, whose heal would have to span the job's restart.
"""

from __future__ import annotations

import dataclasses
import random

from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop import LoopConfig
from miles_core.scenario import TimeModel, WorldShape, derive_seed
from miles_core.scenario.faults import After, AnyFault, make_fault
from sim.world.saves import save_seconds

KILL_JOB_SHARE = 0.15
"""The share of the swarm's seeds (outside liveness mode) whose job is killed whole once."""
SAVE_INTERVALS = (1, 2, 3)
KILL_MOMENTS = (
    "at",
    "step_begin",
    "before_allreduce",
    "after_bucket",
    "mid_generation",
    "during_save",
    "during_save",
)


def kill_job(
    seed: int,
    loop: LoopConfig,
    world: WorldShape,
    timing: TimeModel,
    shape: tuple[int, float],
    faults: list[AnyFault],
) -> tuple[LoopConfig, list[AnyFault], float]:
    """The loop with its save interval, the faults with the kill (none: both unchanged), and
    the seconds the progress window needs more for the restart (the job's start, reading
    the save, the engines' sync and a step redone). ``shape``: the buckets of an update and
    a step's seconds."""
    n_buckets, step_seconds = shape
    stream = random.Random(derive_seed(seed, "swarm.kill_job"))
    if stream.random() >= KILL_JOB_SHARE:
        return loop, faults, 0.0
    loop = dataclasses.replace(loop, save_interval=stream.choice(SAVE_INTERVALS))
    steps = loop.steps
    step = stream.randint(1, max(1, steps - 2))
    how = stream.choice(KILL_MOMENTS)
    if how == "at":
        keys: dict[str, object] = {"at": stream.uniform(0.5, steps - 1.5) * step_seconds}
    elif how in ("step_begin", "before_allreduce"):
        keys = {"point": how, "step": step}
    elif how == "after_bucket":
        keys = {"point": how, "bucket": stream.randrange(n_buckets), "after_step": step - 1}
    else:  # mid_generation, during_save: the first such moment once that step committed
        keys = {"point": how, "after_step": step - 1}
    restart = timing.job_restart_seconds + save_seconds(world, timing) + 2 * step_seconds
    return loop, [*_without_heal_kills(faults), make_fault("kill_job", **keys)], restart


def _without_heal_kills(faults: list[AnyFault]) -> list[AnyFault]:
    """The faults but each cell killed while it is healed, and that cell's start after it
    (the swarm's motif: the kill armed after step s, the start as step s + 3 begins)."""
    kills = [
        f for f in faults if f.kind is FaultKind.KILL_CELL and f.point is FaultPoint.DURING_HEAL
    ]
    starts = {(f.cell, f.when.after_step + 3) for f in kills}  # type: ignore[attr-defined]

    def paired(f: AnyFault) -> bool:
        step = getattr(f.when, "step", None)
        return f.kind is FaultKind.START_CELL and (f.cell, step) in starts  # type: ignore[attr-defined]

    kept = [i for i, f in enumerate(faults) if f not in kills and not paired(f)]
    place = {old: new for new, old in enumerate(kept)}
    return [_renumbered(faults[i], place) for i in kept]


def _renumbered(fault: AnyFault, place: dict[int, int]) -> AnyFault:
    """``after = {fault = N}`` pointing at the same fault once some before it are gone."""
    when = fault.when
    if not isinstance(when, After) or when.fault is None:
        return fault
    return dataclasses.replace(fault, when=dataclasses.replace(when, fault=place[when.fault]))


__all__ = ["KILL_JOB_SHARE", "kill_job"]
