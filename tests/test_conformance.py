"""miles_core.conformance reads decisions out of histories; simulator runs exercise it."""

from __future__ import annotations

from miles_core.conformance import decisions, rollout
from miles_core.events import History, UpdateAborted
from sim.run import run_scenario
from sim.scenarios import SCENARIOS


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
    history.append(UpdateAborted(t=0.0, update_id=0, version=1, reason="engine-1: died"))
    history.append(UpdateAborted(t=1.0, update_id=1, version=1, reason="cell-0: died"))
    assert rollout(history).updates_aborted_by_engines == 1
    assert decisions(history).aborted_updates == ((1, -1),)


def test_rollout_counts_reasons() -> None:
    scenario = SCENARIOS["staleness_drop"]
    counts = rollout(run_scenario(scenario, 0).history)
    assert {reason for reason, _ in counts.dropped} == {"aborted", "stale"}
    assert counts.recycled == ()  # the drop handler recycles nothing
    retried = rollout(run_scenario(SCENARIOS["staleness_retry"], 0).history)
    assert {reason for reason, _ in retried.recycled} == {"aborted", "stale"}
    assert retried.dropped == ()
