"""The Orchestrator: one run of the loop over one world; it wires the roles and owns the end.

Two modes: fully_async (miles' fully-async rollout: a producer keeps generating,
weight updates abort what is in flight) and one_step_off (batch k+1 is
generated while step k trains; the update waits for both).

The roles, each in its own module: the producer (prompts -> groups -> buffer),
the trainer (quorum, attempts, heals), the updater (the weight-update sequence
and syncs), the engine supervisor (which processes serve) and the heartbeat
monitor. The world reports new processes to the Orchestrator
(WorldObserver), which hands them to the role that owns them.

How many steps a run takes is decided here too: ``config.steps``, and with
``until_witnessed`` more while a fault has not fired yet or has not yet had its
effect (its fault_witness is missing), up to that many steps in all. A real world's
restarted engine may need tens of steps to come back, and how many depends on
the machine: a fixed step count set by hand is either too short on a slow
machine (the witness rightly fails) or wastes time on a fast one.

How a run ends is decided here, once: completed; failed with the named
miles_core error that stopped it; or crashed, when any other exception escaped
the loop or one of its background tasks. Every ending is recorded as RunEnded
with the error's type and traceback; whether it was the expected ending is the
end_state oracle's call, against the scenario's expectation (RunStarted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from miles_core.backend import Cluster
from miles_core.buffer import METRIC_PREFIX
from miles_core.errors import ConfigError, MilesCoreError, format_traceback
from miles_core.event_index import select
from miles_core.events import (
    Event,
    FaultsHealed,
    History,
    LedgerRestored,
    LivenessArmed,
    ModelDescribed,
    PlacementMade,
    RunEnded,
    RunStarted,
    StepCommitted,
    StepMetrics,
    TasksWaiting,
)
from miles_core.kinds import RunStatus
from miles_core.loop.adopt import StateHold
from miles_core.loop.cell_controller import CellController
from miles_core.loop.config import LoopConfig, check_until_witnessed
from miles_core.loop.context import RunContext
from miles_core.loop.health import EngineHealthMonitor
from miles_core.loop.heartbeat import HeartbeatMonitor
from miles_core.loop.producer import Producer
from miles_core.loop.rollout_cell_controller import RolloutCellController
from miles_core.loop.save import Saver
from miles_core.loop.supervision import EngineSupervisor
from miles_core.loop.train import Trainer
from miles_core.loop.update import Updater
from miles_core.placement import Placement
from miles_core.runtime import Runtime, Task
from miles_core.saves import Resume
from miles_core.stopping import LivenessPlan, awaited, liveness_missing
from miles_core.versions import VersionLedger


@dataclass
class RunReport:
    status: RunStatus
    reason: str
    steps_done: int
    versions: list[int] = field(default_factory=list)
    error: BaseException | None = None
    traceback: str = ""


class Orchestrator:
    """One run of the loop over one world (``cluster``)."""

    def __init__(
        self,
        rt: Runtime,
        cluster: Cluster,
        config: LoopConfig,
        history: History | None = None,
        ledger: VersionLedger | None = None,
        expected_status: RunStatus = RunStatus.COMPLETED,
        expected_error: str | None = None,
        until_witnessed: int | None = None,
        liveness: LivenessPlan | None = None,
        resume: Resume | None = None,
    ) -> None:
        """``ledger``: a ledger restored from a checkpoint, to resume its version sequence;
        ``resume``: this run is a killed job's restart, from that save (or from scratch):
        its ledger, its step, its data cursor and the prompts still to train;
        ``expected_*``: how the scenario says the run must end (recorded in RunStarted);
        ``until_witnessed``: run past ``config.steps`` while a fault has not fired or not
        taken effect yet, up to this many steps in all (at least ``config.steps``);
        ``liveness``: liveness mode (the heal comes from the fault schedule): run past
        ``config.steps`` until liveness is met, and end the run STALLED, with its
        wait-for graph, when the bound passes first."""
        check_until_witnessed(until_witnessed, config.steps)
        state = resume.state if resume is not None else None
        if state is not None:
            if ledger is not None:
                raise ConfigError("ledger", "given beside a save to resume", "pass one of them")
            ledger = VersionLedger(state.ledger)
        self.resume = resume
        self.first_step = resume.next_step if resume is not None else 0
        """The step this run begins at: 0, or the step after the save it resumed from."""
        self.liveness = liveness
        self.until_witnessed = until_witnessed
        self.extra_steps = 0
        """Steps run past ``config.steps`` for a witness (0 without ``until_witnessed``)."""
        self.ctx = RunContext(
            rt,
            cluster,
            config,
            history if history is not None else History(),
            ledger if ledger is not None else VersionLedger(),
        )
        self.expected = (expected_status, expected_error)
        self.engines = EngineSupervisor(self.ctx, on_unsynced=self._sync_soon)
        self.producer = Producer(self.ctx, self.engines)
        self.trainer = Trainer(self.ctx)
        self.health = EngineHealthMonitor(self.ctx, self.engines)
        self.updater = Updater(self.ctx, self.engines, self.trainer, self.health.replace)
        self.monitor = HeartbeatMonitor(self.ctx, self.trainer)
        self.controller = CellController(self.ctx, self.trainer)
        cells = self.controller if config.mini_ft_controller_enable else None
        self.rollout_controller = RolloutCellController(
            self.ctx, self.engines, self.health.checker, cells
        )
        self.saver = Saver(self.ctx, self.producer, self.trainer)
        if state is not None:
            self.producer.restore(state.cursor, state.pending)
        self._began = len(self.ctx.history)
        """Where this run's events begin in its history (a resumed job's joins the last)."""
        self._main: Task[Any] | None = None
        self.report: RunReport | None = None
        self.missed = ""
        """Why the run missed its liveness bound (liveness mode)."""
        self.missed_signal = self.ctx.rt.signal()

    # -- what drivers and tests read ---------------------------------------------------

    @property
    def rt(self) -> Runtime:
        return self.ctx.rt

    @property
    def history(self) -> History:
        return self.ctx.history

    @property
    def ledger(self) -> VersionLedger:
        return self.ctx.ledger

    @property
    def cells(self):
        return self.ctx.cells

    @property
    def config(self) -> LoopConfig:
        return self.ctx.config

    @property
    def versions(self) -> list[int]:
        return self.ctx.versions

    def steps_done(self) -> int:
        """The steps the history shows committed (through the oracles' index of it by event
        class, which they reuse: a million-event history is walked once, not twice); a
        resumed job's: the saved steps and those this run committed."""
        commits = select(self.ctx.history, StepCommitted)
        if not self._began:
            return len(commits)
        return self.first_step + sum(1 for seq, _ in commits if seq >= self._began)

    # -- what the world reports (WorldObserver) ---------------------------------------

    def engine_started(self, engine: str, incarnation: int, how: str) -> None:
        if not self.ctx.stopping:
            self.ctx.connections.engines_created()
            self.health.recovery_ended(engine, incarnation)
            self.rollout_controller.process_reported(engine, incarnation, started=True)
            self.engines.started(engine, incarnation, how)

    def engine_exited(self, engine: str, incarnation: int, how: str) -> None:
        if not self.ctx.stopping:
            self.health.recovery_ended(engine, incarnation)
            self.rollout_controller.process_reported(engine, incarnation, started=False)
            self.engines.exited(engine, incarnation, how)

    def cell_started(self, cell: int, incarnation: int, how: str) -> None:
        if not self.ctx.stopping:
            self.controller.started(cell)
            self.trainer.cell_started(cell, incarnation, how)

    def _sync_soon(self, engine: str) -> None:
        self.ctx.spawn(self.updater.sync(engine), f"sync-{engine}")

    # -- the run -------------------------------------------------------------------------

    def _another(self, step: int) -> bool:
        """Whether step ``step`` (counted from 0) is run: every configured step is; past them,
        one more while a fault has not fired yet or has not had its witnessed effect yet
        (judged on the history so far), up to ``until_witnessed`` steps in all."""
        if step < self.ctx.config.steps:
            return True
        plan = self.liveness
        if plan is not None and (
            step <= plan.heal_step or liveness_missing(self.ctx.history) is not None
        ):
            self.extra_steps += 1
            return True  # the liveness deadline ends a run that never meets it
        limit = self.until_witnessed
        more = limit is not None and step < limit and awaited(self.ctx.history)
        self.extra_steps += more
        return more

    async def _fully_async(self) -> None:
        producer, step = self.producer, self.first_step
        while self._another(step):
            self.updater.resume_left_paused()  # a rollout begins: miles' generate()
            producer.batch = await producer.drain()
            await self.updater.train_and_update(step, producer.batch, self._trained)
            await self._save(step)
            step += 1

    async def _save(self, step: int) -> None:
        """A periodic save after the step's update, when one is due (--save-interval)."""
        if self.saver.due(step):
            await self.saver.save(step)

    async def _sync(self) -> None:
        """miles' train.py (synchronous; colocated, the engines and the trainer take the
        GPUs in turn): a batch is generated with the current weights, trained, and the
        weights updated before the next batch is generated. Nothing is in flight at an
        update and every batch is on-policy."""
        ctx, producer, step = self.ctx, self.producer, self.first_step
        while self._another(step):
            self.updater.resume_left_paused()  # a rollout begins: miles' generate()
            await producer.rollout(ctx.config.rollout_batch_size)
            producer.batch = await producer.drain()
            await self.updater.train_and_update(step, producer.batch, self._trained)
            await self._save(step)
            step += 1

    async def _one_step_off(self) -> None:
        """Batch k+1 is generated while step k trains; the update waits for both, so it
        never interrupts generation and every batch is exactly one version old."""
        ctx, producer = self.ctx, self.producer

        def rollout(step: int) -> Any:
            self.updater.resume_left_paused()  # a rollout begins: miles' generate()
            return ctx.spawn(producer.rollout(ctx.config.rollout_batch_size), f"rollout-{step}")

        first = self.first_step
        next_batch = rollout(first)
        step, more = first, self._another(first)
        while more:
            await next_batch
            producer.batch = await producer.drain()
            more = self._another(step + 1)
            if more:
                next_batch = rollout(step + 1)
            await self.updater.train_and_update(step, producer.batch, self._trained, next_batch)
            await self._save(step)
            if not more and self._another(step + 1):  # a fault that fired in this step's
                more = True  # update awaits its effect: the next batch, generated now
                next_batch = rollout(step + 1)
            step += 1

    def _trained(self, step: int) -> None:
        """The step committed: its batch is no longer held, and its metrics are reported
        (miles collects get_metrics once per step, so each window is that step's)."""
        ctx = self.ctx
        mixed = sum(s.kept_kv for g in self.producer.batch for s in g.samples())
        self.producer.batch = []
        metrics = ctx.buffer.metrics(ctx.ledger.current)
        metrics[f"{METRIC_PREFIX}samples_on_mixed_weights"] = mixed
        if self.producer.gate is not None:  # gate_submission's waste: time held at the gate
            metrics.update(self.producer.gate.metrics())
        ctx.emit(StepMetrics, step=step, metrics=tuple(sorted(metrics.items())))

    def _placed(self, placement: Placement) -> None:
        """The world's placement as it reports it: positions' nodes and GPUs, each role's."""
        layout, bundles = placement.layout, placement.bundles
        self.ctx.emit(
            PlacementMade,
            nodes=tuple(b.node for b in bundles),
            sort_as=placement.sort_as or tuple(b.node for b in bundles),
            gpus=tuple(b.gpu_id for b in bundles),
            cells=tuple(tuple(span.positions()) for span in layout.cells),
            engines=tuple(tuple(span.positions()) for span in layout.rollout_engines),
            train_fraction=layout.train_actor_gpu_fraction,
            engine_fraction=layout.engine_actor_gpu_fraction,
        )

    def _start(self) -> None:
        ctx, c = self.ctx, self.ctx.config
        ctx.emit(
            RunStarted,
            seed=c.seed,
            scenario=c.scenario,
            engines=ctx.engines.ids,
            num_cells=ctx.cells.num_cells,
            max_weight_staleness=c.max_weight_staleness,
            steps=c.steps,
            pause_mode=c.pause_generation_mode,
            fault_tolerance=c.use_fault_tolerance,
            unused_samples_handler=c.unused_samples_handler,
            expected_status=self.expected[0],
            expected_error=self.expected[1],
        )
        self._placed(ctx.cluster.placement)
        ctx.emit(ModelDescribed, unit_bytes=tuple(u.nbytes for u in ctx.cluster.units))
        if self.resume is not None:
            self.saver.resumed(self.resume)
        hold = getattr(ctx.cluster, "driver_hold", None)
        if hold is not None:  # a world that keeps the trainer's state for a hot restart
            StateHold(ctx, self.producer, hold)
        ctx.cluster.attach(self)
        if ctx.ledger.current is not None:  # resumed: engines hold their initial weights
            ctx.emit(LedgerRestored, version=ctx.ledger.current)
            for engine in ctx.engines.ids:
                self.engines.outdated(engine, "resumed from a checkpoint: synced before it serves")
        if c.mode == "fully_async":
            ctx.spawn(self.producer.run(), "producer")
        if c.heartbeat_interval is not None:
            monitor = self.monitor.run(c.heartbeat_interval)
            ctx.spawn(monitor, "heartbeat-monitor")
        if c.use_fault_tolerance:
            ctx.spawn(self.health.run(), "engine-health-monitor")
        if c.mini_ft_controller_on:  # today with FT: the engines too (rollout_cell_controller)
            today = c.today and c.use_fault_tolerance
            controller = self.rollout_controller if today else self.controller
            ctx.spawn(controller.run(), "ft-controller")
        if self.liveness is not None:
            healed = ctx.rt.signal()
            ctx.history.observe(lambda e: _on_heal(e, healed))
            ctx.spawn(self._liveness_deadline(self.liveness, healed), "liveness-deadline")

    def killed(self, reason: str) -> None:
        """The whole job died (kill_job), this controller with it: from now on it records
        nothing (what a dead process writes goes nowhere) and acts on nothing. The world
        records the death (JobKilled). Safe inside any of the run's own tasks."""
        ctx = self.ctx
        ctx.history = History()
        ctx.stopping = True
        if self.report is None:
            self.report = RunReport(RunStatus.CRASHED, f"killed: {reason}", self.first_step)

    def stop(self, reason: str) -> None:
        """After ``killed``: its tasks stop at their next wait (from outside them)."""
        self.ctx.cancel_tasks(reason)
        if self._main is not None:
            self._main.cancel(reason)

    async def _liveness_deadline(self, plan: LivenessPlan, healed: Any) -> None:
        """Liveness mode's clock (the testbed's, not miles'): from the heal, the bound; past
        it, the run is stopped as stalled unless liveness was met (a run that meets it is
        over before the deadline comes)."""
        ctx = self.ctx
        await healed
        ctx.emit(
            LivenessArmed,
            deadline=ctx.rt.now() + plan.seconds,
            steps=plan.steps,
            engines=ctx.engines.ids,
            bound=plan.bound,
        )
        await ctx.rt.sleep(plan.seconds)
        missing = liveness_missing(ctx.history)
        if missing is not None:
            self.missed = f"missed the liveness bound ({plan.bound}): {missing}"
            self.missed_signal.set()

    async def run(self) -> RunReport:
        """Run every step; the report (and RunEnded) says how the run ended."""
        ctx = self.ctx
        self._start()
        bodies = {"one_step_off": self._one_step_off, "sync": self._sync}
        body = bodies.get(ctx.config.mode, self._fully_async)()
        main = self._main = ctx.rt.spawn(body, "loop")
        try:  # a failed task may fail the wait itself (the simulator's conditions do)
            which = await ctx.rt.wait_any([main, ctx.crashed, self.missed_signal])
            crashed = which == 1
            if which == 0:
                await main
        except Exception as error:
            return self.end_with(error)
        if which == 2:
            self.record_waits(self.missed)
            main.cancel("the liveness bound passed")
            return self.end(RunStatus.STALLED, self.missed)
        if crashed:
            main.cancel("the run cannot go on")
            assert ctx.crash is not None
            error, where = ctx.crash
            return self.end_with(error, f"in {where}")
        return self.end(RunStatus.COMPLETED, self._steps_run())

    def _steps_run(self) -> str:
        asked, extra = self.ctx.config.steps, self.extra_steps
        if not extra:
            return f"{asked} steps"
        why = "liveness was met" if self.liveness is not None else "every fault was witnessed"
        return f"{asked + extra} steps ({asked} asked, {extra} more until {why})"

    def record_waits(self, reason: str) -> None:
        """The wait-for graph of the run's tasks now (TasksWaiting): drivers call it for a
        stall they detect, the run for a missed liveness bound."""
        if self.report is not None:
            return
        graph = self.ctx.rt.waits()
        self.ctx.emit(TasksWaiting, reason=reason, waits=graph.lines(), root=graph.root())

    def end_with(self, error: BaseException, where: str = "") -> RunReport:
        """End the run because ``error`` was raised: failed if it is a miles_core error the
        control plane raises on purpose, crashed otherwise."""
        status = RunStatus.FAILED if isinstance(error, MilesCoreError) else RunStatus.CRASHED
        reason = f"{type(error).__name__}: {error}" + (f" ({where})" if where else "")
        return self.end(status, reason, error)

    def end(self, status: RunStatus, reason: str, error: BaseException | None = None) -> RunReport:
        """Record how the run ended (once); drivers call it for a stall they detect."""
        if self.report is not None:
            return self.report
        ctx = self.ctx
        ctx.stopping = True
        ctx.cancel_tasks("run ended")
        trace = format_traceback(error) if error is not None else ""
        ctx.emit(
            RunEnded,
            status=status,
            reason=reason,
            outstanding_prompts=self.producer.outstanding(),
            awaiting_regeneration=tuple(self.producer.recycled),
            error=type(error).__name__ if error is not None else None,
            traceback=trace,
        )
        self.report = RunReport(status, reason, self.steps_done(), list(ctx.versions), error, trace)
        return self.report


def _on_heal(event: Event, healed: Any) -> None:
    if isinstance(event, FaultsHealed):
        healed.set()
