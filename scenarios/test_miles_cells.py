"""Today's rollout cell lifecycle and update window (issue 50, items 1 and 2), in the simulator
under both miles profiles.

- A replacement process is pending weights until the next full update marks its weights
  ready (``ServerCell.mark_weights_ready``, server_cell.py at b8afde1e); miles at 31f1ca9
  (aug2026) synced it at once (``recover_updatable_engines``).
- A full update's window opens only when no engine is initializing
  (``InferenceController._ensure_cells_ready``: 2 s polls, 3600 s, then TimeoutError).
- An aborted window stops every snapshot process still matching it, and the retry waits for
  their replacements (miles' driver test, index id 58310130319).
- The serving capacity lost, per fault, is larger under today.

The CPU backend runs the scenario file as a conformance case (tests/test_cpu_backend.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from miles_core.engines import EngineState
from miles_core.events import (
    EngineRecoveryAsked,
    EngineStarted,
    EngineStateChanged,
    History,
    ParticipantsStopped,
    UpdateAborted,
    UpdateBegan,
    UpdateWindowOpened,
    UpdateWindowWaiting,
)
from miles_core.kinds import RunStatus
from miles_core.loop.window import CELLS_READY_POLL_INTERVAL_SECONDS
from miles_core.profile import MilesProfile
from miles_core.report.capacity import serving_capacity
from miles_core.scenario import SCENARIOS, Scenario, scenario_from_toml
from miles_core.scenario.files import load_scenario_file
from sim.run import SimResult, run_scenario

FILE = Path(__file__).resolve().parent / "files" / "replacement_waits_for_the_next_update.toml"
TODAY, AUG = MilesProfile.TODAY, MilesProfile.AUG2026
FT = {
    "use_fault_tolerance": True,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
}


def of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def under(scenario: Scenario, profile: MilesProfile, **loop: Any) -> Scenario:
    return dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, miles_profile=profile, **loop)
    )


def passed(scenario: Scenario, seed: int = 0) -> SimResult:
    result = run_scenario(scenario, seed)
    assert result.ok, result.failures()
    return result


def served_by(history: History, engine: str, incarnation: int) -> UpdateBegan:
    """The update that brought that process into rotation."""
    back = next(
        e
        for e in of(history, EngineStateChanged)
        if e.engine == engine and e.incarnation == incarnation and e.new is EngineState.SERVING
    )
    update_id = int(back.reason.split("update ")[1].split()[0])
    return next(e for e in of(history, UpdateBegan) if e.update_id == update_id)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_today_a_replacement_serves_only_after_the_next_full_update(seed: int) -> None:
    history = passed(under(load_scenario_file(FILE), TODAY), seed).history
    assert not [e for e in of(history, UpdateBegan) if not e.publishes]  # no sync at all
    for engine in ("engine-0", "engine-1"):
        update = served_by(history, engine, 1)
        started = next(e for e in of(history, EngineStarted) if e.engine == engine)
        assert update.publishes and update.t >= started.t
        assert engine in update.engines


RESTART_MID_ROLLOUT = """
until_witnessed = 40
[loop]
steps = 5
mode = "sync"
[[faults]]
kind = "restart_engine"
engine = "engine-1"
point = "mid_generation"
after_step = 2
"""
"""miles' train.py loop: the weights lock is free while a batch is generated, so a process
that comes up mid-rollout could be synced at once."""


def test_a_process_up_mid_rollout_waits_for_the_next_update_today_only() -> None:
    scenario = scenario_from_toml(RESTART_MID_ROLLOUT, "restart_mid_rollout")
    served = {}
    for profile in (AUG, TODAY):
        history = passed(under(scenario, profile)).history
        [started] = of(history, EngineStarted)
        update = served_by(history, "engine-1", 1)
        served[profile] = update.t - started.t
        if profile is AUG:  # recover_updatable_engines: synced alone, at once
            assert not update.publishes and update.engines == ("engine-1",)
            assert update.t == started.t
        else:  # pending weights until the step's full update marks them ready
            assert update.publishes and "engine-1" in update.engines
            assert not [e for e in of(history, UpdateBegan) if not e.publishes]
    assert served[TODAY] > served[AUG] + 5.0  # the rest of the rollout and the training


def test_aug2026_a_replacement_is_synced_at_once() -> None:
    """At seed 0 both new processes come up while the weights lock is free (the trainer waits
    for generation): each is synced alone, as it starts (at seed 2 a step holds the lock
    then, and the step's own update takes them: a sync waits for the lock)."""
    history = passed(under(load_scenario_file(FILE), AUG)).history
    syncs = {e.engines: e for e in of(history, UpdateBegan) if not e.publishes}
    assert set(syncs) == {("engine-0",), ("engine-1",)}  # recover_updatable_engines
    for (engine,), sync in syncs.items():
        started = next(e for e in of(history, EngineStarted) if e.engine == engine)
        assert sync.t == started.t and served_by(history, engine, 1) is sync
    assert not of(history, UpdateWindowWaiting)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_today_the_window_waits_for_an_engine_still_starting(seed: int) -> None:
    history = passed(under(load_scenario_file(FILE), TODAY), seed).history
    [waiting] = of(history, UpdateWindowWaiting)
    [opened] = of(history, UpdateWindowOpened)
    assert waiting.engines == ("engine-0",)
    started = next(e for e in of(history, EngineStarted) if e.engine == "engine-0")
    assert waiting.t < started.t <= opened.t < started.t + CELLS_READY_POLL_INTERVAL_SECONDS
    assert opened.waited == pytest.approx(opened.t - waiting.t)
    # no update began while it waited; the one that opened takes the new process
    assert not [e for e in of(history, UpdateBegan) if waiting.t <= e.t < opened.t]
    first = next(e for e in of(history, UpdateBegan) if e.t >= opened.t)
    assert "engine-0" in first.engines and first.publishes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_capacity_lost_to_a_killed_engine_is_larger_today(seed: int) -> None:
    scenario = load_scenario_file(FILE)
    lost = {p: serving_capacity(passed(under(scenario, p), seed).history) for p in (AUG, TODAY)}
    assert lost[TODAY]["engine_seconds_not_serving"] > lost[AUG]["engine_seconds_not_serving"]
    for p in (AUG, TODAY):  # every lost second is laid to one of the two kills
        rows = {r["fault"]: r for r in lost[p]["by_fault"]}
        assert rows[0]["outages"] == 1 and rows[2]["outages"] == 1 and rows[1]["outages"] == 0
        assert lost[p]["unattributed"] == 0.0


def test_today_an_aborted_window_stops_its_participants_and_the_retry_waits() -> None:
    """The updater cell dies mid-broadcast: today every engine of the snapshot is stopped
    (partial weights possible) and the retry's window opens only once both replacements
    are up; aug2026 fails over to the other cell with the same engines."""
    crash = SCENARIOS["crash_mid_weight_update"]
    today = passed(under(crash, TODAY, **FT)).history
    [aborted] = of(today, UpdateAborted)
    [stopped] = of(today, ParticipantsStopped)
    assert stopped.update_id == aborted.update_id
    assert stopped.engines == ("engine-0", "engine-1") and stopped.incarnations == (0, 0)
    [waiting] = of(today, UpdateWindowWaiting)
    [opened] = of(today, UpdateWindowOpened)
    assert waiting.engines == ("engine-0", "engine-1")
    retry = next(e for e in of(today, UpdateBegan) if e.update_id > aborted.update_id)
    new = {e.engine: e for e in of(today, EngineStarted)}
    assert set(new) == {"engine-0", "engine-1"}
    assert max(e.t for e in new.values()) <= opened.t <= retry.t
    assert retry.version == aborted.version  # the abandoned version, reserved again
    assert all(e.engine in new for e in of(today, EngineRecoveryAsked))

    aug = passed(under(crash, AUG, **FT)).history
    assert not of(aug, ParticipantsStopped) and not of(aug, EngineStarted)


def test_today_without_fault_tolerance_nothing_is_stopped_or_waited_for() -> None:
    """Nothing would bring a stopped engine back, and a dead one is not initializing."""
    for name in ("crash_mid_weight_update", "engine_crash_mid_generation"):
        history = passed(under(SCENARIOS[name], TODAY)).history
        assert not of(history, ParticipantsStopped)
        assert not of(history, UpdateWindowWaiting)


def test_today_a_pristine_replacement_serves_at_once() -> None:
    """No version was ever reserved: its initial weights are the current ones (kept as is)."""
    source = """
[[faults]]
kind = "restart_engine"
engine = "engine-1"
point = "step_begin"
step = 0
"""
    history = passed(under(scenario_from_toml(source, "pristine"), TODAY)).history
    back = [e for e in of(history, EngineStateChanged) if e.new is EngineState.SERVING]
    assert [e.incarnation for e in back] == [1]
    assert back[0].reason.startswith("no version was ever reserved")


def test_today_the_window_gives_up_after_an_hour() -> None:
    """miles' _ensure_cells_ready raises TimeoutError after 3600 s; so does the update here."""
    source = """
expect = { status = "failed", error = "UpdateWindowTimeoutError" }
max_seconds = 5000.0
progress_window = 5000.0
[loop]
steps = 4
use_fault_tolerance = true
rollout_health_check_interval = 2.0
rollout_health_check_timeout = 2.0
[[faults]]
kind = "slow_start"
engine = "engine-1"
seconds = 4000.0
duration = 100.0
point = "step_begin"
step = 1
[[faults]]
kind = "kill_engine"
engine = "engine-1"
after = { fault = 0 }
"""
    result = passed(under(scenario_from_toml(source, "window_times_out"), TODAY))
    [waiting] = of(result.history, UpdateWindowWaiting)
    assert "3600s" in result.report.reason and "engine-1" in result.report.reason
    assert result.history[len(result.history) - 1].t == pytest.approx(waiting.t + 3600.0)


@pytest.mark.parametrize("profile", [TODAY, AUG])
def test_a_kill_that_finds_the_engine_already_stopped_has_nothing_to_witness(
    profile: MilesProfile,
) -> None:
    """A kill_engine that fires while the engine has no process acts on nothing (the world
    kills only a live one), so fault_witness asks nothing of it. Seen as swarm seed 332 under
    today: an aborted window's participants are suspended by the FT controller (the process
    exits) and resumed 10 s later, and a kill drawn for that stretch found no process. Here,
    in either profile, without fault tolerance: engine-1 killed at step 1 stays dead, and a
    second kill at step 3 finds nothing. With the first exit taken out of the history (the
    engine alive when the second kill fired), that kill is a fault with no effect."""
    from miles_core.events import EngineExited, FaultInjected
    from miles_core.oracles.witnesses import fault_witness
    from miles_core.scenario.faults import KillEngine, StepBegin

    kills = tuple(KillEngine(when=StepBegin(step=k), engine="engine-1") for k in (1, 3))
    s = dataclasses.replace(SCENARIOS["no_failure"], faults=kills)
    h = passed(under(s, profile, use_fault_tolerance=False)).history
    events = list(h)
    fired = [e for e in events if isinstance(e, FaultInjected)]
    exits = [e for e in events if isinstance(e, EngineExited) and e.engine == "engine-1"]
    assert len(fired) == 2 and [e.t for e in exits] == [fired[0].t]  # the second found none
    alive = History([e for e in events if e not in exits])
    violation = fault_witness(alive)
    assert violation is not None and "step=3) had no effect" in violation.message


def test_today_every_engine_replaced_mid_rollout_waits_for_an_update_that_never_comes() -> None:
    """A hazard of today's miles as read, kept visible: both engines are replaced while a
    fully-async batch generates; each new process waits pending weights for the next full
    update (``ServerCell.mark_weights_ready``), which waits for that batch, which needs a
    serving engine. miles at 31f1ca9 syncs each new process alone and the run completes.
    (miles' router with no worker would refuse the requests instead, failing the rollout
    after its retries; the testbed's router holds them, so the run stalls.)"""
    scenario = SCENARIOS["sync_fails_then_engine_hangs"]
    assert scenario.loop.miles_profile is MilesProfile.AUG2026  # its point is the old sync
    assert run_scenario(scenario, 0).ok
    today = dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, miles_profile=MilesProfile.TODAY)
    )
    result = run_scenario(today, 0)
    assert result.report.status is RunStatus.STALLED
    last = {e.engine: e.new for e in result.history if isinstance(e, EngineStateChanged)}
    assert set(last.values()) == {EngineState.UNSYNCED}  # both pending weights at the end
