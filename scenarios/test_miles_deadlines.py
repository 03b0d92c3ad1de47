"""Today's two update deadlines and per-cell isolation (issue 50 item 3), and marin #2374
(item 9), in the simulator under both miles profiles.

- --update-weight-engine-request-timeout: a control call of an update that outlives it gives
  up only that engine (EngineGivenUp) and the update publishes to the others
  (rollout_cell_updater.py ``submit_client_call``, 3eacefd0); aug2026 keeps its old deadline,
  the health check's timeout under fault tolerance, which aborts and retries the update.
- --update-weights-timeout: one trainer cell's update past it fails the cell
  (TrainerController.update_weights); a 340 s hold of the weights fails the run at 300 s
  and passes at 600 s, as marin's fix did.

The CPU backend runs both files as conformance cases (tests/test_cpu_backend.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    BucketReceived,
    EngineGivenUp,
    EnginesResumed,
    EngineStamped,
    EngineStarted,
    History,
    SampleGenerated,
    StepCommitted,
    UpdateAborted,
    VersionPublished,
)
from miles_core.kinds import AbortCause, RunStatus
from miles_core.loop.config import LoopConfig
from miles_core.oracles.updates import update_order
from miles_core.oracles.weights import published_weights
from miles_core.profile import MilesProfile
from miles_core.scenario import Expect, Scenario
from miles_core.scenario.files import load_scenario_file
from sim.run import SimResult, run_scenario

FILES = Path(__file__).resolve().parent / "files"
HANG = FILES / "engine_hangs_mid_update_isolated.toml"
MARIN = FILES / "trainer_restart_slower_than_weight_wait.toml"
NO_CELL = Expect(RunStatus.FAILED, "NoAliveCellError")


def of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def scenario(
    path: Path, profile: MilesProfile, expect: Expect | None = None, **loop: Any
) -> Scenario:
    s = load_scenario_file(path)
    return dataclasses.replace(
        s,
        loop=dataclasses.replace(s.loop, miles_profile=profile, **loop),
        expect=expect or s.expect,
    )


def passed(s: Scenario, seed: int = 0) -> SimResult:
    """The run ended as the scenario expects and every oracle passed."""
    result = run_scenario(s, seed)
    assert result.ok, result.failures()
    return result


# -- the engine-request deadline ----------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_today_a_hung_stamp_gives_up_only_that_engine_and_the_update_publishes(seed: int) -> None:
    result = passed(scenario(HANG, MilesProfile.TODAY), seed)
    h = result.history
    (given,) = of(h, EngineGivenUp)
    assert (given.engine, given.incarnation, given.call) == ("engine-1", 0, "stamp")
    assert "within 3s (--update-weight-engine-request-timeout)" in given.reason
    assert not of(h, UpdateAborted)  # the update went on without it
    published = [e for e in of(h, VersionPublished) if e.update_id == given.update_id]
    assert len(published) == 1
    stamped = {e.engine for e in of(h, EngineStamped) if e.update_id == given.update_id}
    assert stamped == {"engine-0"}  # the errored engine got no stamp
    # fault tolerance replaced it, and a later update brought the new process in
    assert any(e.engine == "engine-1" and e.incarnation == 1 for e in of(h, EngineStarted))
    assert any(e.engine == "engine-1" and e.incarnation == 1 for e in of(h, EngineStamped))


def test_aug2026_keeps_the_health_check_timeout_and_retries_the_update() -> None:
    result = passed(scenario(HANG, MilesProfile.AUG2026))
    h = result.history
    assert not of(h, EngineGivenUp)
    (aborted,) = of(h, UpdateAborted)
    assert aborted.cause is AbortCause.ENGINE and aborted.component == "engine-1"
    assert aborted.reason == "no answer to stamp within 5s"


@pytest.mark.parametrize("timeout", [3.0, 7.0])
def test_the_engine_is_given_up_when_the_flag_says(timeout: float) -> None:
    s = scenario(HANG, MilesProfile.TODAY, update_weight_engine_request_timeout=timeout)
    h = passed(s).history
    (given,) = of(h, EngineGivenUp)
    last_bucket = max(e.t for e in of(h, BucketReceived) if e.update_id == given.update_id)
    assert given.t - last_bucket == pytest.approx(timeout)  # the stamp went out then


def test_today_the_deadline_holds_without_fault_tolerance() -> None:
    """The request deadline is today's whether or not fault tolerance is on: the engine is
    given up and stays down (nothing replaces it), the run goes on with engine-0."""
    result = passed(scenario(HANG, MilesProfile.TODAY, use_fault_tolerance=False))
    h = result.history
    assert [e.engine for e in of(h, EngineGivenUp)] == ["engine-1"]
    assert not [e for e in of(h, EngineStarted) if e.engine == "engine-1" and e.incarnation > 0]
    assert len(of(h, VersionPublished)) == result.scenario.loop.steps


def test_aug2026_without_fault_tolerance_waits_for_ever() -> None:
    """The old behaviour the new deadline removes: with no fault tolerance the hung call has
    no deadline, and the run makes no progress after it."""
    s = scenario(HANG, MilesProfile.AUG2026, use_fault_tolerance=False)
    result = run_scenario(s, 0)
    assert not result.ok
    assert not of(result.history, EngineGivenUp)
    assert len(of(result.history, VersionPublished)) < s.loop.steps


def test_update_order_needs_the_give_up_to_accept_the_publish() -> None:
    """The oracle is what checks the give-up: the same history without its EngineGivenUp is a
    publish before engine-1 (named in the plan) was stamped."""
    h = passed(scenario(HANG, MilesProfile.TODAY)).history
    assert update_order(h) is None
    without = History()
    for e in h:
        if not isinstance(e, EngineGivenUp):
            without.append(e)
    violation = update_order(without)
    assert violation is not None and "before engine-1" in violation.message


# -- the trainer cell's deadline: marin #2374 -----------------------------------------------


def test_marin_2374_at_scale_fails_with_300s_and_passes_with_600s() -> None:
    """An OOM-killed trainer took 5 min 40 s to come back; the weight wait was 300 s."""

    def at_scale(timeout: float, expect: Expect | None = None) -> Scenario:
        s = scenario(MARIN, MilesProfile.TODAY, expect, update_weights_timeout=timeout)
        held = tuple(dataclasses.replace(f, duration=340.0) for f in s.faults)
        return dataclasses.replace(s, faults=held)

    failed = passed(at_scale(300.0, NO_CELL)).history
    (aborted,) = of(failed, UpdateAborted)
    assert aborted.cause is AbortCause.CELL
    assert "within 300s (--update-weights-timeout)" in aborted.reason
    fixed = passed(at_scale(600.0)).history
    assert not of(fixed, UpdateAborted)
    assert len(of(fixed, VersionPublished)) == 5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marin_2374_file_passes_at_600s_and_fails_at_300s_today(seed: int) -> None:
    passed(scenario(MARIN, MilesProfile.TODAY), seed)
    passed(scenario(MARIN, MilesProfile.TODAY, NO_CELL, update_weights_timeout=3.0), seed)


def test_aug2026_has_no_trainer_side_deadline() -> None:
    passed(scenario(MARIN, MilesProfile.AUG2026, update_weights_timeout=3.0))


# -- flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field", ["update_weight_engine_request_timeout", "update_weights_timeout"]
)
def test_the_deadlines_must_be_positive_seconds(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LoopConfig(steps=1, **{field: 0})


def test_miles_defaults() -> None:
    loop = LoopConfig(steps=1)
    assert (loop.update_weight_engine_request_timeout, loop.update_weights_timeout) == (300, 600)


def test_a_given_up_engine_may_answer_what_it_was_sent_before_the_give_up() -> None:
    """The hang moved to pause_generation, 1 s deadline (seen first as swarm seed 316 under
    today): the update gives engine-1 up at its pause and publishes v3 to engine-0; requests
    sent to engine-1 before the give-up answer, at v2, after v3's update completed. No pause
    fenced that process (miles' errored cell gets no further call: rollout_cell_updater.py
    ``submit_client_call``, 3eacefd0) and each answer reports the version it was generated
    from, so published_weights accepts it; the same answer sent after the give-up (to an
    engine out of rotation) is still a violation."""
    s = scenario(HANG, MilesProfile.TODAY, update_weight_engine_request_timeout=1.0)
    s = dataclasses.replace(s, faults=(dataclasses.replace(s.faults[0], call="pause_generation"),))
    h = passed(s, seed=2).history
    (given,) = [e for e in of(h, EngineGivenUp) if e.call == "pause"]
    (resumed,) = [e for e in of(h, EnginesResumed) if e.update_id == given.update_id]
    late = [
        (seq, e)
        for seq, e in h.indexed()
        if isinstance(e, SampleGenerated)
        and (e.engine, e.incarnation) == (given.engine, given.incarnation)
        and not e.aborted
        and e.t > resumed.t
    ]
    assert late and all(e.sent <= given.t for _, e in late)
    assert published_weights(h) is None, published_weights(h)
    seq, sample = late[0]
    events = list(h)
    events[seq] = dataclasses.replace(sample, sent=given.t + 0.001)
    violation = published_weights(History(events))
    assert violation is not None and "after the update to" in violation.message


def test_a_driver_restart_mid_update_leaves_the_ticket_lock_free() -> None:
    """Cells of 2 ranks take miles' weight-update ticket lock under today (broadcast.py
    ``send_bucket``, 069a4115). A driver dying mid-bucket (restart_driver_in_update.toml)
    does not raise in the ranks (their bucket loop is one actor call the driver's death does
    not interrupt: placement_group.update_weights, 0167d10d), so the lock is not left held:
    the new driver's update by the same cell goes through, instead of waiting out
    --update-weights-timeout (600 s) and failing the cell (seen as swarm seed 152)."""
    s = load_scenario_file(FILES / "restart_driver_in_update.toml")
    s = dataclasses.replace(
        s,
        world=dataclasses.replace(s.world, gpus_per_cell=2),
        loop=dataclasses.replace(s.loop, miles_profile=MilesProfile.TODAY),
    )
    h = passed(s).history
    assert not of(h, UpdateAborted)
    assert max(e.t for e in h if isinstance(e, StepCommitted)) < 120.0
