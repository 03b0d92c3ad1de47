"""Today's miles in the simulator: pause modes, engine fault tolerance, errors that surface,
sorted batches, the dynamic filter, the in-flight cap and per-step metrics.

Each test runs a named scenario (or one changed in one respect) and checks the
behaviour it is about in the history, besides every oracle passing; where a
behaviour is a safety property, a planted bug in test_planted_bugs.py shows that
an oracle, not this file, catches its absence.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from miles_core.cells import CellState
from miles_core.events import (
    AdapterUnloaded,
    BucketReceived,
    CellStateChanged,
    EngineExited,
    EngineHealthFailed,
    EngineRecoveryAsked,
    EnginesFlushed,
    EnginesResumed,
    EngineStarted,
    EngineStateChanged,
    GroupDropped,
    GroupGot,
    GroupPut,
    GroupRecycled,
    GroupStarted,
    GroupTrained,
    HealEnded,
    HeartbeatMissed,
    History,
    SampleGenerated,
    StepCommitted,
    StepMetrics,
    UpdateBegan,
)
from miles_core.kinds import PauseMode, PutFate, RunStatus, SampleOutcome, SubmissionGranularity
from miles_core.loop.producer import Producer
from miles_core.loop.update import Updater
from miles_core.oracles import bounded_staleness
from miles_core.profile import MilesProfile
from miles_core.scenario import SCENARIOS, Expect, scenario_from_toml
from sim.run import SimResult, run_scenario


def of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def passed(name: str, expect: Expect | None = None, **loop: Any) -> SimResult:
    """The named scenario (its loop flags and expectation changed as given) passed."""
    scenario = SCENARIOS[name]
    scenario = dataclasses.replace(
        scenario,
        loop=dataclasses.replace(scenario.loop, **loop),
        expect=expect or scenario.expect,
    )
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    return result


# -- pause modes ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["retract_long_generations", "in_place_long_generations"])
def test_long_generations_span_updates_and_are_never_aborted_by_one(name: str) -> None:
    result = passed(name)
    samples = of(result.history, SampleGenerated)
    spanning = [s for s in samples if len(set(s.all_versions)) > 1]
    assert len(spanning) > len(samples) // 4  # most updates land mid-request
    assert not any(s.outcome is SampleOutcome.ABORTED for s in samples)
    in_place = result.scenario.loop.pause_generation_mode is PauseMode.IN_PLACE
    # in_place keeps the frozen KV (so no flush); retract recomputes it after a flush
    assert all(s.kept_kv is in_place for s in spanning)
    flushes = of(result.history, EnginesFlushed)
    assert (not flushes) if in_place else len(flushes) == len(of(result.history, UpdateBegan))


def test_staleness_counts_from_the_oldest_version_a_response_spans() -> None:
    result = passed("retract_long_generations")
    oldest: dict[int, int] = {}
    for s in of(result.history, SampleGenerated):
        versions = [0 if v is None else v for v in s.all_versions]
        if versions:
            oldest[s.group_id] = min(oldest.get(s.group_id, versions[0]), *versions)
    got = [g for g in of(result.history, GroupGot) if g.staleness is not None]
    assert got and all(g.staleness == g.current_version - oldest[g.group_id] for g in got)
    newest_would_say = [g for g in got if g.staleness > 0]
    assert newest_would_say  # counting from the newest span would report fresher groups


def test_in_place_reports_samples_on_mixed_weights_per_step() -> None:
    result = passed("in_place_long_generations")
    metrics = [dict(m.metrics) for m in of(result.history, StepMetrics)]
    assert [m.step for m in of(result.history, StepMetrics)] == list(range(8))
    mixed = [m["rollout/fully_async/samples_on_mixed_weights"] for m in metrics]
    assert sum(mixed) > 0
    kept = {(s.group_id, s.sample) for s in of(result.history, SampleGenerated) if s.kept_kv}
    trained = {g.group_id for g in of(result.history, GroupTrained)}
    trained_mixed = sum(1 for group, _ in kept if group in trained)
    assert sum(mixed) == trained_mixed  # the metric counts the trained samples that kept KV
    retract = passed("retract_long_generations")
    assert all(
        dict(m.metrics)["rollout/fully_async/samples_on_mixed_weights"] == 0
        for m in of(retract.history, StepMetrics)
    )


def test_abort_mode_runs_one_step_off_and_is_refused_fully_async() -> None:
    result = passed("abort_one_step_off")
    assert result.scenario.loop.pause_generation_mode is PauseMode.ABORT
    with pytest.raises(Exception, match="fully_async cannot use abort"):
        dataclasses.replace(SCENARIOS["no_failure"].loop, pause_generation_mode=PauseMode.ABORT)


# -- engine fault tolerance ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "engines"),
    [
        ("ft_engine_dies", {"engine-1"}),
        ("ft_every_engine_dies", {"engine-0", "engine-1"}),
        ("ft_engine_hangs", {"engine-0"}),
        ("ft_engine_dies_during_recovery", {"engine-1"}),
    ],
)
def test_fault_tolerance_recovers_engines_with_no_injected_restart(
    name: str, engines: set[str]
) -> None:
    result = passed(name)
    assert result.report.status is RunStatus.COMPLETED
    asked = of(result.history, EngineRecoveryAsked)
    assert {e.engine for e in asked} == engines
    # each recovered engine serves again, on a new process, synced before it serves
    for engine in engines:
        serving = [
            e
            for e in of(result.history, EngineStateChanged)
            if e.engine == engine and e.new.value == "serving"
        ]
        assert serving and serving[-1].incarnation > 0
    if name == "ft_engine_hangs":  # alive but silent: found by /health_generate, not an exit
        failed = of(result.history, EngineHealthFailed)
        assert failed and "health" in failed[0].reason
    if name == "ft_engine_dies_during_recovery":
        assert len(asked) >= 2  # recovered again after the new process died starting
        assert any("starting" in e.how for e in of(result.history, EngineExited))


def test_a_recovery_slower_than_the_monitors_patience_is_waited_for() -> None:
    """A new process that takes longer to start than --rollout-health-check-interval +
    timeout (4 s here) is not replaced by a second recovery while it starts: asking again
    would kill it, and every start after it, for ever (seen on the CPU backend under load).
    Here each new process takes 10 s to answer (engine_start_seconds, as the CPU backend's
    do); each engine is asked once and serves again."""
    scenario = SCENARIOS["ft_every_engine_dies"]
    slow = dataclasses.replace(
        scenario, timing=dataclasses.replace(scenario.timing, engine_start_seconds=10.0)
    )
    result = run_scenario(slow, 0)
    assert result.ok, result.failures()
    asked = of(result.history, EngineRecoveryAsked)
    assert sorted(e.engine for e in asked) == ["engine-0", "engine-1"]
    assert not any("starting" in e.how for e in of(result.history, EngineExited))
    for e in asked:  # each new process answered 10 s after its recovery was asked
        started = next(
            s for s in of(result.history, EngineStarted) if s.engine == e.engine and s.t >= e.t
        )
        assert started.t == pytest.approx(e.t + 10.0)


def test_without_fault_tolerance_losing_every_engine_fails_with_a_clear_error() -> None:
    result = passed("every_engine_dies_without_ft")
    assert result.report.status is RunStatus.FAILED
    assert type(result.report.error).__name__ == "NoLiveEngineError"
    assert "--use-fault-tolerance is off" in result.report.reason
    assert not of(result.history, EngineRecoveryAsked)
    # the same faults with fault tolerance on: recovered, completed
    on = passed("every_engine_dies_without_ft", Expect(), use_fault_tolerance=True)
    assert on.report.status is RunStatus.COMPLETED
    assert {e.engine for e in of(on.history, EngineRecoveryAsked)} == {"engine-0", "engine-1"}


ENGINES_LOST_MID_DRAIN = """
name = "engines_lost_mid_drain"
description = "both engines die while step 0's batch is drained (a group got, the rest not)"
expect = { status = "failed", error = "NoLiveEngineError" }
[sim]
num_engines = 2
[loop]
steps = 6
[[faults]]
kind = "kill_engine"
engine = "engine-0"
at = 3.0
[[faults]]
kind = "kill_engine"
engine = "engine-1"
at = 4.0
"""


def test_a_group_the_drain_holds_when_the_run_fails_is_outstanding_not_lost() -> None:
    """The batch a drain is filling is held by nobody else until it returns: a run that
    fails meanwhile reports its groups outstanding (exactly_once found them lost before,
    on 7 of 8 seeds of the scenario written by hand)."""
    scenario = scenario_from_toml(ENGINES_LOST_MID_DRAIN, "test")
    reached = 0
    for seed in range(8):
        result = run_scenario(scenario, seed)
        assert result.ok, (seed, result.failures())
        assert type(result.report.error).__name__ == "NoLiveEngineError"
        settled = {e.prompt_id for e in of(result.history, GroupTrained)}
        settled |= {e.prompt_id for e in of(result.history, GroupDropped)}
        held = {e.prompt_id for e in of(result.history, GroupGot)} - settled
        assert held <= set(result.history[-1].outstanding_prompts), seed
        reached += bool(held)
    assert reached >= 4, "most runs must end while a drain holds a group"


def test_health_checks_wait_for_the_first_wait_but_a_timed_out_call_replaces_at_once() -> None:
    """The hang at ~13 s fails the next update's pause call (a call with fault tolerance
    times out): that process may still generate, unpaused, on old weights, so it is
    left to the monitor); the monitor's own checks still wait out its first wait. The call's
    deadline is the health check's timeout: aug2026's (today's is
    --update-weight-engine-request-timeout: scenarios/test_miles_deadlines.py)."""
    result = passed(
        "ft_engine_hangs",
        rollout_health_check_first_wait=30.0,
        miles_profile=MilesProfile.AUG2026,
    )
    down = [e for e in of(result.history, EngineStateChanged) if e.new.value == "down"]
    assert down and down[0].t < 30.0 and "no answer to pause" in down[0].reason
    asked = of(result.history, EngineRecoveryAsked)
    assert asked and asked[0].t == down[0].t and asked[0].reason == down[0].reason
    assert all(e.t >= 30.0 for e in of(result.history, EngineHealthFailed))


# -- the trainer heartbeat checker ---------------------------------------------------------

MISSES_ACROSS_A_HEAL = """
name = "misses_across_a_heal"
description = "cell 2 misses two heartbeats, cell 0 is healed back, cell 2 misses two more"
[sim]
num_cells = 3
[loop]
steps = 8
[[faults]]
kind = "kill_cell"
cell = 0
point = "step_begin"
step = 1
[[faults]]
kind = "start_cell"
cell = 0
point = "step_begin"
step = 4
[[faults]]
kind = "drop_heartbeat"
cell = 2
at = 24.0
duration = 11.0
"""


def test_a_heal_starts_every_cells_count_of_missed_heartbeats_afresh() -> None:
    """miles pauses its trainer checkers around a reconfiguration and each resume zeroes the
    count of failures in a row (group.py ``_paused_health_checkers``,
    health_checker.py ``SimpleHealthChecker.resume``; miles' own test
    test_health_checker.py::test_resume_resets_failure_counter). Where cell 0's heal
    lands between cell 2's second and third miss (seeds 0, 2, 8 and 9 of 10), the count starts
    again at 1 and cell 2 stays alive; where it lands later, three misses in a row fail it.
    The count used to survive the heal, and failed a healthy cell (seed 0: at t=31.08)."""
    scenario = scenario_from_toml(MISSES_ACROSS_A_HEAL, "test")
    spared = 0
    for seed in range(10):
        result = run_scenario(scenario, seed)
        assert result.ok, (seed, result.failures())
        (heal,) = of(result.history, HealEnded)
        assert heal.dst_cell == 0, seed
        missed = [(e.t, e.misses) for e in of(result.history, HeartbeatMissed) if e.cell == 2]
        before = [m for t, m in missed if t < heal.t]
        after = [m for t, m in missed if t > heal.t]
        assert after == list(range(1, len(after) + 1)), (seed, missed)
        failed = [e for e in of(result.history, CellStateChanged) if e.cell == 2]
        assert bool(failed) == (3 in before + after), (seed, missed, failed)
        spared += before == [1, 2] and not failed
    assert spared >= 2, "the heal must fall between the second and third miss on some seeds"


MISSES_DURING_UPDATES = """
name = "misses_during_updates"
description = "updates take seconds on a slow link while cell 1 answers no heartbeat"
[loop]
steps = 6
[[faults]]
kind = "slow_link"
at = 10.0
duration = 30.0
factor = 2000.0
[[faults]]
kind = "drop_heartbeat"
cell = 1
at = 14.0
duration = 20.0
"""


def test_the_heartbeat_checker_goes_on_through_a_weight_update() -> None:
    """miles' ``update_weights`` pauses the rollout health monitor only; the trainer cells'
    checkers go on (their RPC has its own concurrency group, cell_monitor.py). A heartbeat
    missed while weights are sent counts: the checker used to skip those rounds."""
    result = run_scenario(scenario_from_toml(MISSES_DURING_UPDATES, "test"), 0)
    assert result.ok, result.failures()
    windows = list(
        zip(
            [e.t for e in of(result.history, UpdateBegan)],
            [e.t for e in of(result.history, EnginesResumed)],
            strict=True,
        )
    )
    missed = [e.t for e in of(result.history, HeartbeatMissed) if e.cell == 1]
    during = [t for t in missed if any(a < t < b for a, b in windows)]
    assert during, (missed, windows)
    failed = [e.new for e in of(result.history, CellStateChanged) if e.cell == 1]
    assert CellState.ERRORED in failed


def test_a_dead_cells_heartbeat_is_missed_at_once_not_at_the_timeout() -> None:
    """A dead process refuses its heartbeat at once (Ray raises for a call to a dead actor),
    and miles counts a raised check as a failure then (test_health_checker.py::
    test_rpc_error_propagates_as_unhealthy): each miss of cell 1, killed while idle, is
    recorded as soon as the round's other cells answered. A dead cell's heartbeat used to
    go unanswered, so each miss came only at the round's timeout."""
    result = passed("cell_killed_between_steps")
    loop = result.scenario.loop
    assert loop.heartbeat_timeout is not None and loop.heartbeat_timeout >= 1.0
    missed = [e for e in of(result.history, HeartbeatMissed) if e.cell == 1]
    assert missed
    assert all(e.t - e.sent < loop.heartbeat_timeout / 10 for e in missed), missed


FIRST_WAIT_AROUND_A_HEAL = """
name = "first_wait_around_a_heal"
description = "cell 2 answers no heartbeat all run; cell 0 dies at step 1 and is healed at step 4"
[sim]
num_cells = 3
[loop]
steps = 8
heartbeat_first_wait = 10.0
heartbeat_failure_threshold = 1000
[[faults]]
kind = "kill_cell"
cell = 0
point = "step_begin"
step = 1
[[faults]]
kind = "start_cell"
cell = 0
point = "step_begin"
step = 4
[[faults]]
kind = "drop_heartbeat"
cell = 2
at = 0.0
duration = 1000.0
"""


@pytest.mark.parametrize("seed", range(3))
def test_the_heartbeat_checker_waits_its_first_wait_after_the_start_and_each_resume(
    seed: int,
) -> None:
    """--trainer-heartbeat-checker-first-wait: the first round comes that long after the
    start, and again after each resume, when the count of misses starts afresh (miles'
    health_checker.py ``SimpleHealthChecker``: ``_need_first_wait``; miles' own tests
    test_first_wait_delays_first_check and test_resume_triggers_first_wait_again). Cell 2
    never answers, so every round is a recorded miss."""
    scenario = scenario_from_toml(FIRST_WAIT_AROUND_A_HEAL, "test")
    first_wait = scenario.loop.heartbeat_first_wait
    result = run_scenario(scenario, seed)
    assert result.ok, result.failures()
    missed = [e for e in of(result.history, HeartbeatMissed) if e.cell == 2]
    assert missed[0].sent == first_wait and missed[0].misses == 1
    (heal,) = of(result.history, HealEnded)
    after = [e for e in missed if e.sent > heal.t]
    assert after and after[0].sent >= heal.t + first_wait, (heal.t, after)
    assert after[0].misses == 1  # the count started afresh at the resume


def test_without_a_first_wait_the_heartbeat_checker_checks_at_once() -> None:
    """With --trainer-heartbeat-checker-first-wait 0 the first round goes out at the start,
    as miles' ``SimpleHealthChecker._loop`` (sleep first_wait, check, sleep interval) checks
    at once (miles' test_health_checker.py::test_check_fn_called_after_first_interval); it
    used to go out one interval in (sent at 2.0 on every seed). The round at t=0 and the
    fault muting cell 2 at t=0 fall at one instant, in an order the seed draws: where the
    fault comes first that round is cell 2's first miss; where the ping comes first it is
    answered, and the next round (an interval after that answer) is the first miss."""
    scenario = scenario_from_toml(FIRST_WAIT_AROUND_A_HEAL, "test")
    loop = dataclasses.replace(scenario.loop, heartbeat_first_wait=0.0)
    interval, timeout = loop.heartbeat_interval, loop.heartbeat_timeout
    assert interval is not None
    firsts = []
    for seed in range(3):
        result = run_scenario(dataclasses.replace(scenario, loop=loop), seed)
        assert result.ok, result.failures()
        missed = [e for e in of(result.history, HeartbeatMissed) if e.cell == 2]
        firsts.append(missed[0].sent)
        (heal,) = of(result.history, HealEnded)
        after = [e for e in missed if e.sent > heal.t]
        assert after[0].misses == 1 and after[0].sent <= heal.t + interval + timeout, seed
    assert 0.0 in firsts, firsts
    assert all(t == 0.0 or interval < t < interval + timeout for t in firsts), firsts


# -- LoRA: unload where loaded -------------------------------------------------------------

LORA_ENGINE_RESTARTED = """
name = "lora_engine_restarted"
description = "a LoRA run whose engine-1 dies and is restarted: the new process holds no adapter"
[loop]
steps = 8
lora_adapter = "policy"
update_weight_buffer_size = 65536
use_fault_tolerance = true
[[faults]]
kind = "kill_engine"
engine = "engine-1"
at = 12.0
"""


def _adapter_moves(history: History) -> int:
    """Check every unload against what the world reported: an engine's adapter is unloaded
    only from a process it was delivered to, and delivered only to a process without one.
    How many unloads there were."""
    held: dict[str, int] = {}
    unloads = 0
    for e in history:
        if isinstance(e, EngineStarted):
            held.pop(e.engine, None)  # a new process starts without the adapter
        elif isinstance(e, BucketReceived):
            assert not set(e.engines) & set(held), (e, held)
            held.update(zip(e.engines, e.incarnations, strict=True))
        elif isinstance(e, AdapterUnloaded):
            assert set(e.engines) <= set(held), (e, held)
            for engine in e.engines:
                del held[engine]
            unloads += len(e.engines)
    return unloads


@pytest.mark.parametrize("seed", range(4))
def test_a_lora_update_unloads_the_adapter_only_where_it_is_loaded(seed: int) -> None:
    """SGLang refuses to unload an adapter a process lacks and to load a name it holds, so
    miles unloads only when loaded (``_update_lora_weights``; its tests
    test_first_load_does_not_unload and test_reload_unloads_existing_adapter_first).
    Here the holders are the processes the transport delivered it to: the first update,
    an engine's new process and a new updater after a failover (lora_update kills the
    updater after the adapter arrived) each get it loaded without a refusal."""
    for scenario in (scenario_from_toml(LORA_ENGINE_RESTARTED, "test"), SCENARIOS["lora_update"]):
        result = run_scenario(scenario, seed)
        assert result.ok, (scenario.name, seed, result.failures())
        assert _adapter_moves(result.history) > 0, scenario.name


def test_unloading_from_every_engine_is_refused_by_the_first_lora_update(monkeypatch) -> None:
    """The plan this loop used before: the adapter unloaded from every engine, even on the
    first update, when no engine holds it."""
    monkeypatch.setattr(Updater, "_adapter_holders", lambda self, engines, *_: engines)
    result = run_scenario(SCENARIOS["lora_update"], 0)
    assert result.report.status is RunStatus.CRASHED
    assert "LoRA adapter policy is not loaded" in str(result.report.error)


# -- errors surface, batches sorted, miles' rollout flags ------------------------------------


def test_a_dead_producer_fails_the_run_even_with_groups_queued(monkeypatch) -> None:
    async def dies_after_one_put(self: Producer) -> None:
        for _ in range(self.ctx.config.in_flight_groups):
            self._start_group()
        await self._arrived.wait()  # a group is queued for the trainer
        raise RuntimeError("planted: the producer died")

    monkeypatch.setattr(Producer, "run", dies_after_one_put)
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.report.status is RunStatus.CRASHED
    assert "planted: the producer died" in result.report.reason
    assert "producer" in result.report.reason  # where it happened
    assert of(result.history, GroupPut)  # groups were queued, yet no step trained on them
    assert not of(result.history, StepCommitted)
    assert "the run crashed: RuntimeError" in str(result.verdicts["end_state"])


def test_a_generation_error_ends_the_run_with_its_type_not_a_deadlock(monkeypatch) -> None:
    from sim.world.router import SimRouter

    generate = SimRouter.generate

    async def broken(self: Any, engine: str, incarnation: int, request: Any) -> Any:
        if request.group_id == 5:
            raise ZeroDivisionError("planted: a reward function divided by zero")
        return await generate(self, engine, incarnation, request)

    monkeypatch.setattr(SimRouter, "generate", broken)
    result = run_scenario(SCENARIOS["no_failure"], 0)
    assert result.report.status is RunStatus.CRASHED
    assert type(result.report.error) is ZeroDivisionError
    assert "deadlock" not in result.report.reason


def test_batches_are_sorted_by_sample_index() -> None:
    result = passed("staleness_retry")
    steps: dict[int, list[int]] = {}
    for e in of(result.history, GroupTrained):
        steps.setdefault(e.step, []).append(e.prompt_id)
    assert steps and all(prompts == sorted(prompts) for prompts in steps.values())
    arrival = [e.prompt_id for e in of(result.history, GroupPut)]
    assert arrival != sorted(arrival)  # they did not arrive in order


def test_the_dynamic_filter_drops_zero_std_groups_with_their_reason() -> None:
    result = passed("dynamic_filter_zero_std")
    dropped = of(result.history, GroupDropped)
    reasons = {e.reason for e in dropped}
    assert reasons == {"dynamic_filter:zero_std_0.0", "dynamic_filter:zero_std_1.0"}
    trained = {e.group_id for e in of(result.history, GroupTrained)}
    assert trained.isdisjoint(e.group_id for e in dropped)
    metrics = [dict(m.metrics) for m in of(result.history, StepMetrics)]
    drops = sum(v for m in metrics for k, v in m.items() if k.startswith("rollout/dynamic_filter"))
    assert drops == len(dropped)


def _peaks(result: SimResult) -> tuple[int, int]:
    """The most groups (started, not yet queued or refused: a blocked put still counts)
    and the most samples (submitted, request not ended) in flight at once."""
    n = result.scenario.loop.n_samples_per_prompt
    groups: set[int] = set()
    samples = peak_groups = peak_samples = 0
    for e in result.history:
        if isinstance(e, GroupStarted):
            groups.add(e.group_id)
            samples += n
            peak_groups, peak_samples = max(peak_groups, len(groups)), max(peak_samples, samples)
        elif isinstance(e, SampleGenerated):
            samples -= 1
        elif (isinstance(e, GroupPut) and e.fate is PutFate.QUEUED) or isinstance(
            e, GroupDropped | GroupRecycled
        ):
            groups.discard(e.group_id)
    return peak_groups, peak_samples


def test_async_max_concurrent_samples_caps_samples_and_backfills_by_sample() -> None:
    """miles' fully-async default is sample backfill (``make_submission_scheduler(default=
    "sample")``; its tests test_worker_defaults_to_sample_granularity and
    test_backfill_submits_replacement_before_the_group_returns): a new group goes out once
    n samples have finished, before their groups return, and at most budget x n samples
    are in flight. The budget is 3 groups of 2 here."""
    result = passed("max_concurrent_samples")
    loop = result.scenario.loop
    assert loop.in_flight_groups == 3
    assert loop.submission_granularity is SubmissionGranularity.SAMPLE
    groups, samples = _peaks(result)
    assert samples == 3 * loop.n_samples_per_prompt
    assert groups > 3  # replacements went out while groups were still generating


def test_group_granularity_caps_groups_in_flight() -> None:
    result = passed("max_concurrent_samples", rollout_submission_granularity="group")
    assert result.scenario.loop.submission_granularity is SubmissionGranularity.GROUP
    assert _peaks(result)[0] == 3


def test_staleness_bound_holds_from_the_oldest_span() -> None:
    result = passed("in_place_long_generations", max_weight_staleness=1)
    assert bounded_staleness(result.history) is None
