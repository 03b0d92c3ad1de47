"""One swarm seed's drawing state (sim/search/swarm.py draws with it; sim/search/aim.py aims
with it): its random stream, the run's shape, and the faults drawn so far."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from miles_core.scenario import WorldShape
from miles_core.scenario.faults import HUNG_CALLS, AnyFault


@dataclass
class Draw:
    """One seed's drawing state: its stream, the run's shape, what it drew so far."""

    rng: random.Random
    world: WorldShape
    steps: int
    n_buckets: int
    step_seconds: float
    fault_phase: float
    faults: list[AnyFault]
    killed_cells: set[int]
    fault_tolerance: bool = False
    samples_per_step: int = 1
    health_interval: float = 0.0
    """--rollout-health-check-interval of the seed (with fault tolerance)."""
    calls: tuple[str, ...] = HUNG_CALLS
    """The control calls an update makes to each engine (no flush under in_place)."""
    relative: random.Random = dataclasses.field(default_factory=lambda: random.Random(0))
    """Whether a restart or start follows its kill by time or by event, and whether a hang is
    the process's or one call's (its own stream, so the rest of the drawing is the same)."""
    health_timeout: float = 0.0
    """--rollout-health-check-timeout of the seed (with fault tolerance)."""
    slow_updates: bool = False
    """The seed's weight updates outlast the health check's timeout (``_slow_updates``)."""

    def slots(self, count: int, spacing: int = 4) -> list[int]:
        """Steps at which to strike, ``spacing`` apart, inside the fault phase."""
        last = min(int(0.6 * self.steps), self.steps - 4)  # room for the restarts after
        free = list(range(1, last + 1, spacing))
        self.rng.shuffle(free)
        return sorted(free[:count])
