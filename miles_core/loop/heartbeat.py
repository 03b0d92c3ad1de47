"""miles' trainer heartbeat checker: N missed heartbeats in a row fail a cell.

Each miss is recorded (HeartbeatMissed), so a dropped heartbeat is visible in
the history whether or not it led to a failure. The checker pauses while
weights are updated or cells healed, as miles' does, so that a busy cell is
not taken for a dead one, and while fewer than two cells are alive (failing
the last cell would only end the run sooner than its next call would).
"""

from __future__ import annotations

from miles_core.cells import CellState
from miles_core.events import HeartbeatMissed
from miles_core.loop.context import RunContext
from miles_core.loop.train import Trainer


class HeartbeatMonitor:
    def __init__(self, ctx: RunContext, trainer: Trainer) -> None:
        self.ctx = ctx
        self.trainer = trainer

    async def _answered(self, cell: int) -> bool:
        ctx = self.ctx
        reply = ctx.rt.spawn(ctx.cluster.cell(cell).heartbeat(), f"heartbeat-{cell}")
        timeout = ctx.rt.timer(ctx.config.heartbeat_timeout)
        answered = await ctx.rt.wait_any([reply, timeout]) == 0
        if not answered:
            reply.cancel("heartbeat timed out")
        return answered

    async def run(self, interval: float) -> None:
        ctx = self.ctx
        threshold = ctx.config.heartbeat_failure_threshold
        misses = dict.fromkeys(range(ctx.cells.num_cells), 0)
        while not ctx.stopping:
            await ctx.rt.sleep(interval)
            if ctx.monitor_paused or len(ctx.cells.alive()) < 2:
                continue
            for cell in ctx.cells.alive():
                sent = ctx.rt.now()
                answered = await self._answered(cell)
                if ctx.monitor_paused or ctx.cells.state(cell) is not CellState.ALIVE:
                    break
                misses[cell] = 0 if answered else misses[cell] + 1
                if not answered:
                    ctx.emit(HeartbeatMissed, cell=cell, misses=misses[cell], sent=sent)
                if misses[cell] >= threshold:
                    misses[cell] = 0
                    self.trainer.cell_failed(cell, f"missed {threshold} heartbeats")
