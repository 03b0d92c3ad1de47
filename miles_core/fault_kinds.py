"""Every fault kind in one row: its scenario type, what the world does when it fires, its
witness, where it may strike (its cells of the coverage map), whether it takes a cell down,
and the swarm draw that makes it.

A kind's parts live where their concept does (the type in miles_core/scenario/faults.py,
the act in scenario/actions.py, the witness in witness/effects.py, the draws in
sim/search/); this table is the one place that names them together, and what the
schedule dispatches on (a kind's act, whether it takes a cell down).
tests/test_fault_kinds.py holds every kind to a complete row, each part to the code that
uses it, and the swarm to drawing every kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.coverage import AT_TIME
from miles_core.kinds import FaultKind
from miles_core.scenario import actions
from miles_core.scenario.actions import Act
from miles_core.scenario.faults import (
    DelayRouter,
    DeltaAppliedTwice,
    DeltaSkipped,
    DeltaTorn,
    DropHeartbeat,
    FailRank,
    FailRouter,
    FaultSpec,
    HangCall,
    HangEngine,
    KillCell,
    KillEngine,
    KillJob,
    KillRank,
    LyingEngine,
    OrphanEngine,
    Partition,
    PoisonPrompt,
    RaiseHoldingLock,
    RestartDriver,
    RestartEngine,
    SlowCell,
    SlowLink,
    SlowStart,
    StartCell,
    StopCell,
)
from miles_core.witness import delta, effects
from miles_core.witness.effects import Witness


@dataclass(frozen=True)
class FaultRow:
    kind: FaultKind
    spec: type[FaultSpec]
    """Its type in a scenario (``kind = "..."`` in a file)."""
    act: Act
    """What the schedule has the world do when one fires."""
    witness: Witness
    """What its effect looks like in a history (fault_witness, until_witnessed)."""
    swarm: str
    """The swarm's draw that makes it: ``module:function`` under sim/search/."""
    takes_a_cell_down: bool = False
    """It takes a cell out of its quorum (its processes die or stop answering)."""
    caught_by: str | None = None
    """The oracle that must fail a run with it: a fault no control plane gets past (a
    field bug of the engines'), which the soak never draws and the swarm draws in a share
    of its seeds with ``expect.caught_by`` set from this (sim/search/swarm_field_bugs.py,
    where a form the control plane survives expects no catch). None: one the control
    plane must survive."""

    @property
    def hows(self) -> frozenset[str]:
        """How it may be scheduled: its points and ``at_time`` (the coverage map's cells of
        this kind are these, by loop phase)."""
        return frozenset(AT_TIME if p is None else p.value for p in self.spec.points)


ROWS: tuple[FaultRow, ...] = (
    FaultRow(
        FaultKind.KILL_CELL,
        KillCell,
        actions.kill_cell,
        effects.cell_killed,
        "swarm:_cells_at_points",
        takes_a_cell_down=True,
    ),
    FaultRow(
        FaultKind.KILL_RANK,
        KillRank,
        actions.kill_rank,
        effects.cell_killed,
        "swarm:_cell_or_rank_fault",
        takes_a_cell_down=True,
    ),
    FaultRow(
        FaultKind.FAIL_RANK,
        FailRank,
        actions.fail_rank,
        effects.cell_killed,
        "swarm:_cell_or_rank_fault",
        takes_a_cell_down=True,
    ),
    FaultRow(
        FaultKind.STOP_CELL,
        StopCell,
        actions.kill_cell,
        effects.cell_killed,
        "swarm:_cells_at_times",
        takes_a_cell_down=True,
    ),
    FaultRow(
        FaultKind.START_CELL,
        StartCell,
        actions.start_cell,
        effects.cell_started,
        "swarm:_cells_at_points",
    ),
    FaultRow(
        FaultKind.SLOW_CELL, SlowCell, actions.impair, effects.cell_slowed, "swarm:_impairments"
    ),
    FaultRow(
        FaultKind.DROP_HEARTBEAT,
        DropHeartbeat,
        actions.impair,
        effects.heartbeat_dropped,
        "swarm:_lost_heartbeats",
        takes_a_cell_down=True,
    ),
    FaultRow(
        FaultKind.KILL_ENGINE,
        KillEngine,
        actions.kill_engine,
        effects.engine_killed,
        "swarm:_engines_at_points",
    ),
    FaultRow(
        FaultKind.RESTART_ENGINE,
        RestartEngine,
        actions.restart_engine,
        effects.engine_restarted,
        "swarm:_engines_at_times",
    ),
    FaultRow(
        FaultKind.HANG_ENGINE,
        HangEngine,
        actions.hang_engine,
        effects.engine_hung,
        "swarm:_engines_at_points",
    ),
    FaultRow(
        FaultKind.HANG_CALL,
        HangCall,
        actions.hang_call,
        effects.engine_hung,
        "swarm:_engines_at_points",
    ),
    FaultRow(
        FaultKind.ORPHAN_ENGINE,
        OrphanEngine,
        actions.orphan_engine,
        effects.engine_orphaned,
        "swarm:_orphan",
    ),
    FaultRow(
        FaultKind.POISON_PROMPT,
        PoisonPrompt,
        actions.poison_prompt,
        effects.prompt_refused,
        "swarm:_poison",
    ),
    FaultRow(
        FaultKind.SLOW_START,
        SlowStart,
        actions.impair,
        effects.start_slowed,
        "swarm:_engines_at_times",
    ),
    FaultRow(
        FaultKind.SLOW_LINK, SlowLink, actions.impair, effects.link_slowed, "swarm:_impairments"
    ),
    FaultRow(FaultKind.PARTITION, Partition, actions.impair, effects.link_cut, "swarm:_partition"),
    FaultRow(
        FaultKind.DELAY_ROUTER,
        DelayRouter,
        actions.impair,
        effects.router_delayed,
        "swarm:_impairments",
    ),
    FaultRow(
        FaultKind.FAIL_ROUTER,
        FailRouter,
        actions.impair,
        effects.router_failed,
        "swarm:_impairments",
    ),
    FaultRow(
        FaultKind.LYING_ENGINE,
        LyingEngine,
        actions.lying_engine,
        effects.engine_lied,
        "swarm_field_bugs:field_bug",
        caught_by="published_weights",
    ),
    # disk-delta's faults act only on a disk-delta run's files, which the soak never draws
    # (the swarm's field bugs switch a seed to disk-delta); the engine's own checksum
    # refuses a torn file (the history shows the refusal), the weights oracle catches what
    # no check sees (a skip, xor applied twice)
    FaultRow(
        FaultKind.DELTA_APPLIED_TWICE,
        DeltaAppliedTwice,
        actions.delta_fault,
        delta.delta_pulled,
        "swarm_field_bugs:field_bug",
        caught_by="published_weights",
    ),
    FaultRow(
        FaultKind.DELTA_SKIPPED,
        DeltaSkipped,
        actions.delta_fault,
        delta.delta_pulled,
        "swarm_field_bugs:field_bug",
        caught_by="published_weights",
    ),
    FaultRow(
        FaultKind.DELTA_TORN,
        DeltaTorn,
        actions.delta_fault,
        delta.delta_refused,
        "swarm_field_bugs:field_bug",
        caught_by="the engine's checksum (/pull_weights refused; fault_witness reads it)",
    ),
    FaultRow(
        FaultKind.KILL_JOB, KillJob, actions.kill_job, effects.job_killed, "swarm_kill:kill_job"
    ),
    FaultRow(
        FaultKind.RESTART_DRIVER,
        RestartDriver,
        actions.restart_driver,
        effects.driver_restarted,
        "swarm_driver:restart_driver",
    ),
    FaultRow(
        FaultKind.RAISE_HOLDING_LOCK,
        RaiseHoldingLock,
        actions.raise_holding_lock,
        effects.lock_kept,
        "swarm_field_bugs:field_bug",
        caught_by="liveness",
    ),
)
BY_KIND: Mapping[FaultKind, FaultRow] = {row.kind: row for row in ROWS}

TAKES_A_CELL_DOWN = frozenset(row.kind for row in ROWS if row.takes_a_cell_down)
"""The fault kinds that take a cell out of its quorum (its processes die or stop answering)."""

CAUGHT = frozenset(row.kind for row in ROWS if row.caught_by is not None)
"""The fault kinds no control plane survives, each caught by its oracle (the soak never draws
them; the swarm does, expecting the catch: sim/search/swarm_field_bugs.py)."""
