"""Each named scenario: what it is about, plus all six oracles.

A failure message ends with the command that replays the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from miles_core.events import (
    AttemptEnded,
    BucketReceived,
    CellStateChanged,
    EngineStamped,
    EngineStarted,
    EngineStateChanged,
    Event,
    FaultInjected,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    HealBegan,
    HealEnded,
    HeartbeatMissed,
    QuorumChanged,
    RequestRetried,
    RunStatus,
    SampleGenerated,
    StepBegan,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.scenario.faults import make_fault
from sim.run import SimResult, run_scenario
from sim.scenarios import SCENARIOS


def run(name: str, seed: int = 0) -> SimResult:
    result = run_scenario(SCENARIOS[name], seed)
    failed = "\n".join(str(v) for v in result.verdicts.values() if v)
    replay = f"python -m sim run {name} --seed {seed}"
    assert result.ok, f"{failed}\nreplay: {replay}"
    return result


def of(
    result: SimResult, kind: type[Event], where: Callable[[Event], bool] = lambda e: True
) -> list:
    return [e for e in result.history if isinstance(e, kind) and where(e)]


def index(result: SimResult, event: Event) -> int:
    return next(i for i, e in enumerate(result.history) if e is event)


@pytest.mark.parametrize("seed", range(3))
def test_no_failure(seed: int) -> None:
    result = run("no_failure", seed)
    assert result.report.status is RunStatus.COMPLETED
    assert result.report.versions == list(range(1, 9))
    assert all(e.decision == "commit" and e.attempt == 1 for e in of(result, AttemptEnded))
    stamps = of(result, EngineStamped)
    assert {(e.engine, e.version) for e in stamps} == {
        (engine, v) for engine in ("engine-0", "engine-1") for v in range(1, 9)
    }


@pytest.mark.parametrize("seed", range(3))
def test_cell_crash_before_allreduce_retries_shrinks_and_heals(seed: int) -> None:
    result = run("cell_crash_before_allreduce", seed)
    (crashed,) = of(result, AttemptEnded, lambda e: e.decision == "retry")
    assert (crashed.step, crashed.attempt) == (2, 1)
    assert crashed.errored == (1,) and crashed.discarded == (0,) and crashed.normal == ()
    shrink = of(result, QuorumChanged, lambda e: e.members == (0,))
    assert shrink and index(result, shrink[0]) > index(result, crashed)
    (retried,) = of(result, AttemptEnded, lambda e: e.step == 2 and e.attempt == 2)
    assert retried.decision == "commit" and retried.normal == (0,)
    (heal,) = of(result, HealEnded)
    assert heal.dst_cell == 1 and heal.ok
    (step5,) = of(result, StepBegan, lambda e: e.step == 5)
    assert index(result, heal) > index(result, step5)
    assert of(result, AttemptEnded, lambda e: e.step == 5)[0].normal == (0, 1)
    assert result.report.versions == list(range(1, 9))


def test_updater_dying_after_many_updates_continues_the_version() -> None:
    result = run("updater_dies_after_many_updates")
    (aborted,) = of(result, UpdateAborted)
    assert aborted.version == 13  # the update after step 12: steps 0..11 published 1..12
    takeover = of(result, VersionPublished, lambda e: e.version == aborted.version)
    assert [e.updater for e in takeover] == [1]
    assert result.report.versions == list(range(1, 17))
    later = of(result, UpdateBegan, lambda e: e.update_id > aborted.update_id)
    assert later and all(e.updater == 1 for e in later)


def test_a_private_counter_like_the_seed_report_is_caught(monkeypatch) -> None:
    """The updater counts versions itself (PR #2244's P2): the oracle must catch it."""
    import miles_core.scenario.schedule
    from miles_core.loop import Orchestrator

    class PrivateCounters:
        """Each cell's own weight_version += 1, published as is (no ledger)."""

        def __init__(self) -> None:
            self.counters: dict[str, int] = {}
            self.current: int | None = None
            self.reservation = None

        def reserve(self, updater: str) -> int:
            self.counters[updater] = self.counters.get(updater, 0) + 1
            return self.counters[updater]

        def abandon(self, version: int) -> None:
            del version

        def publish(self, version: int, updater: str) -> int:
            self.current = version
            return version

    class BuggyOrchestrator(Orchestrator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.ctx.ledger = PrivateCounters()  # type: ignore[assignment]

    monkeypatch.setattr(miles_core.scenario.schedule, "Orchestrator", BuggyOrchestrator)
    result = run_scenario(SCENARIOS["updater_dies_after_many_updates"], seed=0)
    violation = result.verdicts["monotonic_versions"]
    assert violation is not None
    assert "stamped 1 after 12" in violation.message  # cell 1's counter restarts at 1
    assert result.report.status is RunStatus.FAILED
    assert "VersionRegressionError" in result.report.reason  # the buffer refuses it too
    assert result.verdicts["end_state"] is not None  # an ending the scenario does not expect


@pytest.mark.parametrize("seed", range(3))
def test_crash_mid_weight_update_serves_no_mixed_weights(seed: int) -> None:
    result = run("crash_mid_weight_update", seed)
    (aborted,) = of(result, UpdateAborted)
    assert aborted.version == 1
    partial = of(result, BucketReceived, lambda e: e.update_id == aborted.update_id)
    assert [e.bucket for e in partial] == [0, 1, 2]
    assert aborted.cause == "cell" and aborted.component == "cell-0"
    assert len(of(result, VersionPublished, lambda e: e.version == 1)) == 1
    assert result.report.versions == list(range(1, 9))
    # the oracle that would catch a mix of two versions ran and passed (see run())
    assert result.verdicts["published_weights"] is None


@pytest.mark.parametrize("handler", ["", "_drop"])
def test_engine_crash_mid_generation_aborts_its_groups(handler: str) -> None:
    result = run(f"engine_crash_mid_generation{handler}")
    (down,) = of(result, EngineStateChanged, lambda e: e.engine == "engine-1" and not e.up)
    lost = of(result, SampleGenerated, lambda e: e.engine == "engine-1" and e.aborted)
    assert lost, "some request on engine-1 was cut short"
    groups = {e.group_id for e in lost}
    fate = GroupDropped if handler else GroupRecycled
    assert groups & {e.group_id for e in of(result, fate, lambda e: e.reason == "aborted")}
    after = of(result, SampleGenerated, lambda e: e.engine == "engine-1" and not e.aborted)
    assert all(index(result, e) < index(result, down) for e in after)


@pytest.mark.parametrize("seed", range(3))
def test_restarted_engine_serves_only_after_it_received_the_current_weights(seed: int) -> None:
    result = run("engine_restart", seed)
    (up,) = of(result, EngineStarted, lambda e: e.engine == "engine-0")  # the world's report
    start = index(result, up)
    served = [
        e
        for e in of(result, SampleGenerated, lambda e: e.engine == "engine-0" and not e.aborted)
        if index(result, e) > start
    ]
    assert served and all(e.incarnation == up.incarnation for e in served)
    stamps = of(result, EngineStamped, lambda e: e.incarnation == up.incarnation)
    before = [e for e in stamps if start < index(result, e) < index(result, served[0])]
    assert before, "the restarted engine served before any stamp"
    assert served[0].version == before[-1].version


def test_first_update_turns_the_staleness_filter_off_not_to_zero() -> None:
    result = run("first_update")
    got = of(result, GroupGot)
    assert len(got) == 4
    assert all(e.current_version is None and e.staleness is None for e in got)
    assert not of(result, GroupRecycled, lambda e: e.reason == "stale")
    assert result.report.versions == [1]


@pytest.mark.parametrize("handler", ["retry", "drop"])
def test_staleness_bound_under_fast_rollout_and_slow_training(handler: str) -> None:
    result = run(f"staleness_{handler}")
    fate = GroupRecycled if handler == "retry" else GroupDropped
    assert of(result, fate, lambda e: e.reason == "stale"), (
        "rollout ran ahead: some group went stale"
    )
    assert all(e.staleness is not None and 0 <= e.staleness <= 1 for e in of(result, GroupGot)[4:])


def test_buffer_backpressure_blocks_puts_until_a_get() -> None:
    result = run("buffer_backpressure")
    blocked = of(result, GroupPut, lambda e: e.fate == "blocked")
    assert blocked
    queued_later = {e.group_id for e in of(result, GroupPut, lambda e: e.fate == "queued")}
    outstanding = set(result.history[len(result.history) - 1].outstanding_prompts)
    for put in blocked:
        assert put.group_id in queued_later or put.prompt_id in outstanding


def test_all_cells_dead_is_a_clear_error_not_a_hang() -> None:
    result = run("all_cells_dead")
    assert result.report.status is RunStatus.FAILED  # as the scenario expects: a pass
    assert result.report.reason.startswith("NoAliveCellError: no trainer cell is alive")
    assert result.report.steps_done == 1
    assert len(of(result, FaultInjected)) == 2
    assert result.history[len(result.history) - 1].error == "NoAliveCellError"


def test_p2p_sends_each_bucket_once_per_engine_to_all_at_once() -> None:
    def update_seconds(name: str) -> float:
        result = run(name)
        begun = of(result, UpdateBegan)[0]
        done = of(result, VersionPublished)[0]
        return done.t - begun.t

    # each engine on its own link, all at once: as long as the broadcast (sent in turn,
    # two engines took twice as long)
    ratio = update_seconds("p2p_transfer") / update_seconds("no_failure")
    assert 0.9 < ratio < 1.1
    received = of(run("p2p_transfer"), BucketReceived)
    by_bucket: dict[tuple[int, int], list[BucketReceived]] = {}
    for e in received:
        by_bucket.setdefault((e.update_id, e.bucket), []).append(e)
    for got in by_bucket.values():
        engines = [engine for e in got for engine in e.engines]
        assert sorted(engines) == ["engine-0", "engine-1"]  # one delivery per engine, once
        assert len({e.t for e in got}) == 1  # arrived together


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_same_seed_same_history_hash(name: str) -> None:
    first, again = run_scenario(SCENARIOS[name], 7), run_scenario(SCENARIOS[name], 7)
    assert first.hash == again.hash


def test_seeds_give_different_runs() -> None:
    hashes = {
        run_scenario(SCENARIOS["cell_crash_before_allreduce"], seed).hash for seed in range(5)
    }
    assert len(hashes) == 5


@pytest.mark.parametrize("seed", range(3))
def test_a_cell_killed_while_idle_is_noticed_and_healed(seed: int) -> None:
    result = run("cell_killed_between_steps", seed)
    (kill,) = of(result, FaultInjected, lambda e: e.fault == "kill_cell")
    failed = of(result, CellStateChanged, lambda e: e.cell == 1 and e.new == "errored")
    assert failed and failed[0].t >= kill.t
    assert of(result, QuorumChanged, lambda e: e.members == (0,))
    assert of(result, HealEnded, lambda e: e.dst_cell == 1 and e.ok)


def test_the_healing_source_dying_mid_checkpoint_fails_over_to_another_source() -> None:
    result = run("kill_during_heal")
    heals = of(result, HealEnded, lambda e: e.dst_cell == 2)
    assert [h.ok for h in heals] == [False, True]
    began = of(result, HealBegan, lambda e: e.dst_cell == 2)
    assert [b.src_cell for b in began] == [0, 1]  # the next alive cell takes over as source
    assert began[1].quorum_id == began[0].quorum_id + 1
    assert of(result, HealEnded, lambda e: e.dst_cell == 0 and e.ok)
    assert result.report.versions == list(range(1, 9))


def test_an_engine_killed_mid_update_is_dropped_and_the_update_retried() -> None:
    result = run("engine_killed_mid_update")
    (down,) = of(result, EngineStateChanged, lambda e: e.engine == "engine-1" and not e.up)
    (aborted,) = of(result, UpdateAborted)
    assert (aborted.cause, aborted.component) == ("engine", "engine-1")
    partial = of(result, BucketReceived, lambda e: e.update_id == aborted.update_id)
    assert [b.bucket for b in partial] == [0, 1]
    retry = of(result, VersionPublished, lambda e: e.version == aborted.version)
    assert len(retry) == 1
    later = [e for e in of(result, UpdateBegan) if index(result, e) > index(result, down)]
    assert later and all(e.engines == ("engine-0",) for e in later)
    assert result.report.versions == list(range(1, 9))


def test_a_heartbeat_false_positive_stops_the_cell_and_heals_it_back() -> None:
    result = run("heartbeat_false_positive")
    (suspected,) = of(
        result, CellStateChanged, lambda e: e.reason == "missed 3 heartbeats" and e.new == "errored"
    )
    (mute,) = of(result, FaultInjected, lambda e: e.fault == "drop_heartbeat")
    assert suspected.cell == 1
    assert suspected.t - mute.t >= 3 * 1.0  # three timeouts of 1 s at least: the detection delay
    assert of(result, QuorumChanged, lambda e: e.members == (0,))
    assert of(result, HealEnded, lambda e: e.dst_cell == 1 and e.ok)


def test_every_cell_is_pinged_at_once_so_two_muted_cells_miss_together() -> None:
    """miles runs one heartbeat checker per cell: a muted cell's timeout does not delay the
    next cell's ping (a checker that pinged in turn would send cell 2's a timeout later)."""
    base = SCENARIOS["heartbeat_false_positive"]
    mute = [make_fault("drop_heartbeat", cell=c, at=9.0, duration=12.0) for c in (1, 2)]
    scenario = dataclasses.replace(
        base,
        world=dataclasses.replace(base.world, num_cells=4),
        faults=(*mute, make_fault("start_cell", cell=1, point="step_begin", step=5)),
    )
    result = run_scenario(scenario, 0)
    missed: dict[int, list[float]] = {1: [], 2: []}
    for e in of(result, HeartbeatMissed):
        missed[e.cell].append(e.sent)
    assert missed[1] and missed[1] == missed[2]
    suspected = of(result, CellStateChanged, lambda e: e.reason == "missed 3 heartbeats")
    assert {e.cell for e in suspected} == {1, 2} and len({e.t for e in suspected}) == 1


def _step_seconds(result: SimResult) -> list[float]:
    began = {e.step: e.t for e in of(result, StepBegan)}
    return [e.t - began[e.step] for e in of(result, AttemptEnded, lambda e: e.decision == "commit")]


def test_a_slow_cell_slows_steps_without_failing_anything() -> None:
    slow, base = run("slow_cell"), run("no_failure")
    assert max(_step_seconds(slow)) > 3 * max(_step_seconds(base))
    assert all(e.decision == "commit" for e in of(slow, AttemptEnded))
    assert slow.report.versions == base.report.versions


def test_a_slow_link_stretches_weight_updates() -> None:
    def update_seconds(result: SimResult) -> float:
        return max(
            p.t - b.t
            for b in of(result, UpdateBegan)
            for p in of(result, VersionPublished, lambda e, u=b.update_id: e.update_id == u)
        )

    slow, base = run("slow_link"), run("no_failure")
    assert update_seconds(slow) > 20 * update_seconds(base)


def test_router_trouble_costs_time_not_groups() -> None:
    """Each request the failing router refuses is sent again a second later (miles' _post)
    until the router is back: no sample fails, no group is recycled."""
    result = run("router_trouble")
    (failing,) = of(result, FaultInjected, lambda e: e.fault == "fail_router")
    retried = of(result, RequestRetried)
    assert retried and all(failing.t <= e.sent < failing.t + 5.0 for e in retried)
    assert max(e.attempt for e in retried) >= 3  # a 5 s outage: ~1.5 s a try (0.5 s to fail)
    assert not of(result, SampleGenerated, lambda e: e.aborted)
    assert not of(result, GroupRecycled)
    assert not of(result, EngineStateChanged)  # a router failure is not an engine failure


def test_lora_update_is_one_unit_unloaded_then_loaded_and_stamped() -> None:
    from miles_core.events import AdapterUnloaded

    result = run("lora_update")
    updates = of(result, UpdateBegan)
    assert updates and all(e.kind == "lora" and e.n_buckets == 1 for e in updates)
    for n, update in enumerate(updates):  # unload comes before the adapter's single bucket
        unload = of(result, AdapterUnloaded, lambda e, u=update.update_id: e.update_id == u)
        bucket = of(result, BucketReceived, lambda e, u=update.update_id: e.update_id == u)
        if n == 0:  # nothing is loaded yet: SGLang would refuse the unload
            assert not unload and bucket
        else:
            assert unload and bucket and index(result, unload[0]) < index(result, bucket[0])
        assert bucket[0].nbytes > 64 * 1024  # larger than the budget, still one bucket
    stamped = {(e.engine, e.version) for e in of(result, EngineStamped)}
    assert stamped >= {(f"engine-{i}", v) for i in range(2) for v in range(1, 9)}
    (aborted,) = of(result, UpdateAborted)
    assert [
        e.updater for e in of(result, VersionPublished, lambda e: e.version == aborted.version)
    ] == [1]


@pytest.mark.parametrize("name", ["one_step_off", "one_step_off_crash"])
def test_one_step_off_trains_every_group_exactly_one_version_old(name: str) -> None:
    result = run(name)
    got = of(result, GroupGot)
    assert all(e.current_version is None for e in got[:4])  # step 0: before any update
    assert {e.staleness for e in got[4:]} == {1}
    assert not of(result, GroupRecycled) and not of(result, GroupDropped)  # nothing aborted
    assert result.report.versions == list(range(1, 9))
