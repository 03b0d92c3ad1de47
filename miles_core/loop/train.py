"""The trainer role: a step's attempts on the quorum of alive cells, heals, cell failures.

Where each decision is made (the decisions themselves are miles_core.cells'):

- before every attempt the cell group refreshes: a changed membership is a new
  quorum, and every pending cell is healed from the first alive cell; a heal
  that fails changes the membership again, so refresh repeats until stable;
- the attempt runs on every alive cell, each exchanging gradients with exactly
  the attempt's cells; each cell reports its outcome (recorded as CellTrained),
  and the cell group retries or commits;
- a failed cell is marked errored and its processes are stopped, so a cell
  that was only suspected (missed heartbeats) cannot come back as a zombie;
- new processes that the world reports for a stopped cell make it pending: it
  is healed at the next refresh.
"""

from __future__ import annotations

from collections.abc import Sequence

from miles_core.backend import CellFailure, TrainReport
from miles_core.buffer import Group
from miles_core.cells import CellState, Decision, Heal, Outcome
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    CellStarted,
    CellTrained,
    GroupTrained,
    HealBegan,
    HealEnded,
    QuorumChanged,
    StepBegan,
    StepCommitted,
)
from miles_core.loop.context import RunContext


class Trainer:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._errors: dict[int, str] = {}
        """Why each cell of the attempt running now errored, as its world said (the
        record of its stop names it: a death, or an exception miles' ``_execute_raw``
        isolates in that cell)."""

    # -- cells -------------------------------------------------------------------------

    def cell_failed(self, cell: int, reason: str, kill: bool = True) -> None:
        """Mark a cell errored and stopped; ``kill`` its processes (not when new ones
        already replaced them)."""
        ctx = self.ctx
        state = ctx.cells.state(cell)
        if state in (CellState.PENDING, CellState.STOPPED):
            return  # already stopped (and maybe restarting): old news about a dead process
        if state is not CellState.ERRORED:  # an errored attempt marked it already
            ctx.cells.mark_failed(cell, reason)
        ctx.cells.stop(cell, reason)
        if kill:
            ctx.cluster.cell(cell).stop()
        ctx.record_cells()

    def cell_started(self, cell: int, incarnation: int, how: str) -> None:
        """The world reports new processes for ``cell``: they are healed at the next refresh."""
        ctx = self.ctx
        ctx.emit(CellStarted, cell=cell, incarnation=incarnation, how=how)
        ctx.connections.cell_replaced(cell)
        state = ctx.cells.state(cell)
        if state is CellState.ALIVE:  # replaced behind our back: the state it held is gone
            self.cell_failed(cell, f"its processes were replaced ({how})", kill=False)
            state = ctx.cells.state(cell)
        if state in (CellState.ERRORED, CellState.STOPPED):
            ctx.cells.restart(cell, f"new processes: {how}")
            ctx.record_cells()

    # -- heals ---------------------------------------------------------------------------

    async def _heal(self, heal: Heal, quorum_id: int) -> bool:
        ctx = self.ctx
        ctx.emit(
            HealBegan,
            quorum_id=quorum_id,
            src_cell=heal.src_cell,
            dst_cell=heal.dst_cell,
            src_ranks=heal.src_ranks,
            dst_ranks=heal.dst_ranks,
        )
        try:
            await ctx.cluster.cell(heal.dst_cell).heal(heal)
        except CellFailure as failure:
            if failure.cell == heal.src_cell:
                self.cell_failed(heal.src_cell, f"died sending a checkpoint: {failure.reason}")
            else:
                ctx.cells.heal_failed(heal.dst_cell, failure.reason)
                self.cell_failed(heal.dst_cell, failure.reason)
            ctx.emit(HealEnded, dst_cell=heal.dst_cell, ok=False)
            return False
        ctx.cells.heal_done(heal.dst_cell)
        ctx.record_cells()
        ctx.emit(HealEnded, dst_cell=heal.dst_cell, ok=True)
        return True

    async def refresh(self) -> None:
        """Refresh until the quorum is stable. A reconfiguration pauses the heartbeat checker
        until the refresh ends, and its end restarts every cell's count of misses, as miles'
        ``_refresh_cells`` pauses and resumes its checkers around the cooperative prepare."""
        ctx = self.ctx
        ctx.monitor_paused += 1
        reconfigured = False
        try:
            while True:
                plan = ctx.cells.refresh()
                ctx.record_cells()
                if plan.reconfigure:
                    ctx.emit(QuorumChanged, quorum_id=plan.quorum_id, members=plan.members)
                    ctx.connections.reconfigured(plan.members)
                    if not reconfigured:
                        reconfigured = True
                        ctx.heartbeats_paused += 1
                healed = [await self._heal(heal, plan.quorum_id) for heal in plan.heals]
                if all(healed):
                    return
        finally:
            ctx.monitor_paused -= 1
            if reconfigured:
                ctx.heartbeats_paused -= 1
                ctx.heartbeat_resumes += 1

    # -- a step ------------------------------------------------------------------------------

    async def _train_on(
        self, cell: int, step: int, attempt: int, batch: Sequence[Group], cells: tuple[int, ...]
    ) -> Outcome:
        ctx = self.ctx
        try:
            report: TrainReport = await ctx.cluster.cell(cell).train(step, attempt, batch, cells)
        except CellFailure as failure:
            self._errors[cell] = failure.reason
            return Outcome.ERRORED
        ctx.emit(
            CellTrained,
            cell=cell,
            step=step,
            attempt=attempt,
            outcome=report.outcome,
            exchange=report.exchange,
            seconds=report.seconds,
        )
        return report.outcome

    async def train(self, step: int, batch: list[Group]) -> None:
        """Attempts of ``step`` until one commits (the cell group bounds the attempts)."""
        ctx = self.ctx
        ctx.emit(StepBegan, step=step)
        while True:
            await self.refresh()
            attempt = ctx.cells.begin_attempt(step)
            ctx.emit(
                AttemptBegan,
                step=step,
                attempt=attempt.attempt,
                quorum_id=attempt.quorum_id,
                cells=attempt.cells,
            )
            tasks = [
                ctx.rt.spawn(
                    self._train_on(c, step, attempt.attempt, batch, attempt.cells), f"train-{c}"
                )
                for c in attempt.cells
            ]
            outcomes = await ctx.rt.wait_all(tasks)
            result = ctx.cells.finish_attempt(dict(zip(attempt.cells, outcomes, strict=True)))
            for cell in result.errored:
                why = self._errors.pop(cell, "")
                reason = f"step {step} attempt {attempt.attempt} errored"
                self.cell_failed(cell, f"{reason}: {why}" if why else reason)
            ctx.emit(
                AttemptEnded,
                step=step,
                attempt=attempt.attempt,
                decision=result.decision,
                normal=result.normal,
                discarded=result.discarded,
                errored=result.errored,
            )
            if result.decision is Decision.COMMIT:
                break
        ctx.emit(StepCommitted, step=step, attempt=attempt.attempt, n_groups=len(batch))
        for group in batch:
            ctx.emit(GroupTrained, group_id=group.group_id, prompt_id=group.prompt_id, step=step)
