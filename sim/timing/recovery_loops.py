"""The periodic loops of miles' recovery path, each as a closed form and as simulated runs.

A checker sleeps an interval, checks, and condemns its target after N failed checks in a
row; a retry loop tries N times, a fixed time apart. The window from a death to the verdict
has a closed form (``CheckerLoop.window``): the death lands anywhere in an interval, and each
failed check takes 0 s when the call is refused at once (a dead process: Ray refuses a call
to a dead actor, a closed port refuses a connection) or its timeout when nothing answers (a
hung process). Where the simulator runs the loop (the trainer heartbeat, the rollout health
monitor, the request retries, the mini FT controller) the fault lands at several phases of
it, and the windows the histories show must lie inside the closed form's (``loop_checks``;
tests/test_recovery_anchors.py), so a change to a loop's cadence shows in both.
sim/timing/recovery_anchors.py compares them with the published rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miles_core.events import (
    CellRestartAsked,
    CellStateChanged,
    EngineRecoveryAsked,
    Event,
    RequestRetried,
    RunEnded,
)
from miles_core.kinds import RunStatus
from miles_core.profile import MilesProfile
from miles_core.scenario.faults import AnyFault, make_fault
from miles_core.scenario.model import Expect, Scenario
from miles_core.scenario.presets import DEFAULT_LOOP
from miles_core.scenario.world import TimeModel, WorldShape
from sim.run import SimResult, run_scenario

PHASES = (0.0, 0.25, 0.5, 0.75, 0.95)
"""Where in the loop's interval each simulated fault lands (a share of the interval)."""


@dataclass(frozen=True)
class CheckerLoop:
    """A periodic checker: a check every ``interval`` seconds; ``threshold`` failed checks in
    a row condemn the target; a failed check takes ``check_seconds`` (0: refused at once; the
    timeout: unanswered)."""

    interval: float
    check_seconds: float
    threshold: int

    def window(self) -> tuple[float, float]:
        """Seconds from the death to the verdict, at the best and the worst phase: the first
        failed check starts within an interval of the death, each later one an interval and
        a failed check after the one before."""
        first = (self.threshold - 1) * (self.interval + self.check_seconds) + self.check_seconds
        return first, first + self.interval


@dataclass(frozen=True)
class RetryLoop:
    """miles' ``_post`` (miles/utils/http_utils.py): ``tries`` tries in all, ``interval`` s
    apart, each failing after ``failure_seconds``; the last failure is raised."""

    tries: int
    interval: float
    failure_seconds: float

    def window(self) -> tuple[float, float]:
        seconds = (self.tries - 1) * self.interval + self.tries * self.failure_seconds
        return seconds, seconds


ROUTER_EVICTION = CheckerLoop(interval=30.0, check_seconds=0.0, threshold=3)
"""miles/router/router.py ``MilesRouter._health_check_loop``: sleep
--rollout-health-check-interval (30 s), GET /health of every listed worker (5 s timeout), a
worker DEAD after --miles-router-health-check-failure-threshold (3) failures in a row; a
killed engine's port refuses at once."""
HEARTBEAT_REFUSED = CheckerLoop(interval=10.0, check_seconds=0.0, threshold=3)
"""miles/utils/ft_utils/health_checker.py ``SimpleHealthChecker._loop`` under the trainer's
defaults (--trainer-heartbeat-checker-interval 10, -timeout 10, -failure-threshold 3), the
heartbeat to a killed cell refused at once (Ray's ActorDiedError)."""
HEARTBEAT_UNANSWERED = CheckerLoop(interval=10.0, check_seconds=10.0, threshold=3)
"""The same checker when the heartbeat goes unanswered: each check waits its 10 s timeout."""
MONITOR_KILLED = CheckerLoop(interval=30.0, check_seconds=0.0, threshold=1)
"""miles/utils/health_monitor.py ``RolloutHealthMonitor`` at its defaults (30 s interval and
timeout, one failed check): a killed engine's exit is reported at once, and its recovery
asked at the monitor's next round."""
MONITOR_HUNG = CheckerLoop(interval=30.0, check_seconds=30.0, threshold=1)
"""The same monitor and a hung engine: its check waits the 30 s timeout."""
MILES_RETRY = RetryLoop(tries=60, interval=1.0, failure_seconds=0.01)
"""miles' ``_post``: ``max_retries=60``, ``asyncio.sleep(1)`` between tries; a router that is
down refuses the connection (a loopback round trip, taken as 0.01 s)."""


def _recovery_scenario(
    name: str,
    fault: AnyFault,
    timing: TimeModel,
    max_seconds: float | None = None,
    expect: Expect | None = None,
    **loop: Any,
) -> Scenario:
    """The small preset's world and loop (miles' checkers at the settings given) with one
    fault."""
    return Scenario(
        name,
        world=WorldShape(),
        timing=timing,
        loop=dataclasses.replace(DEFAULT_LOOP, **loop),
        faults=(fault,),
        expect=expect or Expect(),
        max_seconds=max_seconds,
    )


def _judged(scenario: Scenario) -> SimResult:
    """A run whose oracles all passed: a window read off a run that broke a rule (or
    crashed) would be no prediction."""
    result = run_scenario(scenario, seed=0)
    if not result.ok:
        faults = "; ".join(repr(f) for f in scenario.faults)
        raise RuntimeError(
            f"the recovery run {scenario.name} (seed 0, faults {faults}) did not pass its "
            f"oracles (replay: python -m sim predict --anchors):\n{result.failures()}"
        )
    return result


def _windows(
    make: Callable[[float], Scenario],
    measure: Callable[[Sequence[Event], float], float],
    start: float,
    interval: float,
) -> tuple[float, ...]:
    """One simulated run per phase: the fault at ``start + phase x interval``; ``measure``
    reads the window from the history."""
    out = []
    for phase in PHASES:
        at = start + phase * interval
        result = _judged(make(at))
        out.append(round(measure(list(result.history), at), 2))
    return tuple(out)


_IDLE_TRAINER = TimeModel(
    response_tokens_mean=30_000.0, response_tokens_sigma=0.01, response_tokens_max=40_000
)
"""Responses of ~300 s: the first batch takes that long, so no training call reaches the
killed cell first and only the heartbeat can find it."""


def _heartbeat_scenario(
    fault: str, loop: CheckerLoop, controller: bool = False
) -> Callable[[float], Scenario]:
    def make(at: float) -> Scenario:
        extra = {"duration": 300.0} if fault == "drop_heartbeat" else {}
        return _recovery_scenario(
            f"recovery-{fault}",
            make_fault(fault, cell=1, at=at, **extra),
            _IDLE_TRAINER,
            max_seconds=2_000.0,
            heartbeat_interval=loop.interval,
            heartbeat_timeout=10.0,
            heartbeat_failure_threshold=loop.threshold,
            mini_ft_controller_enable=controller,
            steps=1,
        )

    return make


def _cell_failed(history: Sequence[Event], at: float) -> float:
    for event in history:
        if (
            isinstance(event, CellStateChanged)
            and event.cell == 1
            and event.t >= at
            and "heartbeat" in event.reason
        ):
            return event.t - at
    raise AssertionError("the heartbeat never failed cell 1")


def heartbeat_windows(loop: CheckerLoop) -> tuple[float, ...]:
    """A cell killed (refused heartbeats) or muted (unanswered) while the trainer waits."""
    fault = "kill_cell" if loop.check_seconds == 0 else "drop_heartbeat"
    return _windows(_heartbeat_scenario(fault, loop), _cell_failed, 100.0, loop.interval)


CONTROLLER_POLL = 10.0
CONTROLLER_DELAY = 10.0
"""miles' mini FT controller's defaults (--mini-ft-controller-poll-interval and
-resume-delay; miles/utils/arguments.py)."""


def controller_window() -> tuple[float, float]:
    """From a cell's death while idle to the controller's resume: the heartbeat's verdict
    (refused), the controller's next poll (its grid is not the heartbeat's), the delay."""
    low, high = HEARTBEAT_REFUSED.window()
    return low + CONTROLLER_DELAY, high + CONTROLLER_POLL + CONTROLLER_DELAY


def controller_runs() -> tuple[tuple[float, float], ...]:
    """Each phase's (death to resume, suspend to resume) under miles' controller defaults:
    cell 1 killed while the trainer waits, found by the heartbeat, resumed by the controller
    (miles_core/loop/cell_controller.py)."""
    make = _heartbeat_scenario("kill_cell", HEARTBEAT_REFUSED, controller=True)
    out = []
    for phase in PHASES:
        at = 100.0 + phase * HEARTBEAT_REFUSED.interval
        history = list(_judged(make(at)).history)
        asked = next(e for e in history if isinstance(e, CellRestartAsked) and e.cell == 1)
        out.append((round(asked.t - at, 2), round(asked.t - asked.suspended, 2)))
    return tuple(out)


def _recovery_asked(history: Sequence[Event], at: float) -> float:
    for event in history:
        if isinstance(event, EngineRecoveryAsked) and event.engine == "engine-1" and event.t >= at:
            return event.t - at
    raise AssertionError("no recovery of engine-1 was asked")


def monitor_windows(
    loop: CheckerLoop, profile: MilesProfile = MilesProfile.AUG2026
) -> tuple[float, ...]:
    """miles' rollout health monitor: from a kill (refused) or a hang (unanswered) of an
    engine to the recovery the monitor asks. 31f1ca9's ``RolloutHealthMonitor`` exists under
    the aug2026 profile only; under today (``profile``) the mini FT controller asks it
    (``today_killed_window``)."""
    fault = "kill_engine" if loop.check_seconds == 0 else "hang_engine"
    interval = loop.interval

    def make(at: float) -> Scenario:
        return _recovery_scenario(
            f"recovery-{fault}",
            make_fault(fault, engine="engine-1", at=at),
            TimeModel(response_tokens_mean=3_000.0, response_tokens_sigma=0.3),
            max_seconds=4_000.0,
            use_fault_tolerance=True,
            rollout_health_check_interval=interval,
            rollout_health_check_timeout=loop.check_seconds or interval,
            steps=12,
            miles_profile=profile,
        )

    return _windows(make, _recovery_asked, 100.0, interval)


def today_killed_window() -> tuple[float, float]:
    """Under today's miles, from an engine's kill to its resume: the controller finds it down
    at its next poll (``_MiniFTController.run``, mini_ft_controller.py 03df7d98: every
    --mini-ft-controller-poll-interval), suspends it, and resumes it the resume delay later
    (``_heal``). The status checker plays no part: the exit is reported at once.

    Not done: today's hung engine. Its window is the checker's (timeout, interval), then a poll
    and the delay, unless the hang meets an update window, which pauses the checker
    (``start_update_weights``) and leaves the hang to the update's
    --update-weight-engine-request-timeout (300 s), counted from the update's first call to
    it: no closed form without the step's timing; the hung row is checked under aug2026."""
    return CONTROLLER_DELAY, CONTROLLER_POLL + CONTROLLER_DELAY


def retry_window(loop: RetryLoop = MILES_RETRY) -> float:
    """The router down for longer than the retries last: from a request's first failed try
    to the run's end (miles' worker raises ``_post``'s last error)."""
    scenario = _recovery_scenario(
        "recovery-retry",
        make_fault("fail_router", at=1.0, duration=1_000.0),
        TimeModel(router_failure_seconds=loop.failure_seconds),
        expect=Expect(RunStatus.FAILED, "RequestFailedError"),
        request_max_retries=loop.tries,
        request_retry_interval=loop.interval,
        steps=4,
    )
    history = list(_judged(scenario).history)
    ended = next(e for e in history if isinstance(e, RunEnded))
    first = min(e.sent for e in history if isinstance(e, RequestRetried) and e.attempt == 1)
    return round(ended.t - first, 2)


@dataclass(frozen=True)
class LoopCheck:
    """One of the simulator's loops against its closed form."""

    loop: str
    closed_form: tuple[float, float]
    simulated: tuple[float, ...]

    @property
    def inside(self) -> bool:
        low, high = self.closed_form
        return all(low - 0.5 <= s <= high + 0.5 for s in self.simulated)


def loop_checks() -> list[LoopCheck]:
    """The trainer heartbeat and the rollout health monitor (aug2026: 31f1ca9's monitor),
    refused and unanswered, today's controller after a killed engine, and the FT controller
    after the heartbeat, each simulated at every phase (0.5 s of slack: a healthy heartbeat
    round takes 0.01 s, so the rounds drift from the interval's grid)."""
    resumed = tuple(death for death, _ in controller_runs())
    return [
        LoopCheck(
            "trainer heartbeat, cell killed (10/10/3)",
            HEARTBEAT_REFUSED.window(),
            heartbeat_windows(HEARTBEAT_REFUSED),
        ),
        LoopCheck(
            "trainer heartbeat, cell muted (10/10/3)",
            HEARTBEAT_UNANSWERED.window(),
            heartbeat_windows(HEARTBEAT_UNANSWERED),
        ),
        LoopCheck(
            "aug2026: rollout health monitor, engine killed (30/30)",
            MONITOR_KILLED.window(),
            monitor_windows(MONITOR_KILLED),
        ),
        LoopCheck(
            "aug2026: rollout health monitor, engine hung (30/30)",
            MONITOR_HUNG.window(),
            monitor_windows(MONITOR_HUNG),
        ),
        LoopCheck(
            "today: mini FT controller resumes a killed engine (poll 10, delay 10)",
            today_killed_window(),
            monitor_windows(MONITOR_KILLED, MilesProfile.TODAY),
        ),
        LoopCheck(
            "FT controller resumes a killed cell (10/10/3, 10, 10)", controller_window(), resumed
        ),
    ]
