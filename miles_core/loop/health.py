"""miles' rollout health monitor (--use-fault-tolerance): find dead or hung engines, recover.

miles runs a RolloutHealthMonitor per server group (miles/utils/health_monitor.py):
after a first wait, every interval it sends each engine a health generate and
kills the actor that fails it or does not answer within the timeout; the
rollout manager restarts dead engines (recover_updatable_engines) and the next
weight update brings them the weights. Here:

- checking waits ``rollout_health_check_first_wait``, checks every engine, then
  waits ``rollout_health_check_interval``, in miles' order (``_health_monitor_loop``),
  so with a first wait of 0 the first check goes out at once; it pauses while
  weights are updated, engines synced or cells healed (a busy engine is not a dead
  one: a health generate is a request, which a paused engine does not schedule, so
  an update longer than the timeout would get healthy engines killed; miles'
  ``actor_group.update_weights`` calls ``health_monitoring_pause``), and waits the
  first wait again after each pause, as miles' does (RolloutHealthMonitor.resume sets
  _need_first_wait). Found paused at its
  interval, it looks for the resume every 0.5 s, as miles' loop does, so the first
  wait and the checks follow the resume, not the next interval (a pause that
  begins and ends between two intervals goes unseen: no first wait follows it);
- an engine that fails its check, or does not answer within
  ``rollout_health_check_timeout``, leaves rotation and its process is replaced; so
  does one that an update's control call got no answer from in that time (``replace``,
  called by the Updater at once, not after the first wait: the process may still be
  generating, unpaused, on old weights);
- an engine that is down (it failed a call, or the world saw it exit) is
  recovered: the world starts a new process, which serves once synced to the
  published weights. Recovery does not pause: an update may be waiting for an
  engine to come back. A recovery that did not produce a process (it died while
  starting) is asked again, no sooner than ``interval + timeout`` after the last
  ask; a recovery still under way (no new process reported, nor its death) is
  never asked again, since asking replaces the process being started: a start
  slower than ``interval + timeout`` would otherwise be killed by the next ask,
  for ever (seen on the CPU backend under load). miles' rollout manager likewise
  waits for the engines it restarts (recover_updatable_engines).

That is miles at 31f1ca9 (the aug2026 profile). Under today's profile this monitor
neither checks nor recovers: today's checker only publishes a status (rollout_health.py)
and the mini FT controller heals (rollout_cell_controller.py); ``run`` starts the checker
and ``replace`` does nothing (the update's failed engine is DOWN, which the controller heals).
"""

from __future__ import annotations

from miles_core.backend import EngineFailure
from miles_core.engines import EngineState
from miles_core.events import EngineHealthFailed, EngineRecoveryAsked
from miles_core.loop.context import RunContext
from miles_core.loop.rollout_health import RolloutHealthChecker
from miles_core.loop.supervision import EngineSupervisor

PAUSED_POLL_S = 0.5
"""How often a paused monitor looks for its resume (miles' ``_health_monitor_loop``)."""


class EngineHealthMonitor:
    def __init__(self, ctx: RunContext, engines: EngineSupervisor) -> None:
        self.ctx = ctx
        self.engines = engines
        self._asked: dict[str, float] = {}
        """engine -> when its last recovery was asked."""
        self._under_way: dict[str, int] = {}
        """engine -> the incarnation it had when a recovery was asked that has not yet been
        reported started or dead."""
        self.checker = RolloutHealthChecker(ctx)
        """Today's checker (the today profile), which replaces this monitor's loop."""

    def recovery_ended(self, engine: str, incarnation: int) -> None:
        """The world reported a process of the engine starting or exiting: the recovery's if
        it is newer than the process replaced (that one's exit ends nothing)."""
        if incarnation > self._under_way.get(engine, incarnation):
            del self._under_way[engine]

    async def _check(self, engine: str) -> None:
        ctx = self.ctx
        incarnation = ctx.engines.incarnation(engine)
        call = ctx.rt.spawn(ctx.cluster.engine(engine, incarnation).health(), f"health-{engine}")
        timeout = ctx.rt.timer(ctx.config.rollout_health_check_timeout)
        try:
            answered = await ctx.rt.wait_any([call, timeout]) == 0
            if answered:
                await call  # raises if the engine failed the check
                return
            call.cancel("health check timed out")
            reason = (
                f"no answer to a health check within {ctx.config.rollout_health_check_timeout:g}s"
            )
        except EngineFailure as failure:
            reason = f"health check failed: {failure.reason}"
        ctx.emit(EngineHealthFailed, engine=engine, incarnation=incarnation, reason=reason)
        self.engines.failed(engine, incarnation, reason)
        self._recover(engine, reason)

    def replace(self, engine: str, incarnation: int, reason: str) -> None:
        """An update's call to that process got no answer in time: it may be generating
        still, unpaused, on old weights, so it is replaced now, as after a failed check."""
        if self.ctx.engines.incarnation(engine) == incarnation and not self.ctx.config.today:
            self._recover(engine, reason)

    def _recover(self, engine: str, reason: str) -> None:
        ctx = self.ctx
        now = ctx.rt.now()
        patience = (
            ctx.config.rollout_health_check_interval + ctx.config.rollout_health_check_timeout
        )
        if engine in self._under_way or now - self._asked.get(engine, -patience) < patience:
            return  # a recovery is under way
        self._asked[engine] = now
        self._under_way[engine] = ctx.engines.incarnation(engine)
        ctx.emit(EngineRecoveryAsked, engine=engine, reason=reason)
        ctx.cluster.restart_engine(engine)

    async def run(self) -> None:
        ctx = self.ctx
        config = ctx.config
        if config.today:
            self.checker.spawn()  # a checker per engine; nothing recovers engines here
            return
        first_wait = True
        while not ctx.stopping:
            if first_wait and not ctx.monitor_paused:
                await ctx.rt.sleep(config.rollout_health_check_first_wait)
                first_wait = False
            for engine in ctx.engines.ids:
                if ctx.stopping:
                    return
                if ctx.engines.state(engine) is EngineState.DOWN:
                    self._recover(engine, "down")
                elif ctx.monitor_paused:
                    first_wait = True  # checks resume after the first wait again
                elif not first_wait:
                    await self._check(engine)
            if ctx.monitor_paused:
                first_wait = True
                await self._until_resumed(config.rollout_health_check_interval)
            else:
                await ctx.rt.sleep(config.rollout_health_check_interval)

    async def _until_resumed(self, most: float) -> None:
        """Wait while paused, looking every PAUSED_POLL_S, as miles' loop waits out a pause
        (``_stop_event.wait(timeout=0.5)``): the first wait and the checks then follow the
        resume, not the next interval. At most ``most`` seconds, so that down engines are
        still recovered every interval while paused."""
        ctx = self.ctx
        left = most
        while left > 0 and ctx.monitor_paused and not ctx.stopping:
            step = min(PAUSED_POLL_S, left)
            await ctx.rt.sleep(step)
            left -= step
