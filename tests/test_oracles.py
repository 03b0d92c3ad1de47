"""Each oracle catches a hand-built bad history, and passes the good ones next to it."""

from __future__ import annotations

from typing import Any

import pytest

from miles_core.events import (
    BucketSent,
    CellStateChanged,
    EnginesPaused,
    EnginesResumed,
    EngineStamped,
    EngineStateChanged,
    Event,
    FaultInjected,
    FaultKind,
    FaultScheduled,
    GroupDropped,
    GroupGot,
    GroupTrained,
    HealBegan,
    HealEnded,
    History,
    PromptDrawn,
    QuorumChanged,
    RunEnded,
    RunStarted,
    RunStatus,
    SampleGenerated,
    StepCommitted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.oracles import (
    bounded_staleness,
    check_all,
    exactly_once,
    failover_witness,
    monotonic_versions,
    progress,
    published_weights,
)


def E(cls: type[Event], **fields: Any) -> tuple[type[Event], dict[str, Any]]:
    return cls, fields


def hist(*specs: tuple[type[Event], dict[str, Any]], dt: float = 1.0) -> History:
    """A history whose events happen dt seconds apart, in the order given."""
    return History(cls(t=i * dt, **fields) for i, (cls, fields) in enumerate(specs))


def start(bound: int | None = None, engines: tuple[str, ...] = ("e0",)):
    return E(
        RunStarted, seed=0, scenario="t", engines=engines, num_cells=2, max_weight_staleness=bound
    )


def update(uid: int, version: int, engines=("e0",), n: int = 2, updater: int = 0, publishes=True):
    """A complete, correct weight update."""
    return [
        E(
            UpdateBegan,
            update_id=uid,
            version=version,
            updater=updater,
            kind="full",
            n_buckets=n,
            engines=engines,
            publishes=publishes,
        ),
        E(EnginesPaused, update_id=uid, engines=engines),
        *[
            E(BucketSent, update_id=uid, bucket=k, n_buckets=n, engines=engines, nbytes=8)
            for k in range(n)
        ],
        *[E(EngineStamped, update_id=uid, engine=e, version=version) for e in engines],
        *(
            [E(VersionPublished, update_id=uid, version=version, updater=updater)]
            if publishes
            else []
        ),
        E(EnginesResumed, update_id=uid, engines=engines),
    ]


def sample(group: int, prompt: int, version: int | None, engine: str = "e0"):
    return E(
        SampleGenerated,
        group_id=group,
        prompt_id=prompt,
        sample=0,
        turn=0,
        engine=engine,
        version=version,
    )


def trained(group: int, prompt: int, current: int | None, age: int | None, step: int = 0):
    return [
        E(GroupGot, group_id=group, prompt_id=prompt, current_version=current, staleness=age),
        E(GroupTrained, group_id=group, prompt_id=prompt, step=step),
    ]


# -- 1. monotonic versions ---------------------------------------------------------


def test_monotonic_passes_an_increasing_sequence() -> None:
    assert monotonic_versions(hist(start(), *update(0, 1), *update(1, 2))) is None


def test_monotonic_catches_the_failover_counter_reset() -> None:
    h = hist(start(), *update(0, 57, updater=0), *update(1, 1, updater=1))
    violation = monotonic_versions(h)
    assert violation is not None
    assert "stamped 1 after 57" in violation.message
    assert [e.version for _, e in violation.evidence] == [57, 1]


def test_monotonic_catches_a_published_regression_without_stamps() -> None:
    h = hist(
        E(VersionPublished, update_id=0, version=3, updater=0),
        E(VersionPublished, update_id=1, version=3, updater=1),
    )
    violation = monotonic_versions(h)
    assert violation is not None and "published version went from 3 to 3" in violation.message


def test_monotonic_catches_samples_going_back_on_one_engine() -> None:
    h = hist(sample(0, 0, 2), sample(1, 1, None, engine="e1"), sample(2, 2, 1))
    violation = monotonic_versions(h)
    assert violation is not None
    assert "engine e0 generated under version 1 after 2" in violation.message


def test_monotonic_catches_the_consumer_going_back() -> None:
    h = hist(
        E(GroupGot, group_id=0, prompt_id=0, current_version=5, staleness=0),
        E(GroupGot, group_id=1, prompt_id=1, current_version=4, staleness=0),
    )
    violation = monotonic_versions(h)
    assert violation is not None and "consumer's version went from 5 to 4" in violation.message


# -- 2. bounded staleness ----------------------------------------------------------


def test_staleness_within_bound_passes_and_none_is_off() -> None:
    h = hist(
        start(bound=1),
        sample(0, 0, None),
        *trained(0, 0, None, None),
        *update(0, 1),
        sample(1, 1, 1),
        *trained(1, 1, 1, 0),
    )
    assert bounded_staleness(h) is None


def test_staleness_beyond_the_bound_is_caught() -> None:
    h = hist(
        start(bound=2),
        *update(0, 1),
        sample(0, 0, 1),
        *update(1, 2),
        *update(2, 3),
        *update(3, 4),
        *trained(0, 0, 4, 3),
    )
    violation = bounded_staleness(h)
    assert violation is not None
    assert "staleness 3 > bound 2" in violation.message
    assert isinstance(violation.evidence[0][1], SampleGenerated)


def test_negative_staleness_is_caught() -> None:
    h = hist(start(), sample(0, 0, 3), *trained(0, 0, 2, None))
    violation = bounded_staleness(h)
    assert violation is not None and "negative staleness -1" in violation.message


def test_under_reported_staleness_is_caught() -> None:
    h = hist(start(bound=5), sample(0, 0, 1), *trained(0, 0, 3, 0))
    violation = bounded_staleness(h)
    assert violation is not None
    assert "reported staleness 0 but its samples give 3 - 1 = 2" in violation.message


def test_initial_weights_count_as_version_zero_once_a_version_exists() -> None:
    h = hist(start(bound=1), sample(0, 0, None), *trained(0, 0, 2, 2))
    violation = bounded_staleness(h)
    assert violation is not None and "staleness 2 > bound 1" in violation.message


# -- 3. exactly once ---------------------------------------------------------------


def _end(*outstanding: int):
    return E(RunEnded, status=RunStatus.COMPLETED, reason="done", outstanding_prompts=outstanding)


def test_exactly_once_passes_trained_dropped_and_outstanding() -> None:
    h = hist(
        E(PromptDrawn, prompt_id=0),
        E(PromptDrawn, prompt_id=1),
        E(PromptDrawn, prompt_id=2),
        *trained(0, 0, None, None),
        E(GroupDropped, group_id=1, prompt_id=1, reason="dynamic_filter"),
        _end(2),
    )
    assert exactly_once(h) is None


def test_a_prompt_trained_in_two_steps_is_caught() -> None:
    h = hist(
        E(PromptDrawn, prompt_id=0),
        *trained(0, 0, None, None, step=0),
        *trained(5, 0, None, None, step=1),
    )
    violation = exactly_once(h)
    assert violation is not None and "prompt 0 trained twice (steps 0 and 1)" in violation.message


def test_a_lost_prompt_is_caught_at_the_end() -> None:
    h = hist(
        E(PromptDrawn, prompt_id=0), E(PromptDrawn, prompt_id=1), *trained(0, 0, None, None), _end()
    )
    violation = exactly_once(h)
    assert violation is not None and "prompt 1 was lost" in violation.message


def test_trained_and_outstanding_is_caught() -> None:
    h = hist(E(PromptDrawn, prompt_id=0), *trained(0, 0, None, None), _end(0))
    violation = exactly_once(h)
    assert violation is not None and "prompt 0 is trained and outstanding" in violation.message


def test_trained_after_dropped_and_drop_without_reason_are_caught() -> None:
    dropped_then_trained = hist(
        E(PromptDrawn, prompt_id=0),
        E(GroupDropped, group_id=0, prompt_id=0, reason="stale"),
        *trained(1, 0, None, None),
    )
    violation = exactly_once(dropped_then_trained)
    assert violation is not None and "trained after it was dropped" in violation.message
    no_reason = hist(
        E(PromptDrawn, prompt_id=0), E(GroupDropped, group_id=0, prompt_id=0, reason="")
    )
    violation = exactly_once(no_reason)
    assert violation is not None and "without a reason" in violation.message


# -- 4. published weights ----------------------------------------------------------


def test_published_weights_passes_a_clean_update() -> None:
    h = hist(start(), sample(0, 0, None), *update(0, 1), sample(1, 1, 1))
    assert published_weights(h) is None


def test_sample_from_unpublished_weights_is_caught() -> None:
    h = hist(start(), *update(0, 1), sample(0, 0, 2))
    violation = published_weights(h)
    assert violation is not None and "version 2, which was never published" in violation.message


def test_engine_resumed_with_half_an_update_is_caught() -> None:
    h = hist(
        start(),
        E(
            UpdateBegan,
            update_id=0,
            version=1,
            updater=0,
            kind="full",
            n_buckets=3,
            engines=("e0",),
        ),
        E(EnginesPaused, update_id=0, engines=("e0",)),
        E(BucketSent, update_id=0, bucket=0, n_buckets=3, engines=("e0",), nbytes=8),
        E(EnginesResumed, update_id=0, engines=("e0",)),
    )
    violation = published_weights(h)
    assert violation is not None
    assert "engine e0 resumed holding part of update 0" in violation.message


def test_stamp_before_every_bucket_arrived_is_caught() -> None:
    h = hist(
        E(
            UpdateBegan,
            update_id=0,
            version=1,
            updater=0,
            kind="lora",
            n_buckets=2,
            engines=("e0",),
        ),
        E(BucketSent, update_id=0, bucket=0, n_buckets=2, engines=("e0",), nbytes=8),
        E(EngineStamped, update_id=0, engine="e0", version=1),
    )
    violation = published_weights(h)
    assert violation is not None and "after receiving 1 of 2 buckets" in violation.message


def test_engine_left_out_of_an_update_serving_old_weights_is_caught() -> None:
    h = hist(start(engines=("e0", "e1")), *update(0, 1, engines=("e0",)), sample(0, 0, None, "e1"))
    violation = published_weights(h)
    assert violation is not None
    assert "engine e1 served version None after the update to 1 completed" in violation.message


def test_engine_weights_differing_from_the_trainer_are_caught() -> None:
    from miles_core.events import WeightsChecked

    same = E(WeightsChecked, engine="e0", version=1, checksum="ab12", trainer_checksum="ab12")
    assert published_weights(hist(start(), *update(0, 1), same)) is None
    differ = E(WeightsChecked, engine="e0", version=1, checksum="ffff", trainer_checksum="ab12")
    violation = published_weights(hist(start(), *update(0, 1), differ))
    assert violation is not None and "checksum ffff != ab12" in violation.message


def test_restarted_engine_must_be_synced_before_serving() -> None:
    base = [
        start(),
        *update(0, 1),
        E(EngineStateChanged, engine="e0", up=False, reason="kill"),
        E(EngineStateChanged, engine="e0", up=True, reason="restart"),
    ]
    violation = published_weights(hist(*base, sample(0, 0, None)))
    assert violation is not None and "after a restart before it received" in violation.message
    synced = hist(*base, *update(1, 1, publishes=False), sample(0, 0, 1))
    assert published_weights(synced) is None


# -- 5. progress ---------------------------------------------------------------------


def test_progress_needs_a_commit_after_the_last_fault() -> None:
    fault = E(FaultInjected, fault=FaultKind.SLOW_LINK, detail="x")
    h = hist(start(), fault, *[E(PromptDrawn, prompt_id=i) for i in range(10)])
    violation = progress(h, window=5.0)
    assert violation is not None
    assert (
        "no step committed for 10s (> window 5s) after the last fault at t=1" in violation.message
    )
    commits = [E(StepCommitted, step=i, attempt=1, n_groups=1) for i in range(3)]
    busy = [x for i in range(3) for x in (E(PromptDrawn, prompt_id=i), commits[i])]
    assert progress(hist(start(), fault, *busy, _end()), window=5.0) is None


def test_progress_is_not_judged_on_spans_the_run_did_not_last() -> None:
    h = hist(start(), E(FaultInjected, fault=FaultKind.KILL_ENGINE, engine="e0"), _end())
    assert progress(h, window=5.0) is None


def test_a_stalled_run_fails_progress_and_a_clear_error_does_not() -> None:
    stalled = hist(
        start(), E(RunEnded, status=RunStatus.STALLED, reason="deadlock", outstanding_prompts=())
    )
    violation = progress(stalled, window=100.0)
    assert violation is not None and "stalled: deadlock" in violation.message
    failed = hist(
        start(),
        *[E(PromptDrawn, prompt_id=i) for i in range(10)],
        E(RunEnded, status=RunStatus.FAILED, reason="no cell alive", outstanding_prompts=()),
    )
    assert progress(failed, window=2.0) is None


def test_live_engines_must_reach_the_newest_version() -> None:
    commits = [E(StepCommitted, step=i, attempt=1, n_groups=1) for i in range(10)]
    lagging = hist(start(engines=("e0", "e1")), *update(0, 1, engines=("e0",)), *commits)
    violation = progress(lagging, window=9.0)
    assert violation is not None and "live engine e1 did not reach version 1" in violation.message
    dead = hist(
        start(engines=("e0", "e1")),
        E(EngineStateChanged, engine="e1", up=False, reason="x"),
        *update(0, 1, engines=("e0",)),
        *commits,
    )
    assert progress(dead, window=9.0) is None


def test_a_hang_late_in_the_quiet_phase_is_caught() -> None:
    commits = [E(StepCommitted, step=i, attempt=1, n_groups=1) for i in range(3)]
    idle = [E(PromptDrawn, prompt_id=i) for i in range(6)]
    h = hist(start(), E(FaultInjected, fault=FaultKind.SLOW_CELL, cell=0), *commits, *idle)
    violation = progress(h, window=4.0)
    assert violation is not None
    assert "no step committed for 6s (> window 4s) after step 2 committed" in violation.message


# -- 6. failover witnesses -------------------------------------------------------------


KILL = E(FaultInjected, fault=FaultKind.KILL_CELL, cell=1)
FAILED_1 = E(CellStateChanged, cell=1, old="alive", new="errored", reason="crash")


@pytest.mark.parametrize(
    "consequence",
    [
        E(QuorumChanged, quorum_id=1, members=(0,)),
        E(HealEnded, dst_cell=1, ok=True),
        E(RunEnded, status=RunStatus.FAILED, reason="no cell", outstanding_prompts=()),
    ],
)
def test_a_kill_noticed_and_acted_on_is_witnessed(consequence) -> None:
    assert failover_witness(hist(KILL, FAILED_1, consequence)) is None


def test_a_kill_with_no_effect_is_caught() -> None:
    unnoticed = failover_witness(hist(KILL, E(QuorumChanged, quorum_id=1, members=(0,))))
    assert unnoticed is not None and "cell 1 was never marked failed" in unnoticed.message
    ignored = failover_witness(hist(KILL, FAILED_1, E(QuorumChanged, quorum_id=1, members=(0, 1))))
    assert ignored is not None
    assert "no later quorum excluded it and it was not healed" in ignored.message


def test_a_scheduled_fault_that_never_fired_is_caught_in_a_completed_run() -> None:
    scheduled = E(
        FaultScheduled, fault=FaultKind.KILL_CELL, cell=1, detail="before_allreduce step=9"
    )
    completed = hist(scheduled, _end())
    violation = failover_witness(completed)
    assert violation is not None and "never fired" in violation.message
    failed = E(RunEnded, status=RunStatus.FAILED, reason="x", outstanding_prompts=())
    assert failover_witness(hist(scheduled, failed)) is None  # the run stopped before it


def test_a_start_needs_a_heal_and_a_quorum_with_the_cell() -> None:
    fault = E(FaultInjected, fault=FaultKind.START_CELL, cell=1)
    grow = E(QuorumChanged, quorum_id=2, members=(0, 1))
    heal = [
        E(HealBegan, quorum_id=2, src_cell=0, dst_cell=1, src_ranks=(0,), dst_ranks=(1,)),
        E(HealEnded, dst_cell=1, ok=True),
    ]
    assert failover_witness(hist(fault, grow, *heal)) is None
    violation = failover_witness(hist(fault, grow))
    assert violation is not None and "cell 1 was not healed" in violation.message
    failed_heal = [heal[0], E(HealEnded, dst_cell=1, ok=False)]
    assert failover_witness(hist(fault, grow, *failed_heal)) is not None


def test_engine_faults_need_their_witnesses() -> None:
    kill = E(FaultInjected, fault=FaultKind.KILL_ENGINE, engine="e0")
    assert failover_witness(hist(kill)) is not None
    assert (
        failover_witness(hist(kill, E(EngineStateChanged, engine="e0", up=False, reason="k")))
        is None
    )
    restart = E(FaultInjected, fault=FaultKind.RESTART_ENGINE, engine="e0")
    up = E(EngineStateChanged, engine="e0", up=True, reason="restart")
    violation = failover_witness(hist(*update(0, 1), restart, up))
    assert violation is not None and "never synced" in violation.message
    assert (
        failover_witness(hist(*update(0, 1), restart, up, *update(1, 1, publishes=False))) is None
    )


def test_check_all_names_every_oracle() -> None:
    verdicts = check_all(hist(start(), *update(0, 1)), progress_window=10.0)
    assert list(verdicts) == [
        "monotonic_versions",
        "bounded_staleness",
        "exactly_once",
        "published_weights",
        "progress",
        "failover_witness",
    ]
    assert all(v is None for v in verdicts.values())


def test_violation_text_cites_the_evidence() -> None:
    h = hist(
        E(VersionPublished, update_id=0, version=2, updater=0),
        E(VersionPublished, update_id=1, version=1, updater=1),
    )
    text = str(monotonic_versions(h))
    assert text.splitlines()[0].startswith("[monotonic_versions]")
    assert "#0 t=0.0" in text and "#1 t=1.0" in text


@pytest.mark.parametrize("window", [0.0, -1.0])
def test_progress_window_must_be_positive(window) -> None:
    with pytest.raises(ValueError, match="window must be > 0"):
        progress(hist(start()), window)
