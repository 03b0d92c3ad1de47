"""The Ray world's fault actions: what each fault kind does to real processes.

They act and record nothing; the world reports the effects the way it always
does (a dead engine actor through its watch, new processes once they answer, a
dead cell through its failing calls and unanswered heartbeats). A kill at a
named point strikes inside the call about to be made (``before_allreduce``:
the rank exits after its backward pass; ``mid_generation``: the engine exits
halfway through the request); any other kill is ``ray.kill`` at once
(``during_recovery``: the process the recovery just created). A hang leaves the
process alive and answering nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import ray

from backends.common.session.ray_quiet import expect_exit
from backends.common.world.cluster import RayCluster
from backends.common.world.delta_transport import DiskDeltaTransport
from backends.common.world.trainer import EXIT, RAISE
from miles_core.kinds import FaultPoint
from miles_core.scenario.actions import Impairment, impaired_part


class RayFaultActions:
    """The FaultActions of the Ray world. ``announce`` is told of each kill before it
    happens (so that the CLI can say that the Ray messages about a dead worker are it)."""

    def __init__(self, cluster: RayCluster, announce: Callable[[str], None] = lambda text: None):
        self.cluster = cluster
        self.announce = announce

    def kill_cell(self, cell: int, point: FaultPoint | None) -> None:
        self.announce(f"cell {cell}'s processes")
        expect_exit(self.cluster.cells[cell].ranks)  # Ray's alarm about them is not printed
        if point is FaultPoint.BEFORE_ALLREDUCE:  # RayCell.train passes it into the call
            self.cluster.cells[cell].doomed = dict.fromkeys(
                range(len(self.cluster.cells[cell].ranks)), EXIT
            )
        else:
            self.cluster.cells[cell].kill()

    def kill_rank(self, cell: int, rank: int, point: FaultPoint | None) -> None:
        """That rank's process alone; its cell-mates wait in the cell's collectives until a
        call finds the dead rank and the cell is killed whole (RayCell.call_each)."""
        ranks = self.cluster.cells[cell].ranks
        self.announce(f"rank {rank} of cell {cell}'s processes")
        expect_exit(ranks[rank : rank + 1])
        if point is FaultPoint.BEFORE_ALLREDUCE:
            self.cluster.cells[cell].doomed[rank] = EXIT
        elif rank < len(ranks):
            ray.kill(ranks[rank], no_restart=True)

    def fail_rank(self, cell: int, rank: int) -> None:
        """That rank raises in the step about to exchange; the cell is failed and killed at
        once (RayCell._isolated), as miles kills a cell whose actors raised (#1443)."""
        self.cluster.cells[cell].doomed[rank] = RAISE

    def start_cell(self, cell: int) -> None:
        self.cluster.start_cell(cell)

    def kill_engine(self, engine: str, point: FaultPoint | None) -> None:
        self.announce(f"{engine}'s process")
        self._expect_engine_exit(engine)
        if point is FaultPoint.MID_GENERATION:
            self.cluster.engines[engine].doomed = True  # RayRouter.generate sends the header
        else:
            self.cluster.engines[engine].kill()

    def restart_engine(self, engine: str) -> None:
        self.announce(f"{engine}'s process, to start a new one")
        self._expect_engine_exit(engine)
        self.cluster.restart_engine(engine)

    def _expect_engine_exit(self, engine: str) -> None:
        actor = self.cluster.engines[engine].actor
        expect_exit([] if actor is None else [actor])

    def hang_engine(self, engine: str) -> None:
        self.cluster.engines[engine].hang()

    def poison_prompt(self) -> None:
        """The next prompt asked for is sent longer than the engines' context."""
        self.cluster.router.poison_armed = True

    def orphan_engine(self, engine: str) -> None:
        """The actor lost, its server left running and listed in the router."""
        self.cluster.engines[engine].orphan()

    def hang_call(self, engine: str, call: str) -> None:
        """Ordered now, in effect a Ray call later (milliseconds): an HTTP call already on its
        way may still be answered, as a process that hangs a moment later would answer it."""
        self.cluster.spawn(self.cluster.engines[engine].hang_call(call), f"hang-call-{engine}")

    def delta_fault(self, kind: str, engine: str | None) -> None:
        """disk-delta (world/delta_transport.py): a torn file is the transport's to make; the
        others arm the engine's next pull, a Ray call later (the scenario's checks allow
        these only under disk-delta)."""
        transport = self.cluster.transport
        if kind == "delta_torn":
            assert isinstance(transport, DiskDeltaTransport)
            transport.tear_next = True
            return
        assert engine is not None
        fault = kind.removeprefix("delta_")
        self.cluster.spawn(self.cluster.engines[engine].arm_delta_fault(fault), f"{kind}-{engine}")

    def raise_holding_lock(self, cell: int, rank: int) -> None:
        """Ordered now, in effect a Ray call later (milliseconds): the rank takes its cell's
        weight-update ticket lock, raises in it and lives on (RayCell.raise_holding_lock;
        backends/common/wire/cell_lock.py)."""
        target = self.cluster.cells[cell].raise_holding_lock(rank)
        self.cluster.spawn(target, f"raise-holding-lock-{cell}-{rank}")

    def lying_engine(self, engine: str) -> None:
        """Ordered now, in effect a Ray call later (milliseconds), as hang_call."""
        self.cluster.spawn(self.cluster.engines[engine].lie(), f"lie-{engine}")

    def restart_driver(self, point: FaultPoint | None) -> None:
        """The driver's loop dies alone, every Ray actor up (run/driver_restart.py)."""
        self.announce("the driver's loop, to start a new one over the same processes")
        self.cluster.restart_driver(point)

    def heal(self, engines: bool) -> tuple[int, ...]:
        """Liveness mode's heal: impairments end; dead or hung engines get a new process."""
        self.cluster.end_impairments()
        if engines:
            for engine in self.cluster.engines.values():
                if engine.needs_restart():
                    self.restart_engine(engine.id)
        return tuple(i for i, cell in self.cluster.cells.items() if not cell.ranks)

    def impair(self, fault: Impairment) -> None:
        part, factor = impaired_part(fault)
        self.cluster.impair(part, factor, fault.duration)
