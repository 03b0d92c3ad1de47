"""--staleness-policy: miles' drop at the buffer against AReaL's gate at submission, in the
simulator (the same files run for real in tests/test_cpu_backend.py's conformance set).

The gate's arithmetic (miles_core.staleness_gate), the flag's checks, the pair of scenario
files run on the same seed (drop_at_buffer drops, gate_submission drops nothing and is
held), the waste each reports, and the oracle that catches a gate off by one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    GateArmed,
    GateHeld,
    GateReleased,
    GroupDropped,
    GroupRecycled,
    GroupTrained,
    History,
    StepMetrics,
)
from miles_core.loop import LoopConfig
from miles_core.loop.flags import with_flags
from miles_core.oracles.staleness import bounded_staleness
from miles_core.report.waste import (
    GATE_HELD_GROUPS,
    GATE_HELD_SECONDS,
    STALE_ENGINE_SECONDS,
    STALE_GROUPS,
    STALE_SAMPLES,
    staleness_waste,
)
from miles_core.scenario import load_scenario_file
from miles_core.staleness_gate import (
    DEFAULT_STALENESS_POLICY,
    StalenessPolicy,
    SubmissionGate,
    gate_limit,
)
from sim.run import SimResult, run_scenario
from sim.search.plants import planted

FILES = Path(__file__).resolve().parents[1] / "scenarios" / "files"
DROP, GATE = FILES / "staleness_drop_at_buffer.toml", FILES / "staleness_gate_submission.toml"


def _run(path: Path, seed: int = 0) -> SimResult:
    return run_scenario(load_scenario_file(path), seed)


def _stale(history: History) -> list[GroupDropped | GroupRecycled]:
    return [
        e for e in history if isinstance(e, GroupDropped | GroupRecycled) and e.reason == "stale"
    ]


# -- the gate's arithmetic --------------------------------------------------------------


def test_the_limit_is_areals_formula() -> None:
    assert gate_limit(max_staleness=1, version=0, batch_size=4) == 8
    assert gate_limit(max_staleness=0, version=3, batch_size=2) == 8
    gate = SubmissionGate(max_staleness=0, batch_size=2)
    admitted = []
    for group in range(3):
        if gate.admits():
            gate.submitted(group)
            admitted.append(group)
    assert admitted == [0, 1]  # (0 + 0 + 1) x 2: one batch at the bound 0
    gate.accepted_group(0)
    assert not gate.admits()  # accepting moves a group, it frees nothing
    gate.rejected(1)  # an aborted group: its room is free again
    assert gate.admits() and (gate.accepted, gate.running) == (1, 0)
    gate.submitted(2)
    gate.accepted_group(2)
    gate.consumer_at(1)  # the next step's batch: one batch more may go out
    assert gate.limit() == 4 and gate.admits()


def test_a_group_still_running_holds_the_limit_at_its_version() -> None:
    """Bound 1, batches of 1: groups 0 and 1 go out at version 0; 0 is trained, the consumer
    takes up version 1. Counted from the current version (AReaL's), a third group would go
    out, could finish first and take batch 1, pushing group 1 to batch 2: staleness 2. The
    gate counts from the oldest running group's version and holds it until group 1 is back."""
    gate = SubmissionGate(max_staleness=1, batch_size=1)
    gate.submitted(0)
    gate.submitted(1)
    assert not gate.admits()
    gate.accepted_group(0)
    gate.consumer_at(1)
    assert gate_limit(1, gate.version, 1) > gate.accepted + gate.running  # AReaL would admit
    assert gate.gate_version == 0 and not gate.admits()
    gate.accepted_group(1)
    assert gate.gate_version == 1 and gate.admits()


def test_a_group_refused_after_acceptance_gives_back_its_batch_slot() -> None:
    gate = SubmissionGate(max_staleness=0, batch_size=1)
    gate.submitted(0)
    gate.accepted_group(0)
    assert not gate.admits()
    gate.refused_after_acceptance()
    assert gate.admits()


# -- the flag ---------------------------------------------------------------------------


def test_the_default_is_miles_and_runs_unchanged() -> None:
    assert LoopConfig(steps=1).staleness_policy is DEFAULT_STALENESS_POLICY
    assert DEFAULT_STALENESS_POLICY is StalenessPolicy.DROP_AT_BUFFER
    history = _run(DROP).history
    assert not any(isinstance(e, GateArmed | GateHeld | GateReleased) for e in history)
    metrics = [dict(e.metrics) for e in history if isinstance(e, StepMetrics)]
    assert metrics and not any(GATE_HELD_SECONDS in m for m in metrics)


def test_the_gate_needs_a_bound_and_says_both_flags() -> None:
    loop = LoopConfig(steps=1)
    with pytest.raises(ConfigError) as caught:
        with_flags(loop, {"staleness_policy": StalenessPolicy.GATE_SUBMISSION})
    assert caught.value.field == "--staleness-policy"
    assert "--max-weight-staleness is unset" in str(caught.value)
    bounded = with_flags(loop, {"staleness_policy": "gate_submission", "max_weight_staleness": 0})
    assert bounded.staleness_policy is StalenessPolicy.GATE_SUBMISSION


@pytest.mark.parametrize("mode", ["one_step_off", "sync"])
def test_the_gate_is_refused_where_no_producer_runs_ahead(mode: str) -> None:
    with pytest.raises(ConfigError, match="gates the fully_async producer"):
        LoopConfig(steps=1, max_weight_staleness=1, mode=mode, staleness_policy="gate_submission")


def test_an_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"drop_at_buffer.*gate_submission"):
        LoopConfig(steps=1, staleness_policy="gate")


# -- the pair of files, same seed -------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_drop_at_buffer_drops_and_the_gate_holds_instead(seed: int) -> None:
    dropped, gated = _run(DROP, seed), _run(GATE, seed)
    assert dropped.ok and gated.ok, (dropped.failures(), gated.failures())
    waste, held = staleness_waste(dropped.history), staleness_waste(gated.history)
    assert waste["policy"] == "drop_at_buffer" and held["policy"] == "gate_submission"
    assert len(_stale(dropped.history)) == waste[STALE_GROUPS] > 0
    assert waste[STALE_SAMPLES] > 0 and waste[STALE_ENGINE_SECONDS] > 0
    assert waste[GATE_HELD_SECONDS] == 0 and waste[GATE_HELD_GROUPS] == 0
    assert _stale(gated.history) == [] and held[STALE_GROUPS] == 0
    assert held[GATE_HELD_SECONDS] > 0 and held[GATE_HELD_GROUPS] > 0
    for result in (dropped, gated):  # the same training either way
        trained = sum(isinstance(e, GroupTrained) for e in result.history)
        assert trained == result.scenario.loop.steps * result.scenario.loop.rollout_batch_size


def test_the_gate_never_lets_more_out_than_its_limit() -> None:
    """Every hold was recorded at the limit: accepted + running had reached it."""
    history = _run(GATE).history
    holds = [e for e in history if isinstance(e, GateHeld)]
    assert holds and all(e.accepted + e.running >= e.limit for e in holds)
    assert all(e.limit == (1 + e.version + 1) * 4 for e in holds)


def test_the_steps_metrics_carry_the_time_held() -> None:
    """Each step's window: its holds' seconds, under miles' prefix; they add up to the
    summary's total less the hold still open after the last step's metrics."""
    history = _run(GATE).history
    rows = [dict(e.metrics) for e in history if isinstance(e, StepMetrics)]
    assert len(rows) == 8 and all(GATE_HELD_SECONDS in r and GATE_HELD_GROUPS in r for r in rows)
    per_step = sum(r[GATE_HELD_SECONDS] for r in rows)
    total = staleness_waste(history)[GATE_HELD_SECONDS]
    last = max(e.t for e in history if isinstance(e, StepMetrics))
    assert 0 < per_step <= total <= per_step + (history[len(history) - 1].t - last) + 1e-6
    assert sum(r[GATE_HELD_GROUPS] for r in rows) <= staleness_waste(history)[GATE_HELD_GROUPS]


# -- the oracle -------------------------------------------------------------------------


def test_a_gate_off_by_one_fails_bounded_staleness() -> None:
    with planted("gate_off_by_one"):
        result = _run(GATE)
    violation = result.verdicts["bounded_staleness"]
    assert violation is not None and "gate_submission" in violation.message
    assert _stale(result.history)  # the group one too many reached the buffer too old


def test_a_stale_drop_fails_only_under_the_gate() -> None:
    dropped = GroupDropped(t=2.0, group_id=7, prompt_id=7, reason="stale")
    assert bounded_staleness(History([dropped])) is None  # miles' policy: a drop is its way
    armed = GateArmed(t=0.0, max_staleness=1, batch_size=4)
    violation = bounded_staleness(History([armed, dropped]))
    assert violation is not None and "group 7 was dropped as stale" in violation.message
    recycled = dataclasses.replace(dropped, reason="aborted")
    assert bounded_staleness(History([armed, GroupRecycled(**recycled.__dict__)])) is None


def test_the_swarm_draws_the_gate_on_a_stream_of_its_own_and_its_seeds_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Some fully-async seeds with a bound run the gate; with the draw off each seed is the
    same scenario but for the policy; and gated seeds pass every oracle."""
    from sim.search import swarm_staleness
    from sim.search.swarm import swarm_scenario

    seeds = range(120)
    drawn = {s: swarm_scenario(s) for s in seeds}
    monkeypatch.setattr(swarm_staleness, "GATE_SHARE", 0.0)
    plain = {s: swarm_scenario(s) for s in seeds}
    gated = [s for s in seeds if drawn[s].loop.staleness_policy is StalenessPolicy.GATE_SUBMISSION]
    assert len(gated) >= 5, gated
    for s in seeds:
        loop = drawn[s].loop
        if s in gated:
            assert loop.mode == "fully_async" and loop.max_weight_staleness is not None
        policy = plain[s].loop.staleness_policy
        assert (
            dataclasses.replace(drawn[s], loop=dataclasses.replace(loop, staleness_policy=policy))
            == plain[s]
        )
    for s in gated[:4]:
        result = run_scenario(drawn[s], seed=s)
        assert result.ok, (s, [str(v) for v in result.verdicts.values() if v])
