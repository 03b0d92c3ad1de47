"""Today's miles' update window (issue 50, ``[miles] profile = "today"``): when it opens, and
what an aborted one does to the engines it snapshotted.

miles' ``InferenceController.start_update_weights`` pauses the cells' health checks, then
``_ensure_cells_ready`` waits until every rollout cell is pending weights or serving (an
errored cell is not waited for), polling every ``CELLS_READY_POLL_INTERVAL_SECONDS = 2.0``
for at most ``CELLS_READY_TIMEOUT_SECONDS = 3600.0`` (then ``TimeoutError``), and only then
snapshots the cells (``snapshot_cell_id_to_hashes``) — ``miles/ray/rollout/
inference_controller.py`` at b8afde1e. ``end_update_weights`` marks ready (router join) only
the cells still matching the snapshot. Here a cell is an engine slot, and:

- initializing: a recovery was asked (EngineRecoveryAsked), or an aborted window stopped its
  process, and no newer process is reported yet (neither started nor dead). An engine down
  with no recovery under way is not waited
  for: it is errored (or nothing brings it back, without fault tolerance), and would never
  come. A process up and not yet synced (UNSYNCED) is pending weights: the window takes it;
- the snapshot is the engines and their processes (incarnations) the update begins with;
- an aborted window (a failed broadcast) stops every process of its snapshot still matching
  it, since any may hold partial weights, and asks for its replacement; the retry's window
  waits for the replacements. That behaviour is read only from miles' driver tests
  (``test_a_failed_broadcast_replaces_every_snapshot_participant_before_retrying``, index id
  58310130319: abort with the snapshot, ``wait_expected_num_cells``, a fresh snapshot); its
  production code was not found (docs/miles-today-reading.md, section 2). It is modelled
  with fault tolerance only: without it nothing here brings a stopped engine back.

Which engines are initializing is read from the run's own events as they are recorded, so
whoever asks a recovery (the health monitor, an update's deadline) is seen.
"""

from __future__ import annotations

from collections.abc import Callable

from miles_core.engines import EngineState
from miles_core.errors import UpdateWindowTimeoutError
from miles_core.events import (
    EngineExited,
    EngineRecoveryAsked,
    EngineStarted,
    Event,
    ParticipantsStopped,
    UpdateWindowOpened,
    UpdateWindowWaiting,
)
from miles_core.loop.context import RunContext
from miles_core.loop.supervision import EngineSupervisor

CELLS_READY_POLL_INTERVAL_SECONDS = 2.0
"""miles' ``CELLS_READY_POLL_INTERVAL_SECONDS`` (inference_controller.py, b8afde1e)."""
CELLS_READY_TIMEOUT_SECONDS = 3600.0
"""miles' ``CELLS_READY_TIMEOUT_SECONDS`` (inference_controller.py, b8afde1e)."""


class UpdateWindow:
    """Which engines are initializing, the wait before a window opens, and an abort's stop."""

    def __init__(
        self,
        ctx: RunContext,
        engines: EngineSupervisor,
        replace: Callable[[str, int, str], None],
    ) -> None:
        self.ctx = ctx
        self.engines = engines
        self.replace = replace
        self._initializing: dict[str, int] = {}
        """engine -> the process it had when its recovery was asked, until a newer process
        of it is reported started or dead."""
        if ctx.config.today:  # aug2026 never asks: its history gains no observer's work
            ctx.history.observe(self._seen)

    def _seen(self, event: Event) -> None:
        kind = type(event)
        if kind is EngineRecoveryAsked:
            engine = event.engine  # type: ignore[attr-defined]
            self._initializing.setdefault(engine, self.ctx.engines.incarnation(engine))
        elif kind is EngineStarted or kind is EngineExited:
            engine = event.engine  # type: ignore[attr-defined]
            asked = self._initializing.get(engine)
            if asked is not None and event.incarnation > asked:  # type: ignore[attr-defined]
                del self._initializing[engine]

    def initializing(self) -> tuple[str, ...]:
        """The engines whose recovery is under way (asked, no new process reported), sorted."""
        return tuple(sorted(self._initializing))

    async def open(self) -> None:
        """Wait until no engine is initializing, polling every 2 s of the run's clock, the
        health checks paused meanwhile (miles pauses them first); past 3600 s the update
        fails (UpdateWindowTimeoutError), as miles' ``_ensure_cells_ready`` raises."""
        ctx = self.ctx
        waiting = self.initializing()
        if not waiting:
            return
        began = ctx.rt.now()
        ctx.emit(UpdateWindowWaiting, version=ctx.ledger.current, engines=waiting)
        ctx.monitor_paused += 1
        try:
            while waiting := self.initializing():
                if ctx.rt.now() - began >= CELLS_READY_TIMEOUT_SECONDS:
                    raise UpdateWindowTimeoutError(
                        f"timed out after {CELLS_READY_TIMEOUT_SECONDS:g}s waiting for "
                        f"{len(waiting)}/{len(ctx.engines.ids)} engines to start "
                        f"({', '.join(waiting)}); miles' _ensure_cells_ready raises here: "
                        "find why their new processes never answer (engine start time)"
                    )
                await ctx.rt.sleep(CELLS_READY_POLL_INTERVAL_SECONDS)
        finally:
            ctx.monitor_paused -= 1
        ctx.emit(UpdateWindowOpened, waited=ctx.rt.now() - began)

    def aborted(self, update_id: int, snapshot: dict[str, int], reason: str) -> None:
        """The window of ``update_id`` aborted: every process of its snapshot still current and
        up is stopped (out of rotation and of the router) and replaced (fault tolerance)."""
        ctx = self.ctx
        if not ctx.config.use_fault_tolerance:
            return
        table = ctx.engines
        stopped = {
            e: i
            for e, i in snapshot.items()
            if table.current(e, i) and table.state(e) is not EngineState.DOWN
        }
        if not stopped:
            return
        ctx.emit(
            ParticipantsStopped,
            update_id=update_id,
            engines=tuple(stopped),
            incarnations=tuple(stopped.values()),
        )
        why = f"update {update_id}'s window aborted ({reason}): partial weights possible"
        for engine, incarnation in stopped.items():
            self.engines.failed(engine, incarnation, why)
            # the retry waits for its replacement (wait_expected_num_cells), whoever starts it
            self._initializing.setdefault(engine, incarnation)
            self.replace(engine, incarnation, why)
