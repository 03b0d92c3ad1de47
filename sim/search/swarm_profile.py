"""The swarm's draw of the miles profile (``--miles-profile``), from a stream of its own (the
rest of a seed's drawing is the same either way).

Most seeds run today's miles (the default); a share run miles at 31f1ca9, so a sweep keeps
judging both: every fault the seed drew then meets the old rollout side (a restarted engine
synced at once, the health timeout as the update's deadline) as well as the new one. A
command line's ``--miles-profile`` overrides the draw, as it overrides every loop flag.
"""

from __future__ import annotations

import dataclasses
import random

from miles_core.loop import LoopConfig
from miles_core.profile import MilesProfile
from miles_core.scenario import derive_seed

OLD_PROFILE_SHARE = 0.3
"""The share of the seeds that run the aug2026 profile."""


def miles_profile(seed: int, loop: LoopConfig) -> LoopConfig:
    """The loop under the aug2026 profile in a share of the seeds, else as drawn."""
    stream = random.Random(derive_seed(seed, "swarm.miles_profile"))
    if stream.random() >= OLD_PROFILE_SHARE:
        return loop
    return dataclasses.replace(loop, miles_profile=MilesProfile.AUG2026)
