"""One simulated run: a scenario and a seed in, an event history and the oracles' verdicts out."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from miles_core.events import Event, History, RunEnded, RunStatus, StepCommitted
from miles_core.loop import LoopConfig, Orchestrator, RunReport
from miles_core.oracles import (
    Violation,
    bounded_staleness,
    check_all,
    exactly_once,
    monotonic_versions,
    published_weights,
)
from miles_core.versions import VersionLedger
from sim.cluster import SimCluster, SimConfig
from sim.faults import Fault, ScheduledFaults
from sim.runtime import SimRuntime


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    sim: SimConfig = field(default_factory=SimConfig)
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(steps=8))
    faults: tuple[Fault, ...] = ()
    progress_window: float = 600.0
    """Virtual seconds within which a step must commit after the last fault."""
    max_seconds: float | None = None
    """Virtual-time horizon; a run still going then is STALLED (default: 50 train-step
    times per step)."""


@dataclass
class SimResult:
    scenario: Scenario
    seed: int
    history: History
    report: RunReport
    verdicts: dict[str, Violation | None]
    events: int = 0
    """SimPy events processed (the simulator's unit of work)."""

    @property
    def ok(self) -> bool:
        return all(v is None for v in self.verdicts.values())

    @property
    def hash(self) -> str:
        return self.history.hash()

    def replay_line(self) -> str:
        return (
            f"python -m sim run {self.scenario.name} --seed {self.seed} --steps {self.report_steps}"
        )

    @property
    def report_steps(self) -> int:
        return self.scenario.loop.steps


SAFETY_ORACLES = (monotonic_versions, bounded_staleness, exactly_once, published_weights)
"""The oracles that judge a history prefix: progress and failover witnesses need the end."""


class OracleStop(Exception):
    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def _live_checker(history: History, every: int) -> Callable[[Event], None]:
    if every < 1:
        raise ValueError(f"check_every must be >= 1, got {every}")

    def check(event: Event) -> None:
        if isinstance(event, StepCommitted) and (event.step + 1) % every == 0:
            for oracle in SAFETY_ORACLES:
                if (violation := oracle(history)) is not None:
                    raise OracleStop(violation)

    return check


def _end_early(control: Orchestrator, status: RunStatus, reason: str) -> RunReport:
    """Record the end of a run the orchestration did not finish itself."""
    control.history.append(
        RunEnded(
            t=control.rt.now(),
            status=status,
            reason=reason,
            outstanding_prompts=control.outstanding(),
        )
    )
    return RunReport(status, reason, control.steps_done(), list(control.versions))


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector for one run.

    A run allocates millions of objects that live to its end (the history, the
    samples) and makes next to no reference cycles, so refcounting frees what
    dies; the collector would only rescan the growing heap again and again
    (about a fifth of a long run's time). The run's own object graph becomes
    collectable when it ends, when the collector is back.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_scenario(
    scenario: Scenario,
    seed: int,
    steps: int | None = None,
    observers: Sequence[Callable[[Event], None]] = (),
    check_every: int | None = None,
    ledger: VersionLedger | None = None,
) -> SimResult:
    """Run ``scenario`` under ``seed``; the same arguments give the same history hash.

    ``observers`` see every event as it is recorded (progress bars, live checks).
    ``check_every=K`` also runs the safety oracles every K committed steps and stops
    the run at the first violation (the final verdicts then show it).
    ``ledger`` resumes a checkpoint's version sequence (restored with its snapshot).
    """
    with _no_cyclic_gc():
        return _run_scenario(scenario, seed, steps, observers, check_every, ledger)


def _run_scenario(
    scenario: Scenario,
    seed: int,
    steps: int | None,
    observers: Sequence[Callable[[Event], None]],
    check_every: int | None,
    ledger: VersionLedger | None,
) -> SimResult:
    loop = dataclasses.replace(
        scenario.loop, seed=seed, scenario=scenario.name, steps=steps or scenario.loop.steps
    )
    scenario = dataclasses.replace(scenario, loop=loop)
    rt = SimRuntime(seed)
    faults = ScheduledFaults(scenario.faults)
    cluster = SimCluster(rt, scenario.sim, faults)
    history = History()
    for observer in observers:
        history.observe(observer)
    if check_every is not None:
        history.observe(_live_checker(history, check_every))
    control = Orchestrator(rt, cluster, loop, history, ledger)
    faults.install(cluster, control)
    horizon = scenario.max_seconds or 50.0 * loop.steps * scenario.sim.train_step_seconds
    try:
        report = rt.run(control.run(), until=horizon)
    except OracleStop as stop:
        reason = f"stopped at the first violation: {stop.violation.oracle}"
        report = _end_early(control, RunStatus.FAILED, reason)
    except (RuntimeError, TimeoutError) as stuck:  # deadlock, livelock, or past the horizon
        report = _end_early(control, RunStatus.STALLED, str(stuck))
    verdicts = check_all(history, scenario.progress_window)
    return SimResult(scenario, seed, history, report, verdicts, rt.env.processed)
