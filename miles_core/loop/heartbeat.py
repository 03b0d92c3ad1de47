"""miles' trainer heartbeat checker: N missed heartbeats in a row fail a cell.

Every alive cell is pinged at once, each with its own timeout, as miles' one
checker per cell does (miles/utils/ft_utils/health_checker.py,
SimpleHealthChecker); a round ends when all have answered or the timeout ran
out, and the next begins an interval later. A heartbeat the world refuses (the
process is dead: Ray refuses a call to a dead actor at once) is a miss then,
as miles counts a raised check (``test_rpc_error_propagates_as_unhealthy``); a
muted or hung cell's is a miss when the timeout runs out.

Each miss is recorded (HeartbeatMissed), so a dropped heartbeat is visible in
the history whether or not it led to a failure. As miles' checkers
(miles/ray/train/group.py ``_refresh_cells`` and ``update_weights``), it pauses
while a refresh reconfigures the cells, not while weights are updated (a busy
cell still answers), and the end of each pause starts every count of misses
afresh (``SimpleHealthChecker.resume``) after the first wait again
(--trainer-heartbeat-checker-first-wait: as miles' ``SimpleHealthChecker._loop``
sleeps first_wait, checks, then sleeps interval, the first round goes out that
long after the start, and after each resume the tick that follows it waits that
long before its round; 0 here by default, so the first round goes out at once and
a round after a resume at its tick, as in miles); a cell that is not alive counts as
answered (``cell_monitor.py``: its check returns at once), so a restarted cell
starts from no miss. It also pauses while fewer than two cells are alive
(failing the last cell would only end the run sooner than its next call would).
"""

from __future__ import annotations

from collections.abc import Awaitable

from miles_core.backend import CellFailure
from miles_core.cells import CellState
from miles_core.events import HeartbeatMissed
from miles_core.loop.context import RunContext
from miles_core.loop.train import Trainer


class HeartbeatMonitor:
    def __init__(self, ctx: RunContext, trainer: Trainer) -> None:
        self.ctx = ctx
        self.trainer = trainer

    async def _round(self, cells: list[int]) -> list[bool]:
        """Ping every cell at once, each against the timeout (miles runs one
        SimpleHealthChecker per cell, each on its own): which answered in time. A refused
        heartbeat (a dead process) is a miss at once, not after the timeout.

        Cells whose heartbeat hands back the same wait (the simulator answers every healthy
        cell pinged at one instant with one shared reply) are waited for by one task: a
        64-cell round is then one task, not 64. Distinct waits, as every real world's
        are, each get their own."""
        rt = self.ctx.rt
        answered = [False] * len(cells)
        everyone = rt.signal()
        waits: dict[int, tuple[Awaitable[None], list[int]]] = {}
        for i, cell in enumerate(cells):
            reply = self.ctx.cluster.cell(cell).heartbeat()
            known = waits.get(id(reply))
            if known is None:
                waits[id(reply)] = (reply, [i])
            else:
                known[1].append(i)
        left = len(waits)

        async def ping(reply: Awaitable[None], indices: list[int]) -> None:
            nonlocal left
            try:
                await reply
            except CellFailure:  # refused: the process is gone, a miss now
                pass  # (miles' test_rpc_error_propagates_as_unhealthy)
            else:
                for i in indices:
                    answered[i] = True
            left -= 1
            if not left:
                everyone.set()

        replies = [
            rt.spawn(ping(reply, indices), f"heartbeat-{cells[indices[0]]}", eager=True)
            for reply, indices in waits.values()
        ]
        try:
            await rt.wait_any([everyone, rt.timer(self.ctx.config.heartbeat_timeout)])
        finally:  # timed out, or the checker was cancelled: no ping outlives its round
            for reply in replies:
                reply.cancel("its heartbeat round ended")  # a no-op for those that answered
        return answered

    async def run(self, interval: float) -> None:
        ctx = self.ctx
        threshold = ctx.config.heartbeat_failure_threshold
        misses = dict.fromkeys(range(ctx.cells.num_cells), 0)
        resumes = ctx.heartbeat_resumes
        first_wait = ctx.config.heartbeat_first_wait
        delay = first_wait  # the first round: first_wait in (0: at once, as miles checks)
        while not ctx.stopping:
            await ctx.rt.sleep(delay)
            delay = interval
            if ctx.heartbeats_paused or len(ctx.cells.alive()) < 2:
                continue
            if ctx.heartbeat_resumes != resumes:  # a pause ended: every count starts afresh
                resumes = ctx.heartbeat_resumes
                misses = dict.fromkeys(misses, 0)
                if first_wait:  # and the first wait again (SimpleHealthChecker.resume)
                    delay = first_wait
                    continue
            cells = list(ctx.cells.alive())
            if any(misses.values()):  # a cell not alive now answers as one (no miss kept)
                alive = set(cells)
                misses = {cell: n if cell in alive else 0 for cell, n in misses.items()}
            sent = ctx.rt.now()
            answered = await self._round(cells)
            if ctx.heartbeats_paused or ctx.heartbeat_resumes != resumes:
                continue  # a reconfiguration began or ended during the round: not counted
            if all(answered) and not any(misses.values()):
                continue  # nothing to count: every cell answered, and none had missed before
            for cell, ok in zip(cells, answered, strict=True):
                if ctx.heartbeats_paused:  # a failure below began a reconfiguration
                    break
                if ctx.cells.state(cell) is not CellState.ALIVE:
                    misses[cell] = 0
                    continue
                misses[cell] = 0 if ok else misses[cell] + 1
                if not ok:
                    ctx.emit(HeartbeatMissed, cell=cell, misses=misses[cell], sent=sent)
                if misses[cell] >= threshold:
                    misses[cell] = 0
                    self.trainer.cell_failed(cell, f"missed {threshold} heartbeats")
