"""The swarm's draw of the miles profile (``--miles-profile``), from a stream of its own (the
rest of a seed's drawing is the same either way).

Most seeds run today's miles (the default); a share run miles at 31f1ca9, so a sweep keeps
judging both: every fault the seed drew then meets the old rollout side (a restarted engine
synced at once, the health timeout as the update's deadline) as well as the new one. A
command line's ``--miles-profile`` overrides the draw, as it overrides every loop flag.

Two kinds of world always run aug2026, as today's miles would fail them where the swarm
expects a completed run:

- one engine: a replacement waits out of rotation for the next update, which needs the batch
  only that engine could generate (docs/miles.md, "the rollout cell's life");
- with fault tolerance, cell faults drawn at times that strike every trainer cell (swarm
  seed 636): the swarm spaces them 4 steps apart, counting on a step boundary to heal the
  restarted cell into the quorum first; under today an aborted update stops every
  participant and the retry's window waits while the mini FT controller heals them one at a
  time (poll 10 s, resume delay 10 s: 26 s for two engines in seed 636), so the step
  boundary comes after the next drawn stop of the only live cell: NoAliveCellError, which
  aug2026 (the participants kept) survives. miles as read does the same (the aborted
  window's snapshot replaced, docs/miles.md "the rollout side's health"; the trainer's
  cells healed at a step's start), so it is a hazard of today's miles, not a bug here.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from miles_core.kinds import FaultKind
from miles_core.loop import LoopConfig
from miles_core.profile import MilesProfile
from miles_core.scenario import derive_seed
from miles_core.scenario.faults import AnyFault, AtTime

OLD_PROFILE_SHARE = 0.3
"""The share of the seeds that run the aug2026 profile."""


CELL_LOSSES = (FaultKind.KILL_CELL, FaultKind.STOP_CELL)


def every_cell_struck_at_times(
    loop: LoopConfig, num_cells: int, faults: Sequence[AnyFault]
) -> bool:
    """Whether, with fault tolerance, the cell losses drawn at times strike every cell."""
    struck = {f.cell for f in faults if isinstance(f.when, AtTime) and f.kind in CELL_LOSSES}
    return loop.use_fault_tolerance and struck >= set(range(num_cells))


def miles_profile(
    seed: int,
    loop: LoopConfig,
    num_engines: int,
    num_cells: int = 0,
    faults: Sequence[AnyFault] = (),
) -> LoopConfig:
    """The loop under the aug2026 profile in a share of the seeds, in every world of one
    engine and where ``every_cell_struck_at_times``, else as drawn."""
    stream = random.Random(derive_seed(seed, "swarm.miles_profile"))
    hazard = num_cells > 0 and every_cell_struck_at_times(loop, num_cells, faults)
    if stream.random() >= OLD_PROFILE_SHARE and num_engines > 1 and not hazard:
        return loop
    return dataclasses.replace(loop, miles_profile=MilesProfile.AUG2026)
