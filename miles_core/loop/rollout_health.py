"""Today's rollout health checker (--use-fault-tolerance, profile today): a status, nothing more.

miles today runs a ``SimpleHealthChecker`` per rollout cell (miles/utils/ft_utils/
health_checker.py, index id 59211635317; built by ``create_rollout_cell_health_checker``,
miles/ray/rollout/server_cell.py b8afde1e). It only publishes a status (TriState); nothing
in it kills or restarts an engine: the mini FT controller reads the status and heals
(miles_core/loop/rollout_cell_controller.py). Its loop, followed here per engine:

- it reads its activeness once per round: active while the cell is PendingWeights or
  Serving (here: the engine's process is UNSYNCED or SERVING, not DOWN: no process, or one
  starting) and the controller is active (here: the monitor is not paused by an update, a
  sync or a heal, as ``start_update_weights`` bumps it inactive). A change to active re-arms
  the first wait and zeroes the failures; to inactive sets UNKNOWN (``_on_resumed``,
  ``_on_paused``). The epoch is the process and ``RunContext.monitor_epoch``;
- active and re-armed: it sleeps ``--rollout-health-check-first-wait`` and looks again;
- active: a health generate bounded by ``--rollout-health-check-timeout``; a probe across
  which the activeness or epoch moved is discarded (``probe_discarded``); else a pass sets
  HEALTHY and zeroes the failures, a failure counts, and
  ``--rollout-health-check-failure-threshold`` in a row (today's default 1,
  configs/fault_tolerance.py 3c07fcdd) set UNHEALTHY (``_publish_result``);
- then it sleeps ``--rollout-health-check-interval``.

Every status change is recorded (EngineHealthChanged); each failed probe that counted too
(EngineHealthFailed, as the aug2026 monitor records it), with nothing done about it here.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.backend import EngineFailure
from miles_core.engines import EngineState
from miles_core.events import EngineHealthChanged, EngineHealthFailed
from miles_core.kinds import EngineHealth
from miles_core.loop.context import RunContext

CHECKED = frozenset({EngineState.SERVING, EngineState.UNSYNCED})
"""The states a process is checked in (miles: PendingWeights or Serving)."""


@dataclass(frozen=True)
class Activeness:
    """miles' ``ActiveAndEpoch``, for one engine: whether it is checked now, and what a
    change of which re-arms the checker (its process, and the monitor's pauses)."""

    active: bool
    incarnation: int
    epoch: int


@dataclass
class _Status:
    health: EngineHealth = EngineHealth.UNKNOWN
    incarnation: int = 0
    failures: int = 0


class RolloutHealthChecker:
    """One checker loop per engine; ``unhealthy`` is what the FT controller reads."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._status = {engine: _Status() for engine in ctx.engines.ids}

    def unhealthy(self, engine: str) -> bool:
        """Whether the engine's current process is published unhealthy."""
        status = self._status[engine]
        return (
            status.health is EngineHealth.UNHEALTHY
            and status.incarnation == self.ctx.engines.incarnation(engine)
        )

    def failures(self, engine: str) -> int:
        return self._status[engine].failures

    def spawn(self) -> None:
        for engine in self.ctx.engines.ids:
            self.ctx.spawn(self.run(engine), f"health-checker-{engine}")

    def _activeness(self, engine: str) -> Activeness:
        ctx = self.ctx
        active = ctx.engines.state(engine) in CHECKED and not ctx.monitor_paused
        return Activeness(active, ctx.engines.incarnation(engine), ctx.monitor_epoch)

    async def run(self, engine: str) -> None:
        """miles' ``SimpleHealthChecker._loop`` for one engine."""
        ctx, config = self.ctx, self.ctx.config
        seen = Activeness(False, -1, -1)
        need_first_wait = True
        while not ctx.stopping:
            now = self._activeness(engine)
            if now != seen:
                seen = now
                if now.active:
                    need_first_wait = True
                self._publish(engine, now.incarnation, EngineHealth.UNKNOWN, 0)
            if now.active and need_first_wait:
                need_first_wait = False
                await ctx.rt.sleep(config.rollout_health_check_first_wait)
                continue
            if now.active:
                failure = await self._probe(engine, now.incarnation)
                after = self._activeness(engine)
                if after == now and not ctx.stopping:
                    self._result(engine, now.incarnation, failure)
            await ctx.rt.sleep(config.rollout_health_check_interval)

    async def _probe(self, engine: str, incarnation: int) -> str | None:
        """A health generate bounded by the timeout: None if it passed, else why not."""
        ctx = self.ctx
        timeout = ctx.config.rollout_health_check_timeout
        call = ctx.rt.spawn(ctx.cluster.engine(engine, incarnation).health(), f"health-{engine}")
        try:
            if await ctx.rt.wait_any([call, ctx.rt.timer(timeout)]) == 0:
                await call  # raises if the engine failed the check
                return None
            call.cancel("health check timed out")
            return f"no answer to a health check within {timeout:g}s"
        except EngineFailure as failure:
            return f"health check failed: {failure.reason}"

    def _result(self, engine: str, incarnation: int, failure: str | None) -> None:
        """miles' ``_publish_result``."""
        status = self._status[engine]
        if failure is None:
            self._publish(engine, incarnation, EngineHealth.HEALTHY, 0)
            return
        failures = status.failures + 1
        self.ctx.emit(EngineHealthFailed, engine=engine, incarnation=incarnation, reason=failure)
        threshold = self.ctx.config.rollout_health_check_failure_threshold
        health = EngineHealth.UNHEALTHY if failures >= threshold else status.health
        self._publish(engine, incarnation, health, failures)

    def _publish(self, engine: str, incarnation: int, health: EngineHealth, failures: int) -> None:
        status = self._status[engine]
        changed = health is not status.health
        status.health, status.incarnation, status.failures = health, incarnation, failures
        if changed:
            self.ctx.emit(
                EngineHealthChanged,
                engine=engine,
                incarnation=incarnation,
                status=health,
                failures=failures,
            )
