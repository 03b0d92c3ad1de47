"""One seed judged where it runs: the scenario in, a small outcome out (never the history).

A sweep's worker keeps a history only while it judges it: what travels back to
the driver is the verdict per oracle, the history's hash, the coverage cells the
faults hit, the rare-state probes it reached and, for a failing seed only, what is
needed to replay and read it (the scenario as TOML, the violations, the replay line).
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

from miles_core.coverage import CoverageCell, coverage_cells
from miles_core.events import FaultInjected
from miles_core.oracles import idle_faults
from miles_core.probes import probes_hit
from miles_core.report.caught import caught
from miles_core.scenario import Scenario
from miles_core.scenario.dump import scenario_to_toml
from sim.run import replay_command, run_scenario
from sim.search.plants import planted
from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS, swarm_scenario

DEFAULT_SWARM_STEPS = 12


@dataclass(frozen=True)
class SeedTask:
    """What one seed runs: ``source`` as the user wrote it (swarm, a name, a file's path);
    ``scenario`` is the loaded one for a name or a file (a swarm is drawn by the seed)."""

    source: str
    seed: int
    scenario: Scenario | None = None
    steps: int | None = None
    aim: CoverageCell | None = None
    plant: str | None = None
    liveness: bool = False
    """Liveness mode for every seed (``--liveness``); without it a swarm seed draws it."""

    def drawn(self) -> Scenario:
        if self.source in (SWARM, SWARM_TOTAL_LOSS):
            steps = self.steps if self.steps is not None else DEFAULT_SWARM_STEPS
            total_loss = self.source == SWARM_TOTAL_LOSS
            live = True if self.liveness and not total_loss else None
            return swarm_scenario(
                self.seed, steps, total_loss=total_loss, aim=self.aim, liveness=live
            )
        assert self.scenario is not None, "a named or file scenario is loaded by the driver"
        scenario = self.scenario
        if self.liveness and scenario.liveness is None:
            steps = scenario.loop.steps if self.steps is None else self.steps
            return scenario.with_run(steps=steps).with_liveness()
        return scenario

    def replay(self) -> str:
        """The command that replays this seed's run exactly."""
        aim = None if self.aim is None else self.aim.key()
        extra = ["--liveness"] if self.liveness else []
        return replay_command(
            self.source, self.seed, self.steps, aim=aim, plant=self.plant, extra=extra
        )


@dataclass(frozen=True)
class SeedOutcome:
    source: str
    seed: int
    failed: tuple[str, ...]
    """The oracles that failed (empty: the seed passed)."""
    oracles: tuple[str, ...]
    status: str
    hash: str
    cells: tuple[CoverageCell, ...]
    replay: str
    seconds: float
    aim: CoverageCell | None = None
    failure: str = ""
    """The violations, for a failing seed."""
    scenario_toml: str = ""
    """The scenario as run (a swarm's drawing too), for a failing seed."""
    idle: tuple[str, ...] = ()
    """The kinds of the faults whose window met nothing to act on (one entry per fault):
    passed, not witnessed, so the sweep counts them."""
    probes: tuple[str, ...] = ()
    """The rare-state probes the history hit (miles_core.probes)."""
    caught: tuple[str, ...] = ()
    """The oracle that caught the seed's field bug, as its ``expect.caught_by`` asks (the
    seed passed: ``failed`` holds what failed against the expectation, a miss included)."""

    @property
    def ok(self) -> bool:
        return not self.failed


CRASHED = "crashed"
"""The verdict of a seed whose drawing or run raised outside the world (a crash is never a
pass: it is a failing seed with its replay line and traceback, and the sweep goes on)."""


def judge(task: SeedTask) -> SeedOutcome:
    """Run and judge one seed (in a Ray worker, or here)."""
    started = time.perf_counter()
    try:
        return _judged(task, started)
    except Exception:
        return SeedOutcome(
            source=task.source,
            seed=task.seed,
            failed=(CRASHED,),
            oracles=(CRASHED,),
            status=CRASHED,
            hash="",
            cells=(),
            replay=task.replay(),
            seconds=time.perf_counter() - started,
            aim=task.aim,
            failure=traceback.format_exc(),
        )


def _judged(task: SeedTask, started: float) -> SeedOutcome:
    with planted(task.plant):
        scenario = task.drawn()
        result = run_scenario(scenario, task.seed, task.steps)
    buckets = [getattr(f.when, "bucket", None) for f in scenario.faults]
    failed = tuple(name for name, v in result.judged.items() if v is not None)
    kinds = {e.index: e.fault.value for e in result.history if isinstance(e, FaultInjected)}
    return SeedOutcome(
        source=task.source,
        seed=task.seed,
        failed=failed,
        oracles=tuple(result.verdicts),
        status=result.report.status.value,
        hash=result.hash,
        cells=tuple(coverage_cells(result.history, buckets)),
        replay=task.replay(),
        seconds=time.perf_counter() - started,
        aim=task.aim,
        failure=result.failures() if failed else "",
        scenario_toml=scenario_to_toml(result.scenario) if failed else "",
        idle=tuple(sorted(kinds[i] for i in idle_faults(result.history))),
        probes=tuple(sorted(probes_hit(result.history))),
        caught=caught(result.verdicts, scenario.expect.caught_by),
    )


def judge_many(tasks: list[SeedTask]) -> list[SeedOutcome]:
    """A chunk of seeds in one worker call (a seed takes tens of milliseconds; a Ray task
    per seed would spend as long on scheduling)."""
    return [judge(task) for task in tasks]


__all__ = ["CRASHED", "SeedOutcome", "SeedTask", "judge", "judge_many"]
