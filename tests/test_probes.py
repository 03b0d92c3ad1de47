"""Rare-state probes (miles_core.probes): each is hit by the run that reaches its state, and
by no run that does not.

Each library scenario below is built to reach one state; a run with no fault reaches none
of the fault probes, so a probe that fired on everything (or on nothing) fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.events import FaultsHealed, UpdateBegan
from miles_core.kinds import FaultPoint
from miles_core.probes import CORE, PROBE_NAMES, PROBES, probes_hit
from miles_core.scenario import load_scenario_file
from miles_core.scenario.library import SCENARIOS
from miles_core.scenario.liveness import Liveness
from sim.run import run_scenario

ROOT = Path(__file__).resolve().parents[1]

REACHES = {
    "restart_before_stamp": "restart_between_last_bucket_and_stamp",
    "ft_every_engine_dies": "every_engine_down",
    "cell_crash_before_allreduce": "retry_on_shrunk_quorum",
    "ft_engine_hangs_mid_update": "collective_stalled_by_hung_member",
    "engine_killed_mid_update": "engine_lost_mid_update",
    "crash_mid_weight_update": "cell_lost_mid_update",
    "lora_update": "lora_update",
    "heartbeat_false_positive": "heartbeat_missed",
    "staleness_retry": "group_recycled",
}
"""A library scenario, and the probe its story must hit."""

FAULT_PROBES = CORE - {"multi_bucket_update", "first_update_from_none", "group_recycled"}
"""The core probes that only a fault (or a refused flush, or a heal) can reach."""


@pytest.mark.parametrize(("name", "probe"), sorted(REACHES.items()))
def test_a_scenario_built_for_a_state_hits_its_probe(name: str, probe: str) -> None:
    result = run_scenario(SCENARIOS[name], 0)
    assert result.ok, result.failures()
    assert probe in probes_hit(result.history)


def test_a_run_without_faults_hits_no_fault_probe() -> None:
    result = run_scenario(SCENARIOS["no_failure"], 0)
    hit = probes_hit(result.history)
    assert hit & FAULT_PROBES == set()
    assert "first_update_from_none" in hit  # the engines served before any version existed


def test_a_refused_flush_is_a_probe_and_its_file_passes_only_as_it_expects() -> None:
    path = ROOT / "scenarios" / "files" / "sglang_flush_refused_while_queued.toml"
    scenario = load_scenario_file(path)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()  # it ends as expected: FlushTimeoutError
    assert "flush_refused" in probes_hit(result.history)
    fixed = dataclasses.replace(
        scenario, world=dataclasses.replace(scenario.world, flush_refuses_while_queued=False)
    )
    again = run_scenario(fixed, 0)
    assert again.verdicts["end_state"] is not None  # SGLang with #31962: the run completes
    assert "completed" in again.verdicts["end_state"].message
    assert "flush_refused" not in probes_hit(again.history)


def test_a_heal_after_a_bucket_meets_the_update_in_flight() -> None:
    """liveness heal_point = after_bucket: the heal strikes as a bucket arrives, while the
    update is under way, and the run must still meet its bound."""
    base = SCENARIOS["ft_engine_hangs_mid_update"]
    at_step = dataclasses.replace(base, liveness=Liveness(heal_step=2))
    mid = dataclasses.replace(
        base, liveness=Liveness(heal_step=2, heal_point=FaultPoint.AFTER_BUCKET)
    )
    for scenario, expected in ((at_step, False), (mid, True)):
        result = run_scenario(scenario, 0)
        assert result.ok, result.failures()
        assert ("heal_during_update" in probes_hit(result.history)) is expected
        healed = [e for e in result.history if isinstance(e, FaultsHealed)]
        assert [e.step for e in healed] == [2]
    began = [e.t for e in result.history if isinstance(e, UpdateBegan)]
    assert any(t < healed[0].t for t in began)


def test_every_probe_has_a_unique_name_and_a_doc() -> None:
    assert len(set(PROBE_NAMES)) == len(PROBES)
    assert all(p.doc for p in PROBES) and set(PROBE_NAMES) >= CORE


def test_liveness_mode_does_not_ask_for_the_probes_it_cannot_reach() -> None:
    from sim.search.fanout import Tally
    from sim.search.sweep_report import probes_json

    tally = Tally(probes={name: 1 for name in CORE if name != "flush_refused"})
    assert probes_json(tally)["core_missed"] == ["flush_refused"]
    assert probes_json(tally, liveness=True)["core_missed"] == []
