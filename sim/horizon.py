"""How long in virtual time a simulated run may take, and may go without committing a step,
before it counts as stalled: both scale with the time a step is expected to take.

A run that does not finish by its horizon ends STALLED, and one that commits no step within
its progress window fails the progress oracle: so both must lie far past any run that is
only slow. With training time alone (5 s a step), a batch of 1,024 prompts x 16 samples on
two engines (8,192 requests in flight on each, each token slowed by ``concurrency_slowdown``
per request) was called stalled at t=750 while every request was still decoding, and with
the horizon raised, failed progress at its first step (821 s against the 600 s window). The
expected step is liveness.step_parts' nominal one (p99 generation, training, the update),
as the planner's runs take it (sim/timing/plan_file.py).
"""

from __future__ import annotations

from miles_core.kinds import FaultKind
from miles_core.scenario import Scenario
from miles_core.scenario.liveness import step_parts
from miles_core.scenario.model import DEFAULT_PROGRESS_WINDOW

STEPS_OF_SLACK = 50.0
"""Steps' time a step past which a run is called stalled."""
PROGRESS_STEPS = 4.0
"""Nominal steps (a batch's p99 generation, training and the update) within which a step
must commit, and never less than the scenarios' default window."""


def rollout_seconds(scenario: Scenario) -> float:
    """One batch's nominal generation (p99 lengths over the engines' concurrency)."""
    return step_parts(scenario.world, scenario.timing, scenario.loop)["rollout"]


def horizon(scenario: Scenario, most_steps: int, kills_jobs: bool) -> float:
    """The virtual time by which a run of ``most_steps`` must end: the scenario's
    ``max_seconds`` if it sets one, else ``STEPS_OF_SLACK`` steps' time a step (the longer
    of a cell's training and a batch's generation), once more for each kill_job when a job
    runs it (a kill redoes steps)."""
    if scenario.max_seconds is not None:
        return scenario.max_seconds
    step = max(scenario.timing.train_step_seconds, rollout_seconds(scenario))
    seconds = STEPS_OF_SLACK * most_steps * step
    if kills_jobs:
        seconds *= 1 + sum(f.kind is FaultKind.KILL_JOB for f in scenario.faults)
    return seconds


def progress_window(scenario: Scenario) -> float:
    """The scenario's window as it sets it; unset, the default or ``PROGRESS_STEPS`` nominal
    steps, the longer (no step could commit within a window shorter than one)."""
    if scenario.progress_window is not None:
        return scenario.progress_window
    return window_for(sum(step_parts(scenario.world, scenario.timing, scenario.loop).values()))


def window_for(nominal: float) -> float:
    """The progress window of a world whose nominal step takes ``nominal`` seconds (the
    planner's point runs take it too)."""
    return max(DEFAULT_PROGRESS_WINDOW, PROGRESS_STEPS * nominal)
