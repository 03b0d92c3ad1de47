"""The swarm's draw of the staleness policy (--staleness-policy), from a stream of its own
(the rest of a seed's drawing is the same either way).

In a share of the seeds that run fully async under a staleness bound, AReaL's gate at
submission replaces miles' drop at the buffer (miles_core/staleness_gate.py): the gate's
own counts, held through every fault the seed drew, are then judged by bounded_staleness
(nothing refused as stale after the gate armed). One-step-off and sync runs have no
producer running ahead, and a run without a bound has nothing for the gate to keep.
"""

from __future__ import annotations

import dataclasses
import random

from miles_core.loop import LoopConfig
from miles_core.scenario import derive_seed
from miles_core.staleness_gate import StalenessPolicy

GATE_SHARE = 0.3
"""The share of the eligible seeds that run the gate."""


def staleness_policy(seed: int, loop: LoopConfig) -> LoopConfig:
    """The loop under the gate in a share of the eligible seeds, else as drawn."""
    stream = random.Random(derive_seed(seed, "swarm.staleness_policy"))
    drawn = stream.random() < GATE_SHARE
    if not drawn or loop.mode != "fully_async" or loop.max_weight_staleness is None:
        return loop
    return dataclasses.replace(loop, staleness_policy=StalenessPolicy.GATE_SUBMISSION)
