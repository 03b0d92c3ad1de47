"""The swarm's restart_driver: in a share of its seeds the driver (the loop and what it holds
in memory) is lost once while trainers and engines stay up, and a new driver adopts them
(miles_core/loop/adopt.py), from a stream of its own (the rest of a seed's drawing is the
same either way).

Only where the job is not killed whole as well (a scenario with both is refused), not in
liveness mode (whose heal would have to span the adoption), not with a LoRA adapter (which a
new driver does not know the holders of: refused too), and only under today's miles:
hot restart is miles' after 31f1ca9 (miles/utils/hot_restart.py, 14aca060), so a seed that
drew the aug2026 profile runs as before.
"""

from __future__ import annotations

import random

from miles_core.loop import LoopConfig
from miles_core.scenario import derive_seed
from miles_core.scenario.faults import AnyFault, make_fault
from sim.world.driver_restart import DRIVER_RESTART_SECONDS

RESTART_DRIVER_SHARE = 0.1
"""The share of the eligible seeds whose driver is restarted once."""
MOMENTS = ("at", "step_begin", "after_bucket")


def restart_driver(
    seed: int,
    loop: LoopConfig,
    shape: tuple[int, float],
    faults: list[AnyFault],
) -> tuple[list[AnyFault], float]:
    """The faults with the driver's restart (none: unchanged), and the seconds the progress
    window needs more for it (the new driver's start and a step redone). ``shape``: the
    buckets of an update and a step's seconds."""
    n_buckets, step_seconds = shape
    stream = random.Random(derive_seed(seed, "swarm.restart_driver"))
    if stream.random() >= RESTART_DRIVER_SHARE or not loop.today or loop.lora_adapter:
        return faults, 0.0  # a new driver does not learn who holds an adapter (model.py)
    steps = loop.steps
    step = stream.randint(1, max(1, steps - 2))
    how = stream.choice(MOMENTS)
    if how == "at":
        keys: dict[str, object] = {"at": stream.uniform(0.5, steps - 1.5) * step_seconds}
    elif how == "step_begin":
        keys = {"point": how, "step": step}
    else:
        keys = {"point": how, "bucket": stream.randrange(n_buckets), "after_step": step - 1}
    restart = DRIVER_RESTART_SECONDS + 2 * step_seconds
    return [*faults, make_fault("restart_driver", **keys)], restart


__all__ = ["RESTART_DRIVER_SHARE", "restart_driver"]
