"""miles as it is, bugs included, behind switches: each switch (a LoopConfig flag, off by
default) makes the loop do what miles does, and a named scenario that passes every oracle
with it off fails a named oracle with it on. No assertion here stands in for an oracle: the
oracle's verdict is the finding; the rest checks that the switch did what miles does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from miles_core.events import (
    BucketReceived,
    EngineHealthFailed,
    EnginesFlushed,
    EngineStamped,
    History,
    SampleGenerated,
    UpdateAborted,
    UpdateBegan,
)
from miles_core.loop.update import P2P_TRANSFER_TIMEOUT
from miles_core.profile import MilesProfile
from miles_core.report.summary import world_and_flags
from miles_core.scenario import SCENARIOS
from miles_core.scenario.faults import make_fault
from miles_core.scenario.model import Scenario
from sim.run import SimResult, run_scenario

BUGS = [
    # switch, scenario, the oracles that fail with it on (the first is the bug's), what it says
    (
        "miles_bug_p2p_failures_logged",
        "p2p_link_stalls",
        ("update_order",),
        "engine-0 (process 0) was stamped after it received 0 of 1 buckets",
    ),
    (
        "miles_bug_health_monitor_left_paused",
        "sync_fails_then_engine_hangs",
        ("end_state", "fault_witness"),
        "the run stalled",
    ),
    (
        "miles_bug_fsdp_ignores_pause_mode",
        "in_place_long_generations",
        ("update_order",),
        "flushed the cache under in_place",
    ),
]


def of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def switched(scenario: Scenario, **loop: Any) -> Scenario:
    return dataclasses.replace(scenario, loop=dataclasses.replace(scenario.loop, **loop))


AUG2026_ONLY = {"sync_fails_then_engine_hangs"}
"""Scenarios of a bug of 31f1ca9's RolloutHealthMonitor (left paused), which today's miles no
longer has (its checker only sets a status: issue 50 item 4): run under the aug2026 profile."""


def scenario_of(name: str) -> Scenario:
    scenario = SCENARIOS[name]
    if name in AUG2026_ONLY:
        return switched(scenario, miles_profile=MilesProfile.AUG2026)
    return scenario


def run(name: str, on: str | None = None, seed: int = 0) -> SimResult:
    scenario = scenario_of(name)
    return run_scenario(scenario if on is None else switched(scenario, **{on: True}), seed)


@pytest.mark.parametrize(("switch", "name", "oracles", "says"), BUGS)
def test_a_miles_bug_switched_on_fails_its_oracle(
    switch: str, name: str, oracles: tuple[str, ...], says: str
) -> None:
    assert getattr(SCENARIOS[name].loop, switch) is False  # off unless asked for
    off = run(name)
    assert off.ok, off.failures()
    on = run(name, switch)
    assert world_and_flags(on.scenario)["miles_bugs"] == [switch]  # the summary names it
    assert not on.ok
    failed = {oracle for oracle, verdict in on.verdicts.items() if verdict is not None}
    assert failed == set(oracles), on.failures()
    assert says in str(on.verdicts[oracles[0]])


@pytest.mark.parametrize(
    ("name", "switch"),
    [
        ("no_failure", "miles_bug_p2p_failures_logged"),  # broadcast: not miles' p2p path
        ("no_failure", "miles_bug_health_monitor_left_paused"),  # no update raises
        ("retract_long_generations", "miles_bug_fsdp_ignores_pause_mode"),  # retract anyway
        ("p2p_transfer", "miles_bug_fsdp_ignores_pause_mode"),
    ],
)
def test_a_switch_changes_nothing_where_its_bug_cannot_act(name: str, switch: str) -> None:
    assert run(name, switch).hash == run(name).hash


def test_p2p_writes_that_outlast_the_wait_are_only_logged() -> None:
    """miles' ``wait_transfers`` waits for each write (one per engine and bucket) at most
    --p2p-transfer-timeout in turn, then the update stamps: the stalled update stamps both
    engines 2 x 30 s after it began, before either write arrived. Without the switch the
    update waits for the writes (~100 s) and stamps after they arrived."""
    on = run("p2p_link_stalls", "miles_bug_p2p_failures_logged")
    stalled = next(e for e in of(on.history, UpdateBegan) if e.update_id == 1)
    stamps = [e for e in of(on.history, EngineStamped) if e.update_id == 1]
    assert len(stamps) == 2
    assert all(s.t == pytest.approx(stalled.t + 2 * P2P_TRANSFER_TIMEOUT) for s in stamps)
    arrived = [e for e in of(on.history, BucketReceived) if e.update_id == 1]
    assert all(e.t > stamps[0].t for e in arrived)  # late or never (the run ended first)
    off = run("p2p_link_stalls")
    stamps = [e for e in of(off.history, EngineStamped) if e.update_id == 1]
    arrived = [e for e in of(off.history, BucketReceived) if e.update_id == 1]
    assert len(arrived) == 2 and max(e.t for e in arrived) <= min(s.t for s in stamps)
    assert min(s.t for s in stamps) - stalled.t > 3 * P2P_TRANSFER_TIMEOUT


def test_a_failed_sync_leaves_the_monitor_paused_until_the_next_rollout() -> None:
    """The sync cell 0 died sending raised (one route attempt). Without the switch the monitor
    finds the hang; with it, nothing does while this batch waits for the hung engine. A hang
    after the next rollout began is found: the pause lasts until miles' next generate()."""
    off = run("sync_fails_then_engine_hangs")
    failed = [(e.engine, e.incarnation) for e in of(off.history, EngineHealthFailed)]
    assert [f for f in failed if f[0] == "engine-0"] == [("engine-0", 0)]
    # engine-1's new process, left paused by the sync that failed until the next rollout
    # resumes it, answers no /health_generate (a request, which a paused engine does not
    # schedule), so the monitor takes it for dead and replaces it, as miles' would
    assert set(failed) <= {("engine-0", 0), ("engine-1", 1)}
    on = run("sync_fails_then_engine_hangs", "miles_bug_health_monitor_left_paused")
    (aborted,) = of(on.history, UpdateAborted)
    assert aborted.component == "cell-0"
    assert not of(on.history, EngineHealthFailed)
    scenario = scenario_of("sync_fails_then_engine_hangs")
    later = dataclasses.replace(
        scenario,
        faults=(
            *scenario.faults[:2],
            make_fault("hang_engine", engine="engine-0", point="step_begin", step=2),
        ),
    )
    result = run_scenario(switched(later, miles_bug_health_monitor_left_paused=True), 0)
    assert result.ok, result.failures()
    assert [e.engine for e in of(result.history, EngineHealthFailed)] == ["engine-0"]


def test_the_fsdp_updater_retracts_and_flushes_under_in_place() -> None:
    """in_place keeps each request's KV across an update and flushes nothing; miles' FSDP
    updater pauses with SGLang's default, retract, and flushes: no request keeps its KV."""
    off = run("in_place_long_generations")
    assert not of(off.history, EnginesFlushed)
    assert any(s.kept_kv for s in of(off.history, SampleGenerated))
    on = run("in_place_long_generations", "miles_bug_fsdp_ignores_pause_mode")
    assert len(of(on.history, EnginesFlushed)) == len(of(on.history, UpdateBegan))
    assert not any(s.kept_kv for s in of(on.history, SampleGenerated))
