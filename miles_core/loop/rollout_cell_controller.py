"""Today's mini FT controller on the rollout side: unhealthy or down engines are suspended, resumed.

miles today (miles/utils/ft_utils/mini_ft_controller.py 03df7d98,
``_MiniFTController.run, _poll_and_heal, _heal``) polls every cell every
--mini-ft-controller-poll-interval (10 s, less the poll's own time); each UNHEALTHY cell
(a Healthy condition False, or suspended: ``_compute_cell_snapshot``) outside its backoff is
healed in turn: PATCH suspend (``stop_cell_between_weight_updates``: the engine's process is
stopped), sleep --mini-ft-controller-resume-delay (10 s), PATCH resume (``start_cells``: a
new process, which joins the router only at ``mark_weights_ready`` after the next weight
update). A heal that went through is not tried again for resume_delay; a failed one backs
off ``min(5 * 2**failures, 300)`` s; the backoff of a cell no longer unhealthy is dropped.
It is on by default with --use-fault-tolerance (``_resolve_mini_ft_controller_enable``,
``LoopConfig.mini_ft_controller_on``), and nothing else restarts an engine (the RECONCILE
notes, docs/miles-today-reading.md section 4). Here, under the today profile:

- unhealthy: the checker (rollout_health.py) publishes the engine's process UNHEALTHY, or
  the engine is DOWN (its process exited or failed a call: miles' cell would fail its next
  health generate), and no resume of ours is under way for it;
- suspend: EngineSuspended; the process leaves rotation (and the router) and the world
  stops it (``Cluster.stop_engine``); resume: EngineRecoveryAsked and
  ``Cluster.restart_engine``; the new process waits out of rotation for the weights, as
  any new process does. An engine that has a live process again when the delay is over
  (brought back another way) is not resumed;
- a failed heal: the world reports the resumed process dead while starting (our worlds'
  resume does not fail synchronously, as miles' PATCH can): it backs off as miles' does;
- trainer cells: healed in the same loop, before the engines, when
  --mini-ft-controller-enable is set explicitly (cell_controller.py); the resolved default
  heals the rollout cells only (ft_components ["rollout"]).
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.engines import EngineState
from miles_core.events import EngineRecoveryAsked, EngineSuspended
from miles_core.loop.cell_controller import FAILED_HEAL_BACKOFF_S, MAX_BACKOFF_S, CellController
from miles_core.loop.context import RunContext
from miles_core.loop.rollout_health import RolloutHealthChecker
from miles_core.loop.supervision import EngineSupervisor


@dataclass
class _Backoff:
    """miles' ``_CellBackoff``."""

    failures: int = 0
    next_attempt_at: float = 0.0


class RolloutCellController:
    def __init__(
        self,
        ctx: RunContext,
        engines: EngineSupervisor,
        checker: RolloutHealthChecker,
        cells: CellController | None,
    ) -> None:
        self.ctx = ctx
        self.engines = engines
        self.checker = checker
        self.cells = cells
        """The trainer cells' controller, polled first in the same loop (or None)."""
        self._backoffs: dict[str, _Backoff] = {}
        self._starting: dict[str, tuple[int, _Backoff]] = {}
        """engine -> (its process when we resumed it, its backoff): a resume whose new process
        was not yet reported started or dead."""

    def process_reported(self, engine: str, incarnation: int, started: bool) -> None:
        """The world reported a process of the engine starting or exiting: the end of our
        resume if it is newer than the process resumed. Dead while starting: a failed heal."""
        asked = self._starting.get(engine)
        if asked is None or incarnation <= asked[0]:
            return
        del self._starting[engine]
        if started:
            asked[1].failures = 0  # miles zeroes them once a heal went through
        else:
            backoff = asked[1]
            backoff.failures += 1
            wait = min(FAILED_HEAL_BACKOFF_S * 2**backoff.failures, MAX_BACKOFF_S)
            backoff.next_attempt_at = self.ctx.rt.now() + wait
            self._backoffs[engine] = backoff

    async def run(self) -> None:
        ctx = self.ctx
        poll = ctx.config.mini_ft_controller_poll_interval
        while not ctx.stopping:
            began = ctx.rt.now()
            if self.cells is not None:
                await self.cells.poll()
            await self._poll()
            await ctx.rt.sleep(max(0.0, poll - (ctx.rt.now() - began)))

    def _why(self, engine: str) -> str | None:
        """Why the engine is unhealthy now, or None."""
        if engine in self._starting:
            return None  # our resume is under way: pending, not unhealthy
        if self.ctx.engines.state(engine) is EngineState.DOWN:
            return "down"
        if self.checker.unhealthy(engine):
            return f"unhealthy after {self.checker.failures(engine)} failed health check(s)"
        return None

    async def _poll(self) -> None:
        """miles' ``_poll_and_heal`` over the engines."""
        ctx = self.ctx
        unhealthy: set[str] = set()
        for engine in ctx.engines.ids:
            why = self._why(engine)  # read as each is reached: a heal takes the delay
            if why is None:
                continue
            unhealthy.add(engine)
            backoff = self._backoffs.setdefault(engine, _Backoff())
            if ctx.rt.now() >= backoff.next_attempt_at and not ctx.stopping:
                await self._heal(engine, why, backoff)
        for engine in set(self._backoffs) - unhealthy:
            del self._backoffs[engine]

    async def _heal(self, engine: str, why: str, backoff: _Backoff) -> None:
        """Suspend, wait resume_delay, resume (miles' ``_heal``)."""
        ctx = self.ctx
        delay = ctx.config.mini_ft_controller_resume_delay
        incarnation = ctx.engines.incarnation(engine)
        ctx.emit(EngineSuspended, engine=engine, incarnation=incarnation, reason=why)
        self.engines.failed(engine, incarnation, f"suspended by the FT controller: {why}")
        ctx.cluster.stop_engine(engine)
        await ctx.rt.sleep(delay)
        if ctx.stopping or ctx.engines.state(engine) is not EngineState.DOWN:
            return  # the run ended, or a new process came another way meanwhile
        reason = f"suspended {delay:g}s by the FT controller"
        ctx.emit(EngineRecoveryAsked, engine=engine, reason=reason)
        backoff.next_attempt_at = ctx.rt.now() + delay  # a heal that went through
        self._starting[engine] = (ctx.engines.incarnation(engine), backoff)
        ctx.cluster.restart_engine(engine)  # may report the new process (or its death) at once
