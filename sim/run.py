"""One simulated run: a scenario and a seed in, an event history and the oracles' verdicts out."""

from __future__ import annotations

import gc
import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from miles_core.errors import ConfigError
from miles_core.events import Event, History, StepCommitted
from miles_core.kinds import RunStatus
from miles_core.loop import Orchestrator, RunReport
from miles_core.oracles import SAFETY, WHOLE_RUN, Violation, check_all
from miles_core.oracles.base import forget
from miles_core.report.interrupt import CUT, ctrl_c_calls, judge_prefix
from miles_core.report.judged import JudgedRun
from miles_core.scenario import Scenario
from miles_core.scenario.schedule import orchestrator_for, schedule_for
from miles_core.transfer import TransferMode
from miles_core.versions import VersionLedger
from sim.horizon import horizon, progress_window
from sim.world.cluster import SimCluster
from sim.world.delta_transport import delta_transport
from sim.world.driver_restart import SimDriverRestarts, restarts_driver
from sim.world.faults import SimFaultActions
from sim.world.job import SimJob, kills_jobs
from sim.world.runtime import Deadlock, Livelock, RunInterrupted, SimRuntime


@dataclass
class SimResult(JudgedRun):
    scenario: Scenario
    """The scenario as this run saw it (``--steps`` and the seed applied)."""
    seed: int
    history: History
    report: RunReport
    verdicts: dict[str, Violation | None]
    events: int = 0
    """SimPy events processed (the simulator's unit of work)."""
    not_judged: dict[str, str] = field(default_factory=dict)
    """Oracles that gave no verdict, by name, and why (an interrupted run's: see
    miles_core.report.interrupt); a run that ended by itself has every verdict."""

    @property
    def hash(self) -> str:
        return self.history.hash()

    def failures(self) -> str:
        """The violations that fail the run (``expect.caught_by``'s catch is none)."""
        return "\n".join(str(v) for v in self.judged.values() if v)

    def replay_line(self) -> str:
        """The command that replays a named scenario's run exactly."""
        steps = self.scenario.loop.steps
        return f"python -m sim run {self.scenario.name} --seed {self.seed} --steps {steps}"


def replay_command(
    source: str,
    seed: int,
    steps: int | None = None,
    *,
    aim: str | None = None,
    plant: str | None = None,
    extra: Sequence[str] = (),
) -> str:
    """The one line that replays a run: ``python -m sim run SOURCE --seed N`` and the
    options it was run with (``extra``: any further flags, already spelt)."""
    command = ["python", "-m", "sim", "run", source, "--seed", str(seed)]
    if steps is not None:
        command += ["--steps", str(steps)]
    if aim is not None:
        command += ["--aim", aim]
    if plant is not None:
        command += ["--plant", plant]
    return shlex.join([*command, *extra])


class OracleStop(BaseException):
    """Raised from an observer to stop a run at once (not an Exception: the loop must not
    take it for its own failure and end the run as crashed)."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation)  # rebuildable from its args (the runtime copies failures)
        self.violation = violation

    def __str__(self) -> str:
        return str(self.violation)


def _live_checker(history: History, every: int) -> Callable[[Event], None]:
    def check(event: Event) -> None:
        if isinstance(event, StepCommitted) and (event.step + 1) % every == 0:
            for oracle in SAFETY.values():
                if (violation := oracle(history)) is not None:
                    raise OracleStop(violation)

    return check


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
    interruptible: bool = False,
) -> SimResult:
    """Run ``scenario`` under ``seed``; the same arguments give the same history hash.

    ``steps`` overrides the scenario's (its faults are checked against the new
    count first). ``observers`` see every event as it is recorded (progress
    bars, live checks). ``check_every=K`` also runs the safety oracles every K
    committed steps and stops the run at the first violation (the final verdicts
    then show it). ``ledger`` resumes a checkpoint's version sequence.
    ``interruptible``: Ctrl-C stops the run between two events, as interrupted,
    and the safety oracles judge what ran (a command's choice: a sweep's workers
    leave Ctrl-C to their driver); a Ctrl-C while the oracles judge a run that
    ended by itself cuts their judging short (``SimResult.not_judged``).
    """
    if check_every is not None and (isinstance(check_every, bool) or check_every < 1):
        raise ConfigError("--check-every", f"got {check_every!r}", "pass an integer >= 1")
    scenario = scenario.with_run(steps=steps, seed=seed)
    with _no_cyclic_gc():
        return _run(scenario, seed, observers, check_every, ledger, interruptible)


def _run(
    scenario: Scenario,
    seed: int,
    observers: Sequence[Callable[[Event], None]],
    check_every: int | None,
    ledger: VersionLedger | None,
    interruptible: bool,
) -> SimResult:
    rt = SimRuntime(seed)
    live = scenario.liveness
    schedule = schedule_for(scenario)
    timeout = scenario.loop.update_weight_collective_timeout
    cluster = SimCluster(rt, scenario.world, scenario.timing, schedule, timeout)
    cluster.reads_weights = scenario.loop.today  # WeightsChecked in the simulator: today's
    if scenario.loop.transfer_mode is TransferMode.DISK_DELTA:
        cluster.transport = delta_transport(cluster, scenario.loop)
    cluster.transport.locks.on = scenario.loop.today  # the weight-update ticket lock: today's
    history = History()
    for observer in observers:
        history.observe(observer)
    if check_every is not None:
        history.observe(_live_checker(history, check_every))
    control: Orchestrator | SimJob | SimDriverRestarts
    control = orchestrator_for(scenario, rt, cluster, history, ledger)
    actions = SimFaultActions(cluster)
    if kills_jobs(scenario):  # the controller under a job that a kill restarts
        assert isinstance(control, Orchestrator)
        control = SimJob(scenario, rt, history, schedule, actions, cluster, control)
    elif restarts_driver(scenario):  # the driver under a world that a hot restart keeps
        assert isinstance(control, Orchestrator)
        control = SimDriverRestarts(scenario, rt, history, cluster, control)
    most_steps = scenario.until_witnessed or scenario.loop.steps
    if live is not None:  # the run goes on past its steps until liveness is met
        most_steps = max(most_steps, live.heal_step) + live.steps + 1
    until = horizon(scenario, most_steps, isinstance(control, SimJob))
    stops = (RunInterrupted, KeyboardInterrupt) if interruptible else RunInterrupted
    try:
        with ctrl_c_calls(rt.interrupt_soon) if interruptible else nullcontext():
            schedule.install(rt, history, actions)
            report = rt.run(control.run(), until=until)
    except stops:  # Ctrl-C: between two events (a second Ctrl-C: wherever it came)
        report = control.end(RunStatus.INTERRUPTED, f"interrupted (Ctrl-C) at t={rt.now():g}")
    except OracleStop as stop:
        reason = f"stopped at the first violation ({stop.violation.oracle}), as --check-every asks"
        report = control.end(RunStatus.FAILED, reason)
    except (Deadlock, Livelock, TimeoutError) as stuck:  # past the horizon, or nothing can move
        control.record_waits(str(stuck))
        report = control.end(RunStatus.STALLED, str(stuck))
    except Exception as error:  # a world's or an injector's own failure: a crash, kept whole
        report = control.end_with(error, "raised in the simulated world")
    verdicts, not_judged = _judge(history, report, progress_window(scenario), interruptible)
    return SimResult(scenario, seed, history, report, verdicts, rt.env.processed, not_judged)


def _judge(
    history: History, report: RunReport, window: float, interruptible: bool
) -> tuple[dict[str, Violation | None], dict[str, str]]:
    """Every oracle's verdict; an interrupted run's (or, when ``interruptible``, a run's whose
    judging a Ctrl-C cut short): the safety oracles' that fit in the time left."""
    if report.status is RunStatus.INTERRUPTED:
        return judge_prefix(history)
    try:
        return check_all(history, window), {}
    except KeyboardInterrupt:
        if not interruptible:
            raise
        forget(history)  # its index may be half-updated
        verdicts, not_judged = judge_prefix(history)
        return verdicts, not_judged | dict.fromkeys(WHOLE_RUN, CUT)
