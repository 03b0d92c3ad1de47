"""miles' mini FT controller (--mini-ft-controller-enable): a stopped cell comes back on its own.

miles runs it in the driver (miles/utils/ft_utils/mini_ft_controller.py, ``_MiniFTController``):
every --mini-ft-controller-poll-interval (10 s, less the time the poll took) it reads every
cell's health from the control server and heals each unhealthy cell in turn, outside its
backoff: PATCH suspend (``RayTrainCell.stop`` kills the cell's actors), sleep
--mini-ft-controller-resume-delay (10 s), PATCH resume (the cell becomes pending); the next
step's ``_refresh_cells`` creates its actors and heals it from a live cell. A cell is
unhealthy when its Healthy condition is False (it errored, or its heartbeats failed) or it is
suspended (``_compute_cell_snapshot``); a healed cell is not tried again for resume_delay,
and a failed heal backs off 5 x 2^n s, at most 300 s (``_heal``). Here:

- unhealthy: ERRORED or STOPPED. The loop stops a cell as soon as it errs (miles'
  ``_execute_raw`` with kill_on_failure) or its heartbeats fail, so the suspend has most
  often been done; an ERRORED cell found here is stopped first;
- resume: the controller asks the world for the cell's new processes
  (``Cluster.start_cell``, recorded as CellRestartAsked); the world reports them
  (CellStarted), which makes the cell pending, and the next refresh heals it. miles creates
  the actors in that refresh, so their start holds the step; here it overlaps the step (the
  simulator starts a cell at once, so only a real world's start differs);
- a cell whose start is under way (asked, not yet reported) is not resumed again: miles' cell
  is pending by then, which is not unhealthy; asking again would replace the start under way,
  for ever if a start takes longer than a poll;
- one heal at a time, the poll waiting for each, as miles awaits ``_heal`` in its loop;
- the backoff is forgotten once the cell is no longer unhealthy, as miles drops stale keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.backend import CellFailure
from miles_core.cells import CellState
from miles_core.events import CellRestartAsked
from miles_core.loop.context import RunContext
from miles_core.loop.train import Trainer

UNHEALTHY = frozenset({CellState.ERRORED, CellState.STOPPED})
FAILED_HEAL_BACKOFF_S = 5.0
"""A failed heal waits this x 2^failures before the next try (miles' ``_heal``)..."""
MAX_BACKOFF_S = 300.0
"""... and never more than this."""


@dataclass
class _Backoff:
    failures: int = 0
    next_attempt_at: float = 0.0


class CellController:
    def __init__(self, ctx: RunContext, trainer: Trainer) -> None:
        self.ctx = ctx
        self.trainer = trainer
        self._backoffs: dict[int, _Backoff] = {}
        self._starting: set[int] = set()
        """Cells whose new processes were asked for and not yet reported."""

    def started(self, cell: int) -> None:
        """The world reported new processes for the cell: its start is no longer under way."""
        self._starting.discard(cell)

    async def run(self) -> None:
        ctx = self.ctx
        poll = ctx.config.mini_ft_controller_poll_interval
        while not ctx.stopping:
            began = ctx.rt.now()
            await self._poll()
            await ctx.rt.sleep(max(0.0, poll - (ctx.rt.now() - began)))

    async def poll(self) -> None:
        """One look at the cells, healing each unhealthy one in turn (today's controller
        polls them in its own loop, rollout_cell_controller.py)."""
        await self._poll()

    async def _poll(self) -> None:
        ctx = self.ctx
        unhealthy = [
            c
            for c in range(ctx.cells.num_cells)
            if ctx.cells.state(c) in UNHEALTHY and c not in self._starting
        ]
        for cell in unhealthy:
            backoff = self._backoffs.setdefault(cell, _Backoff())
            if ctx.rt.now() >= backoff.next_attempt_at and not ctx.stopping:
                await self._heal(cell, backoff)
        for cell in set(self._backoffs) - set(unhealthy):
            del self._backoffs[cell]

    async def _heal(self, cell: int, backoff: _Backoff) -> None:
        """Suspend, wait, resume (miles' ``_MiniFTController._heal``)."""
        ctx = self.ctx
        delay = ctx.config.mini_ft_controller_resume_delay
        suspended = ctx.rt.now()
        if ctx.cells.state(cell) is CellState.ERRORED:
            self.trainer.cell_failed(cell, "suspended by the FT controller")
        await ctx.rt.sleep(delay)
        if ctx.stopping or ctx.cells.state(cell) is not CellState.STOPPED:
            return  # the run ended, or the cell came back another way meanwhile
        reason = f"suspended {delay:g}s by the FT controller"
        ctx.emit(CellRestartAsked, cell=cell, suspended=suspended, reason=reason)
        self._starting.add(cell)
        try:
            ctx.cluster.start_cell(cell)
        except CellFailure:
            self._starting.discard(cell)
            backoff.failures += 1
            wait = min(FAILED_HEAL_BACKOFF_S * 2**backoff.failures, MAX_BACKOFF_S)
            backoff.next_attempt_at = ctx.rt.now() + wait
            return
        backoff.failures = 0
        backoff.next_attempt_at = ctx.rt.now() + delay
