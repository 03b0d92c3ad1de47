"""miles_core.conformance reads decisions out of histories; simulator runs exercise it."""

from __future__ import annotations

from pathlib import Path

from miles_core.conformance import decisions, rollout
from miles_core.events import History, UpdateAborted
from miles_core.kinds import AbortCause
from sim.run import run_scenario
from sim.scenarios import SCENARIOS, load_scenario_file


def test_same_scenario_other_seed_decides_the_same() -> None:
    scenario = SCENARIOS["cell_crash_before_allreduce"]
    a, b = run_scenario(scenario, 0), run_scenario(scenario, 7)
    assert a.hash != b.hash  # different timings...
    assert decisions(a.history).differences(decisions(b.history)) == []  # ...same decisions


def test_a_different_fault_is_a_difference_naming_the_fields() -> None:
    crash = decisions(run_scenario(SCENARIOS["cell_crash_before_allreduce"], 0).history)
    calm = decisions(run_scenario(SCENARIOS["no_failure"], 0).history)
    fields = {d.split(":")[0] for d in crash.differences(calm)}
    assert {"attempts", "cells", "quorums", "heals"} <= fields
    assert "versions" not in fields  # both publish 1..8 from cell 0


def test_decisions_hold_what_the_scenario_is_about() -> None:
    d = decisions(run_scenario(SCENARIOS["crash_mid_weight_update"], 0).history)
    assert d.aborted_updates == ((1, 0),)  # version 1 on cell 0 was aborted...
    assert d.versions[0] == (1, 1)  # ...and published by cell 1 with the same number
    assert d.status == "completed"


def test_engine_caused_aborts_are_timing_not_decisions() -> None:
    history = History()
    for t, cause, component in (
        (0.0, AbortCause.ENGINE, "engine-1"),
        (1.0, AbortCause.CELL, "cell-0"),
    ):
        history.append(
            UpdateAborted(
                t=t, update_id=int(t), version=1, cause=cause, component=component, reason="died"
            )
        )
    assert rollout(history).updates_aborted_by_engines == 1
    assert decisions(history).aborted_updates == ((1, -1),)


def test_engines_are_compared_by_the_processes_the_world_reported_and_where_they_ended() -> None:
    restart = decisions(run_scenario(SCENARIOS["engine_restart"], 0).history)
    assert restart.engines == (("engine-0", (1,), "serving"), ("engine-1", (), "serving"))
    crash = decisions(run_scenario(SCENARIOS["engine_crash_mid_generation"], 0).history)
    assert crash.engines == (("engine-0", (), "serving"), ("engine-1", (), "down"))


def test_the_staleness_gate_is_a_decision_and_its_holds_are_timing() -> None:
    """Whether the gate armed, and that nothing was refused as stale under it, hold in any
    world; how long it held the producer is timing (reported, not compared)."""
    files = Path(__file__).resolve().parents[1] / "scenarios" / "files"
    gated = run_scenario(load_scenario_file(files / "staleness_gate_submission.toml"), 0)
    dropped = run_scenario(load_scenario_file(files / "staleness_drop_at_buffer.toml"), 0)
    assert decisions(gated.history).gate == (True, 0)
    assert decisions(dropped.history).gate == (False, 0)  # its drops are timing
    groups, seconds = rollout(gated.history).gate_held
    assert groups > 0 and seconds > 0
    assert rollout(dropped.history).gate_held == (0, 0.0)


def test_rollout_counts_reasons() -> None:
    scenario = SCENARIOS["staleness_drop"]
    counts = rollout(run_scenario(scenario, 0).history)
    # under retract (miles' default) an update aborts nothing: only staleness drops groups
    assert {reason for reason, _ in counts.dropped} == {"stale"}
    assert counts.recycled == ()  # the drop handler recycles nothing
    retried = rollout(run_scenario(SCENARIOS["staleness_retry"], 0).history)
    assert {reason for reason, _ in retried.recycled} == {"stale"}
    assert retried.dropped == ()
    crash = rollout(run_scenario(SCENARIOS["engine_crash_mid_generation"], 0).history)
    assert {reason for reason, _ in crash.recycled} == {"aborted"}  # a fault aborts
