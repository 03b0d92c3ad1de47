"""The swarm's draw of miles' mini FT controller (--mini-ft-controller-enable), from a stream of
its own (the rest of a seed's drawing is the same either way).

In a share of the seeds that draw no aim, no liveness mode and no job kill, the controller
is on and every start_cell the seed drew is dropped: the controller alone brings the cells
that died, stopped or lost their heartbeats back (miles_core/loop/cell_controller.py), after
a poll of 0.5-2 s and a delay of 0-2 s (miles' 10 s each, scaled to the small preset's 5 s
steps as its heartbeat is). Its return can come later than the dropped start would have,
which the progress window allows for. Not in a seed that aims a kill at a heal: that kill
is drawn for the heal the dropped start would have begun (after a given step), and the
controller's heal may come before it is armed; nor where a fault waits on a start.
"""

from __future__ import annotations

import dataclasses
import random

from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop import LoopConfig
from miles_core.scenario import WorldShape, derive_seed
from miles_core.scenario.faults import AnyFault
from sim.search.shrinker import kept

CONTROLLER_SHARE = 0.25
"""The share of the eligible seeds that run the controller."""
POLLS = (0.5, 1.0, 2.0)
DELAYS = (0.0, 0.5, 2.0)


def ft_controller(
    seed: int, loop: LoopConfig, world: WorldShape, faults: list[AnyFault]
) -> tuple[LoopConfig, list[AnyFault], float]:
    """The loop with the controller on or off, the faults it leaves, and the longest the
    controller adds before a cell comes back (its poll and its delay; 0 when off)."""
    stream = random.Random(derive_seed(seed, "swarm.controller"))
    drawn = stream.random() < CONTROLLER_SHARE
    poll, delay = stream.choice(POLLS), stream.choice(DELAYS)
    kept = _without_starts(faults)
    timed_to_a_start = any(f.point is FaultPoint.DURING_HEAL for f in faults)
    if not drawn or world.num_cells < 2 or kept is None or timed_to_a_start:
        return loop, faults, 0.0
    loop = dataclasses.replace(
        loop,
        mini_ft_controller_enable=True,
        mini_ft_controller_poll_interval=poll,
        mini_ft_controller_resume_delay=delay,
    )
    return loop, kept, poll + delay


def _without_starts(faults: list[AnyFault]) -> list[AnyFault] | None:
    """The faults but the starts, ``after = {fault = N}`` renumbered to the positions left
    (as drawn, before the swarm orders them); None if a fault waits on a start."""
    left = [i for i, f in enumerate(faults) if f.kind is not FaultKind.START_CELL]
    renumbered = kept(faults, left)
    return None if renumbered is None else list(renumbered)
