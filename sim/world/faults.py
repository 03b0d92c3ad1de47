"""The simulator's fault actions: what each fault kind does to the simulated cluster.

When a fault fires (miles_core.scenario.schedule decides when), the simulated
world acts and records nothing: a killed cell simply dies (the control plane
finds out from its calls and heartbeats, as it would on a real cluster); a
killed engine's exit, a restarted engine and a started cell are reported by the
cluster itself, as Ray reports a dead or new actor; an impairment changes how
long things take or whether the router answers. A kill at a named point strikes
at once: in virtual time the point is now.
"""

from __future__ import annotations

from miles_core.kinds import FaultPoint
from miles_core.scenario.actions import Impairment, impaired_part
from miles_core.scenario.faults import make_fault
from miles_core.scenario.schedule import FaultSchedule
from sim.world.cluster import SimCluster
from sim.world.delta_transport import arm_delta_fault

Fault = make_fault
"""A fault from the keys a scenario file uses, e.g. ``Fault("kill_cell", cell=1, at=3.0)``."""
ScheduledFaults = FaultSchedule
POINTS = tuple(p.value for p in FaultPoint)


class SimFaultActions:
    """The FaultActions of the simulated cluster."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def kill_cell(self, cell: int, point: FaultPoint | None) -> None:
        del point
        self.cluster.kill_cell(cell)

    def start_cell(self, cell: int) -> None:
        self.cluster.start_cell(cell)

    def kill_rank(self, cell: int, rank: int, point: FaultPoint | None) -> None:
        """The simulated cell is one unit: a rank's death leaves it dead to every call, as a
        real cell is killed whole once a rank is lost (its cell-mates would wait in its
        collectives)."""
        del rank, point
        self.cluster.kill_cell(cell)

    def fail_rank(self, cell: int, rank: int) -> None:
        del rank
        self.cluster.fail_rank(cell)

    def raise_holding_lock(self, cell: int, rank: int) -> None:
        self.cluster.transport.locks.raise_holding(cell, rank)

    def kill_engine(self, engine: str, point: FaultPoint | None) -> None:
        del point
        self.cluster.kill_engine(engine)

    def restart_engine(self, engine: str) -> None:
        self.cluster.restart_engine(engine)

    def hang_engine(self, engine: str) -> None:
        self.cluster.hang_engine(engine)

    def hang_call(self, engine: str, call: str) -> None:
        self.cluster.hang_call(engine, call)

    def delta_fault(self, kind: str, engine: str | None) -> None:
        """Arm disk-delta's transport (sim/world/delta_transport.py): the scenario's checks
        allow these faults only under disk-delta."""
        arm_delta_fault(self.cluster.transport, kind, engine)

    def orphan_engine(self, engine: str) -> None:
        self.cluster.orphan_engine(engine)

    def poison_prompt(self) -> None:
        self.cluster.poison_prompt()

    def lying_engine(self, engine: str) -> None:
        self.cluster.lying_engine(engine)

    def kill_job(self, point: FaultPoint | None) -> None:
        self.cluster.kill_job(point)

    def restart_driver(self, point: FaultPoint | None) -> None:
        self.cluster.restart_driver(point)

    def heal(self, engines: bool) -> tuple[int, ...]:
        return self.cluster.heal(engines)

    def impair(self, fault: Impairment) -> None:
        part, factor = impaired_part(fault)
        self.cluster.impair(part, factor, fault.duration)
