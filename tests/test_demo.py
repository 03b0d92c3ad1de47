"""The core demonstration: the state machines together, judged by the oracles."""

from __future__ import annotations

import json

import pytest

from miles_core.events import (
    FaultInjected,
    FaultKind,
    GroupRecycled,
    HealBegan,
    QuorumChanged,
    RunStatus,
    UpdateAborted,
    VersionPublished,
)
from sim.__main__ import main
from sim.demo import DemoConfig, run_demo


def test_same_seed_same_history_hash_and_seeds_differ() -> None:
    first, again = run_demo(DemoConfig(seed=3)), run_demo(DemoConfig(seed=3))
    assert first.history.hash() == again.history.hash()
    assert first.history.to_dicts() == again.history.to_dicts()
    assert run_demo(DemoConfig(seed=4)).history.hash() != first.history.hash()


@pytest.mark.parametrize("seed", range(12))
def test_every_oracle_passes_and_failover_continues_the_version(seed: int) -> None:
    result = run_demo(DemoConfig(seed=seed, steps=8))
    assert result.status is RunStatus.COMPLETED
    assert {name: str(v) for name, v in result.verdicts.items() if v} == {}
    # the update aborted by the crash did not consume a number: one version per step
    assert result.versions == list(range(1, 9))


def test_the_crash_mid_update_really_failed_over_and_healed() -> None:
    events = list(run_demo(DemoConfig(seed=0, crash_step=3, heal_step=5)).history)
    kill = next(i for i, e in enumerate(events) if isinstance(e, FaultInjected))
    assert events[kill].fault is FaultKind.KILL_CELL and events[kill].cell == 0
    aborted = next(e for e in events[kill:] if isinstance(e, UpdateAborted))
    resumed = next(e for e in events[kill:] if isinstance(e, VersionPublished))
    assert resumed.version == aborted.version and resumed.updater == 1
    assert any(isinstance(e, QuorumChanged) and e.members == (1,) for e in events[kill:])
    heal = next(e for e in events[kill:] if isinstance(e, HealBegan))
    assert (heal.src_cell, heal.dst_cell) == (1, 0)
    healed = events.index(heal)
    assert any(isinstance(e, QuorumChanged) and e.members == (0, 1) for e in events[healed - 2 :])


def test_rollout_ahead_of_training_recycles_stale_groups() -> None:
    recycled = [
        e
        for seed in range(4)
        for e in run_demo(DemoConfig(seed=seed)).history
        if isinstance(e, GroupRecycled)
    ]
    assert recycled and {e.reason for e in recycled} == {"stale"}


def test_a_private_counter_is_refused_and_caught_by_the_oracle() -> None:
    result = run_demo(DemoConfig(seed=0, private_counter=True))
    assert result.status is RunStatus.FAILED
    assert "VersionRegressionError" in result.reason
    violation = result.verdicts["monotonic_versions"]
    assert violation is not None and "after 3" in violation.message
    assert result.versions[-2:] == [3, 1]


def test_cli_json_summary(capsys) -> None:
    assert main(["demo", "--seed", "2", "--steps", "6", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and summary["final_version"] == 6
    assert set(summary["oracles"].values()) == {"pass"}
    assert [f.split(" ", 1)[1] for f in summary["faults_fired"]] == [
        "kill_cell cell 0 (after bucket 1)",
        "start_cell cell 0 (operator restart)",
    ]
    assert summary["history_hash"] == run_demo(DemoConfig(seed=2, steps=6)).history.hash()


def test_cli_prints_a_replay_line_on_violation(capsys) -> None:
    assert main(["demo", "--seed", "1", "--private-counter"]) == 1
    captured = capsys.readouterr()
    assert "FAIL" in captured.out
    assert captured.err.strip() == "replay: python -m sim demo --seed 1 --steps 8 --private-counter"


def test_cli_rejects_zero_steps(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--steps", "0"])
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err
