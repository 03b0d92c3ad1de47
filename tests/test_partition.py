"""partition: the trainers and the engines cut apart for a window. A weight-update collective
begun in it moves nothing until it closes, and one that would wait past the group's
timeout fails as a whole, its sending cell raising; liveness mode's heal ends a stall."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import BucketReceived, FaultInjected, UpdateAborted
from miles_core.kinds import AbortCause, FaultKind
from miles_core.probes import probes_hit
from miles_core.scenario import load_scenario_file, make_fault
from miles_core.scenario.library import SCENARIOS
from miles_core.scenario.liveness import Liveness
from miles_core.witness.idle import idle_faults
from sim.run import run_scenario
from sim.search.swarm import swarm_scenario
from sim.world.transport import SimTransport

FILE = Path(__file__).resolve().parents[1] / "scenarios" / "files" / "partition_mid_update.toml"


def _cuts(history: object) -> list[FaultInjected]:
    return [e for e in history if isinstance(e, FaultInjected) and e.fault is FaultKind.PARTITION]


def _sent_in(history: object, cut: FaultInjected) -> list[BucketReceived]:
    end = cut.t + (cut.duration or 0.0)
    return [b for b in history if isinstance(b, BucketReceived) and cut.t <= b.t - b.seconds < end]


def test_a_cut_stalls_what_it_meets_and_fails_a_send_past_the_timeout() -> None:
    result = run_scenario(load_scenario_file(FILE), 0)
    assert result.ok, result.failures()
    (aborted,) = [e for e in result.history if isinstance(e, UpdateAborted)]
    assert (aborted.component, aborted.cause) == ("cell-0", AbortCause.CELL)
    assert "heard from no engine for 8s: the link to the engines is cut" in aborted.reason
    first, second = _cuts(result.history)
    assert aborted.t == pytest.approx(first.t + 8.0)  # the whole collective timeout
    for cut in (first, second):
        sent = _sent_in(result.history, cut)
        end = cut.t + cut.duration  # each arrives as the cut ends (and its bytes move)
        assert sent and all(end <= b.t < end + 0.01 for b in sent)
    assert "update_held_by_a_cut" in probes_hit(result.history)


def test_a_world_that_ignores_the_cut_fails_the_witness(monkeypatch: pytest.MonkeyPatch) -> None:
    async def uncut(self: SimTransport, source_cell: int, bucket: object) -> float:
        return 0.0

    monkeypatch.setattr(SimTransport, "_cut", uncut)
    scenario = load_scenario_file(FILE)
    short_cut = scenario.faults[2]  # 3 s as the update of version 5 begins
    result = run_scenario(dataclasses.replace(scenario, faults=(short_cut,)), 0)
    verdict = result.verdicts["fault_witness"]
    assert verdict is not None and "went through the cut link" in verdict.message


def test_a_cut_that_meets_no_send_is_idle() -> None:
    """Opening as step 1 begins, a second long: over by the time the step's update sends."""
    cut = make_fault("partition", point="step_begin", step=1, duration=1.0)
    scenario = dataclasses.replace(SCENARIOS["no_failure"], faults=(cut,))
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    assert idle_faults(result.history) == {0: "no bucket send began in it"}


def test_liveness_heal_ends_a_stall_under_way() -> None:
    """A cut longer than the run: the update under it waits until liveness mode heals every
    fault (once no step committed for the bound), then goes on within the bound."""
    cut = make_fault("partition", point="step_begin", step=1, duration=10_000.0)
    base = SCENARIOS["no_failure"]
    scenario = dataclasses.replace(base, faults=(cut,), liveness=Liveness(heal_step=3))
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    (cut_fired,) = _cuts(result.history)
    sent = _sent_in(result.history, cut_fired)
    assert sent and max(b.t for b in sent) < cut_fired.t + 1000


@pytest.mark.parametrize(
    ("keys", "field", "fix"),
    [
        ({}, "duration", "how many seconds"),
        ({"duration": 5.0, "cell": 1}, "cell", ""),
        ({"duration": 0.0}, "duration", ""),
    ],
)
def test_bad_keys_name_the_field_and_the_fix(keys: dict, field: str, fix: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_fault("partition", point="step_begin", step=1, **keys)
    assert field in str(error.value) and fix in str(error.value)


def test_a_cut_cannot_strike_inside_a_call() -> None:
    with pytest.raises(ConfigError, match="partition cannot strike at after_bucket"):
        make_fault("partition", duration=5.0, point="after_bucket", bucket=0)


def test_the_swarm_draws_cuts_and_its_runs_pass() -> None:
    seeds = [s for s in range(80) if any(f.kind is FaultKind.PARTITION for f in
             swarm_scenario(s).faults)]  # fmt: skip
    assert len(seeds) >= 5
    for seed in seeds[:4]:
        result = run_scenario(swarm_scenario(seed), seed)
        assert result.ok, f"{result.failures()}\nreplay: python -m sim run swarm --seed {seed}"


def test_a_send_a_cut_held_is_no_baseline_for_a_slow_link() -> None:
    """Swarm seed 8707: a partition held a send of the same route outside a slow_link's
    window; counted in the slow_link's baseline it made the slowed sends look 25.9x slower,
    under the 26.3x a 51.7x slowdown must show, and fault_witness failed."""
    result = run_scenario(swarm_scenario(8707), 8707)
    kinds = {e.fault for e in result.history if isinstance(e, FaultInjected)}
    assert {FaultKind.PARTITION, FaultKind.SLOW_LINK} <= kinds
    assert result.ok, f"{result.failures()}\nreplay: python -m sim run swarm --seed 8707"


def test_a_send_within_a_node_is_not_judged_against_sends_between_nodes() -> None:
    """Swarm seed 3322: one engine beside cell 1, away from cell 0; cell 1 sent only inside
    a slow_link's window, so the fallback baseline was cell 0's sends between nodes, ten
    times slower per byte, and a 64x slowdown read as 13x. Routes are now keyed by whether
    the send stays within a node (the world's placement), and a send with no baseline of
    its kind is not judged."""
    result = run_scenario(swarm_scenario(3322), 3322)
    slow = [e for e in result.history if isinstance(e, FaultInjected)]
    assert FaultKind.SLOW_LINK in {e.fault for e in slow}
    assert result.ok, f"{result.failures()}\nreplay: python -m sim run swarm --seed 3322"
