"""The simulated job's saves: a disk that outlives the job's processes, written by a cell.

A save is written by the first alive cell's processes (miles_core.loop.save): its weights and
two optimizer moments, at ``checkpoint_bytes_per_second`` (the rate a heal moves a checkpoint
at), the point ``during_save`` halfway. Writing one marks its step torn on the disk until
every byte is written and it is committed (miles counts a checkpoint once its tracker file
names it, written last): a save torn by a kill, even one that was overwriting a committed
save of the same step, is never read back (miles_core.saves.choose_save).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from miles_core.kinds import FaultPoint
from miles_core.saves import SaveState, StoredSave
from miles_core.scenario import TimeModel, WorldShape
from miles_core.scenario.schedule import FaultPoints
from sim.world.cells import SimCell


def save_seconds(world: WorldShape, timing: TimeModel) -> float:
    """How long a save takes to write, or to read back at a resume: the weights and two
    optimizer moments, as a heal moves them."""
    return 3 * world.param_bytes / timing.checkpoint_bytes_per_second


class SimDisk:
    """The job's save directory (miles' ``--save``): it survives a job's death."""

    def __init__(self) -> None:
        self.entries: dict[int, StoredSave] = {}

    def saves(self) -> tuple[StoredSave, ...]:
        return tuple(self.entries[step] for step in sorted(self.entries))


class SaveCluster(Protocol):
    """What a save sees of its cluster: the cell that writes it, the clock, the faults."""

    world: WorldShape
    timing: TimeModel
    faults: FaultPoints
    cells: Sequence[SimCell]


class SimCheckpoints:
    """The CheckpointStore of one simulated cluster, over the job's disk."""

    def __init__(self, cluster: SaveCluster, disk: SimDisk) -> None:
        self.cluster = cluster
        self.disk = disk

    def saves(self) -> tuple[StoredSave, ...]:
        return self.disk.saves()

    async def write(self, cell: int, state: SaveState) -> None:
        """Write the save from ``cell``'s processes; CellFailure if they die first (the save
        then stays torn)."""
        cluster = self.cluster
        process = cluster.cells[cell]
        self.disk.entries[state.step] = StoredSave(state, committed=False)  # overwritten now
        if process.dead:
            raise process.failure("dead: it could not write the save")
        half = save_seconds(cluster.world, cluster.timing) / 2
        if await process.work(half):
            raise process.failure(f"killed writing the save of step {state.step}")
        cluster.faults.fire(FaultPoint.DURING_SAVE, cell=cell, step=state.step)
        if process.dead or await process.work(half):
            raise process.failure(f"killed writing the save of step {state.step}")
        self.disk.entries[state.step] = StoredSave(state, committed=True)
