"""Swarm testing: each seed draws its own cluster, flags, fault mix and fault rates.

Faults happen in a fault phase (the first ~60 % of the run's expected virtual
time); a quiet phase follows in which progress must resume (the progress
oracle). The budget keeps at least one cell and one engine alive: kills of
cells are spaced further apart than detection plus healing takes, and every
killed component is restarted. ``total_loss=True`` instead kills every cell
and expects the run to end with a clear error.
"""

from __future__ import annotations

import random

from miles_core.buffer import UnusedHandler
from miles_core.loop import LoopConfig
from miles_core.transfer import TransferMode
from sim.cluster import SimConfig
from sim.faults import Fault
from sim.run import Scenario
from sim.runtime import derive_seed

SWARM = "swarm"
SWARM_TOTAL_LOSS = "swarm_total_loss"


def swarm_scenario(seed: int, steps: int = 12, total_loss: bool = False) -> Scenario:
    """The scenario that ``seed`` draws (the run itself then uses the same seed)."""
    rng = random.Random(derive_seed(seed, "swarm"))
    sim = SimConfig(
        num_cells=rng.choice([2, 3, 4]),
        num_engines=rng.choice([1, 2, 3, 4]),
        gpus_per_node=rng.choice([1, 2, 8]),
    )
    mode = rng.choice(["fully_async", "fully_async", "one_step_off"])
    capacities = [0.5, 1.0, 2.0, 4.0] if mode == "fully_async" else [1.0, 2.0, 4.0]
    loop = LoopConfig(
        steps=steps,
        mode=mode,
        rollout_batch_size=rng.choice([2, 4, 8]),
        n_samples_per_prompt=rng.choice([1, 2, 4]),
        max_weight_staleness=rng.choice([None, 0, 1, 2, 4]),
        unused_samples_handler=rng.choice(list(UnusedHandler)),
        capacity_factor=rng.choice(capacities),
        in_flight_groups=rng.choice([None, 2, 8, 16]),
        update_weight_buffer_size=rng.choice([8, 16, 64]) * 1024**2,
        transfer_mode=rng.choice([TransferMode.BROADCAST, TransferMode.P2P]),
        heartbeat_interval=2.0,
        heartbeat_timeout=1.0,
        heartbeat_failure_threshold=3,
    )
    step_seconds = sim.train_step_seconds + sim.allreduce_seconds + 1.0
    fault_phase = 0.6 * steps * step_seconds
    faults: list[Fault] = []
    if total_loss:
        t = rng.uniform(0.1, 0.5) * fault_phase
        faults += [Fault("kill_cell", cell=c, at=t + c * 0.1) for c in range(sim.num_cells)]
        return Scenario(SWARM_TOTAL_LOSS, "every cell dies", sim, loop, tuple(faults))

    rate = rng.choice([0.5, 1.0, 2.0])  # faults per kind in the fault phase, on average
    gap = 4 * step_seconds  # longer than detection + restart + heal

    def times(kind_rate: float, spacing: float = 0.0) -> list[float]:
        chosen: list[float] = []
        for _ in range(rng.randint(0, round(2 * kind_rate * rate))):
            t = rng.uniform(0.0, fault_phase)
            if all(abs(t - other) > spacing for other in chosen):
                chosen.append(t)
        return sorted(chosen)

    for t in times(1.0, spacing=gap):
        cell = rng.randrange(sim.num_cells)
        faults += [
            Fault("kill_cell", cell=cell, at=t),
            Fault("start_cell", cell=cell, at=t + rng.uniform(0.5, step_seconds)),
        ]
    for t in times(1.0, spacing=gap):
        engine = f"engine-{rng.randrange(sim.num_engines)}"
        if rng.random() < 0.5:
            faults.append(Fault("restart_engine", engine=engine, at=t))
        else:
            faults += [
                Fault("kill_engine", engine=engine, at=t),
                Fault("restart_engine", engine=engine, at=t + rng.uniform(1.0, step_seconds)),
            ]
    for t in times(0.5):
        faults.append(
            Fault(
                "slow_cell",
                cell=rng.randrange(sim.num_cells),
                at=t,
                duration=rng.uniform(1, 20),
                factor=rng.uniform(1, 5),
            )
        )
    for t in times(0.5):
        faults.append(
            Fault("slow_link", at=t, duration=rng.uniform(1, 20), factor=rng.uniform(1, 100))
        )
    for t in times(0.5):
        faults.append(
            Fault("delay_router", at=t, duration=rng.uniform(1, 10), seconds=rng.uniform(0.1, 3))
        )
    for t in times(0.3):
        faults.append(Fault("fail_router", at=t, duration=rng.uniform(0.5, 5)))
    faults.sort(key=lambda f: f.at or 0.0)
    description = f"{len(faults)} faults drawn by seed {seed}"
    return Scenario(SWARM, description, sim, loop, tuple(faults), progress_window=8 * step_seconds)
