"""The named scenarios (``python -m sim list``), world-neutral: every world runs them.

Each is about one behaviour of the control plane; its description says which.
Steps count from 0; "the update following step k" publishes version k + 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from miles_core.buffer import UnusedHandler
from miles_core.kinds import PauseMode, RunStatus
from miles_core.profile import MilesProfile
from miles_core.scenario.faults import AnyFault
from miles_core.scenario.faults import make_fault as F
from miles_core.scenario.liveness import Liveness
from miles_core.scenario.model import Expect, Scenario
from miles_core.scenario.presets import DEFAULT_LOOP as _LOOP
from miles_core.scenario.world import TimeModel, WorldShape
from miles_core.transfer import TransferMode


def _scenario(
    name: str,
    description: str,
    faults: tuple[AnyFault, ...] = (),
    world: WorldShape | None = None,
    expect: Expect | None = None,
    timing: TimeModel | None = None,
    until_witnessed: int | None = None,
    liveness: Liveness | None = None,
    **loop: Any,
) -> Scenario:
    return Scenario(
        name,
        description,
        world=world or WorldShape(),
        timing=timing or TimeModel(),
        loop=dataclasses.replace(_LOOP, **loop),
        faults=faults,
        expect=expect or Expect(),
        until_witnessed=until_witnessed,
        liveness=liveness,
    )


RESTART_STEPS = 200
"""``until_witnessed`` of the scenarios that restart or recover an engine: instant in the
simulator by default (which then never needs a step more; ``engine_start_seconds`` models a
slower start), 5 to 13 s for real on CPU (importing torch and transformers), up to a hundred
steps at a tenth of a second each (a cap of 40 ran out once a step took 0.1 s)."""


_LONG = TimeModel(response_tokens_mean=2048.0, response_tokens_sigma=0.3)
"""Responses of ~20 s against 5 s steps: every update finds requests in flight."""

_FT: dict[str, Any] = {
    "use_fault_tolerance": True,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "mini_ft_controller_poll_interval": 2.0,
    "mini_ft_controller_resume_delay": 2.0,
    "update_weight_engine_request_timeout": 5.0,
}
"""miles' health monitor, on the small preset's time scale (miles' defaults are 30 s), and
today's rollout-side FT controller (10 s poll and resume delay) and per-call deadline (300 s)
on the same scale: at miles' values a run of a real CPU backend's 0.1 s steps ends before the
controller has resumed an engine. aug2026 reads none of the last three (its monitor recovers
engines; its deadline is the health check's timeout)."""


_BOTH_ENGINES_DIE_AT_STEP_3 = (
    F("kill_engine", engine="engine-0", point="step_begin", step=3),
    F("kill_engine", engine="engine-1", point="step_begin", step=3),
)


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        _scenario("no_failure", "two cells, two engines, eight steps, no fault"),
        _scenario(
            "cell_crash_before_allreduce",
            "cell 1 dies before the allreduce of step 2: the survivor discards, the step "
            "retries on a shrunk quorum; cell 1 is healed back at step 5",
            (
                F("kill_cell", cell=1, point="before_allreduce", step=2),
                F("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "updater_dies_after_many_updates",
            "the updating cell 0 dies after bucket 1 of the update following step 12: "
            "cell 1 takes over and the version continues",
            (F("kill_cell", cell=0, point="after_bucket", bucket=1, after_step=12),),
            steps=16,
        ),
        _scenario(
            "crash_mid_weight_update",
            "the updater dies after bucket 2 of the first update: no engine serves the "
            "half-sent weights and the version advances once",
            (F("kill_cell", cell=0, point="after_bucket", bucket=2),),
        ),
        _scenario(
            "engine_crash_mid_generation",
            "engine-1 dies halfway through a request: its groups are aborted and recycled",
            (F("kill_engine", engine="engine-1", point="mid_generation", after_step=2),),
            unused_samples_handler=UnusedHandler.RETRY,
        ),
        _scenario(
            "engine_crash_mid_generation_drop",
            "as engine_crash_mid_generation, with --async-unused-samples-handler drop",
            (F("kill_engine", engine="engine-1", point="mid_generation", after_step=2),),
            unused_samples_handler=UnusedHandler.DROP,
        ),
        _scenario(
            "engine_restart",
            "engine-0 restarts at step 3: it serves only after it received the current "
            "weights and version",
            (F("restart_engine", engine="engine-0", point="step_begin", step=3),),
            until_witnessed=RESTART_STEPS,
        ),
        _scenario(
            "first_update",
            "one step: everything trained before the first update has no version, and the "
            "staleness filter is off (not staleness 0)",
            steps=1,
            max_weight_staleness=0,
        ),
        _scenario(
            "staleness_retry",
            "rollout runs far ahead of slow training with --max-weight-staleness 1 and retry: "
            "stale groups are recycled, none is trained beyond the bound",
            async_max_concurrent_samples=32,
            max_weight_staleness=1,
            capacity_factor=4.0,
            unused_samples_handler=UnusedHandler.RETRY,
        ),
        _scenario(
            "staleness_drop",
            "as staleness_retry with drop: stale groups are dropped with a reason",
            async_max_concurrent_samples=32,
            max_weight_staleness=1,
            capacity_factor=4.0,
            unused_samples_handler=UnusedHandler.DROP,
        ),
        _scenario(
            "buffer_backpressure",
            "capacity floor(0.5 x 4) = 2 with 12 groups in flight: puts block until a get",
            async_max_concurrent_samples=24,
            capacity_factor=0.5,
        ),
        _scenario(
            "all_cells_dead",
            "both cells die before the allreduce of step 1: a clear error, no hang",
            (
                F("kill_cell", cell=0, point="before_allreduce", step=1),
                F("kill_cell", cell=1, point="before_allreduce", step=1),
            ),
            expect=Expect(RunStatus.FAILED, "NoAliveCellError"),
        ),
        _scenario(
            "one_attempt_per_step",
            "max_step_attempts = 1 and cell 1 dies before the allreduce of step 2: the step "
            "cannot be retried, so the run ends with RetriesExhaustedError, as expected",
            (F("kill_cell", cell=1, point="before_allreduce", step=2),),
            expect=Expect(RunStatus.FAILED, "RetriesExhaustedError"),
            max_step_attempts=1,
        ),
        _scenario(
            "restart_before_stamp",
            "engine-1 restarts right after the last bucket of the first update, before the "
            "stamp: the new process received none of the buckets, so it must not be stamped "
            "or serve until a sync brings it the published weights",
            (F("restart_engine", engine="engine-1", point="after_bucket", bucket=3),),
            until_witnessed=RESTART_STEPS,
        ),
        _scenario(
            "restart_mid_update",
            "engine-0 restarts after bucket 1 of the update following step 3: the new "
            "process is not in the update's transfer group, the update is retried, and "
            "the engine serves only once it holds the whole update",
            (F("restart_engine", engine="engine-0", point="after_bucket", bucket=1, after_step=3),),
            until_witnessed=RESTART_STEPS,
        ),
        _scenario(
            "cell_killed_between_steps",
            "cell 1 dies at t=10 s while idle: the heartbeat checker or the next call "
            "notices, the quorum shrinks; the cell is restarted and healed at step 5",
            (
                F("kill_cell", cell=1, at=10.0),
                F("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "ft_controller_heals_a_killed_cell",
            "cell 1 dies at t=10 s and no one starts it: miles' mini FT controller (polls "
            "every 2 s, resumes after 2 s: miles' 10 s scaled down) finds it stopped, waits, "
            "asks the world for new processes, and the next refresh heals it",
            (F("kill_cell", cell=1, at=10.0),),
            mini_ft_controller_enable=True,
            mini_ft_controller_poll_interval=2.0,
            mini_ft_controller_resume_delay=2.0,
        ),
        _scenario(
            "kill_during_heal",
            "three cells; cell 2 dies at step 1 and is restarted at step 3; the healing "
            "source, cell 0, dies while sending the checkpoint, so cell 2 is healed from "
            "cell 1 at the next refresh; cell 0 comes back at step 5",
            (
                F("kill_cell", cell=2, point="before_allreduce", step=1),
                F("start_cell", cell=2, point="step_begin", step=3),
                F("kill_cell", cell=0, point="during_heal"),
                F("start_cell", cell=0, point="step_begin", step=5),
            ),
            world=WorldShape(num_cells=3),
        ),
        _scenario(
            "engine_killed_mid_update",
            "engine-1 dies right after bucket 1 of the update following step 2: the update "
            "drops it and is retried with the same version on engine-0",
            (F("kill_engine", engine="engine-1", point="after_bucket", bucket=1, after_step=2),),
        ),
        _scenario(
            "heartbeat_false_positive",
            "cell 1 stops answering heartbeats for 12 s while healthy: after 3 misses it is "
            "declared dead and stopped (a false positive), and healed back at step 5",
            (
                F("drop_heartbeat", cell=1, at=9.0, duration=12.0),
                F("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "slow_cell",
            "cell 0 computes 4x slower for 30 s: steps take longer, nothing fails",
            (F("slow_cell", cell=0, at=5.0, duration=30.0, factor=4.0),),
        ),
        _scenario(
            "slow_link",
            "the weight-transfer link is 50x slower for 40 s",
            (F("slow_link", at=5.0, duration=40.0, factor=50.0),),
        ),
        _scenario(
            "router_trouble",
            "the router adds 2 s to every request for 20 s, then fails every request for 5 s: "
            "each failed request is sent again 1 s later until the router is back (miles' "
            "_post), so the outage costs time, not groups",
            (
                F("delay_router", at=5.0, duration=20.0, seconds=2.0),
                F("fail_router", at=30.0, duration=5.0),
            ),
            unused_samples_handler=UnusedHandler.RETRY,
        ),
        _scenario(
            "lora_update",
            "only a LoRA adapter is trained and pushed: one atomic unit, unload-then-load, "
            "and the engines are stamped with the version like a full update; the updater "
            "dies mid-push once",
            (F("kill_cell", cell=0, point="after_bucket", bucket=0, after_step=2),),
            lora_adapter="policy",
            update_weight_buffer_size=64 * 1024,
        ),
        _scenario(
            "one_step_off",
            "the synchronous baseline: batch k+1 is generated while step k trains; updates "
            "never abort generation and every trained group is exactly one version old",
            mode="one_step_off",
        ),
        _scenario(
            "one_step_off_crash",
            "one-step-off with cell 1 dying before the allreduce of step 3 and healed at step 6",
            (
                F("kill_cell", cell=1, point="before_allreduce", step=3),
                F("start_cell", cell=1, point="step_begin", step=6),
            ),
            mode="one_step_off",
        ),
        _scenario(
            "p2p_transfer",
            "weights go point-to-point to each engine instead of by broadcast",
            transfer_mode=TransferMode.P2P,
        ),
        # -- pause modes (miles' --pause-generation-mode) -------------------------------
        _scenario(
            "retract_long_generations",
            "responses of ~2000 tokens (20 s) against 5 s steps, under retract (miles' "
            "default): every update lands mid-request; requests are retracted, not aborted, "
            "and continue on the new weights with their KV recomputed, so a response spans "
            "several versions and its staleness counts from the oldest",
            timing=_LONG,
            pause_generation_mode=PauseMode.RETRACT,
            max_weight_staleness=4,
        ),
        _scenario(
            "in_place_long_generations",
            "as retract_long_generations under in_place: frozen requests keep their KV, the "
            "cache is not flushed (SGLang would refuse), and later tokens come from new "
            "weights on old KV (counted as samples on mixed weights)",
            timing=_LONG,
            pause_generation_mode=PauseMode.IN_PLACE,
            max_weight_staleness=4,
        ),
        _scenario(
            "abort_one_step_off",
            "pause mode abort, which miles allows outside fully-async: one-step-off updates "
            "wait for the next batch, so an update aborts nothing; engine-1 restarts at step "
            "3 and its sync pauses it with abort",
            (F("restart_engine", engine="engine-1", point="step_begin", step=3),),
            until_witnessed=RESTART_STEPS,
            mode="one_step_off",
            pause_generation_mode=PauseMode.ABORT,
        ),
        # -- engine fault tolerance (--use-fault-tolerance) -------------------------------
        _scenario(
            "ft_engine_dies",
            "with fault tolerance, engine-1 dies at step 2 and nothing restarts it: the "
            "health monitor finds it, takes it out of rotation and recovers it (a new "
            "process, synced to the published version before it serves)",
            (F("kill_engine", engine="engine-1", point="step_begin", step=2),),
            until_witnessed=RESTART_STEPS,  # for real, the recovery comes seconds later
            **_FT,
        ),
        _scenario(
            "ft_every_engine_dies",
            "with fault tolerance, both engines die at step 3: generation stops, the monitor "
            "recovers both, and the run completes",
            _BOTH_ENGINES_DIE_AT_STEP_3,
            # for real, generation goes on once one is back: the run waits for both
            until_witnessed=RESTART_STEPS,
            **_FT,
        ),
        _scenario(
            "every_engine_dies_without_ft",
            "without fault tolerance, both engines die at step 3 and nothing restarts them: "
            "the run ends with NoLiveEngineError once no engine came back within "
            "--rollout-health-check-timeout, not with a stall",
            _BOTH_ENGINES_DIE_AT_STEP_3,
            expect=Expect(RunStatus.FAILED, "NoLiveEngineError"),
            rollout_health_check_timeout=4.0,
        ),
        _scenario(
            "ft_engine_hangs",
            "with fault tolerance, engine-0 hangs at step 2 (alive, answering nothing): its "
            "/health_generate times out, it is killed and recovered, and the run completes",
            (F("hang_engine", engine="engine-0", point="step_begin", step=2),),
            until_witnessed=RESTART_STEPS,  # for real, the kill and recovery take seconds
            **_FT,
        ),
        _scenario(
            "ft_updates_outlast_the_health_timeout",
            "with fault tolerance, every weight update keeps the engines paused for about 4 s "
            "(4 GiB over a 1 GB/s link between nodes) against a 1 s health-check timeout: a "
            "/health_generate is a request, which a paused engine does not schedule, so the "
            "monitor must be paused around updates, as miles pauses it",
            world=WorldShape(param_bytes=4 * 1024**3, gpus_per_node=1),
            timing=TimeModel(link_bytes_per_second=1e9),
            rollout_health_check_interval=1.0,
            rollout_health_check_timeout=1.0,
            use_fault_tolerance=True,
        ),
        _scenario(
            "ft_engine_hangs_mid_update",
            "with fault tolerance and 3 engines, engine-1 hangs right after bucket 0 of the "
            "update following step 1: it takes no part in bucket 1's broadcast, which stalls "
            "the whole group for the collective timeout (15 s); the update fails as a whole "
            "and engine-1, the member that did not take part, is taken out and recovered",
            (F("hang_engine", engine="engine-1", point="after_bucket", bucket=0, after_step=1),),
            world=WorldShape(num_engines=3),
            until_witnessed=RESTART_STEPS,  # for real, the kill and recovery take seconds
            # a member later than this is blamed: seconds, not miles' 30 min, so the test is
            # short, yet past the few seconds a 2-core machine starting an engine can stall
            update_weight_collective_timeout=15.0,
            **_FT,
        ),
        _scenario(
            "ft_engine_dies_during_recovery",
            "with fault tolerance, engine-1 dies at step 2 and its new process dies while "
            "starting: the monitor recovers it again",
            (
                F("kill_engine", engine="engine-1", point="step_begin", step=2),
                F("kill_engine", engine="engine-1", point="during_recovery"),
            ),
            until_witnessed=RESTART_STEPS,  # for real, the recovery comes seconds later
            **_FT,
        ),
        # -- miles' rollout flags ---------------------------------------------------------
        _scenario(
            "dynamic_filter_zero_std",
            "--dynamic-sampling-filter-path check_reward_nonzero_std with 0/1 rewards: groups "
            "whose rewards are all equal are dropped with their reason, never trained",
            timing=TimeModel(reward_success_rate=0.5),
            dynamic_sampling_filter="check_reward_nonzero_std",
            unused_samples_handler=UnusedHandler.DROP,
        ),
        _scenario(
            "max_concurrent_samples",
            "--async-max-concurrent-samples 6 with 2 samples per prompt: at most 3 groups "
            "generate at once (miles' max(1, 6 // 2))",
            async_max_concurrent_samples=6,
        ),
        # -- miles' bugs behind switches: each passes with its switch off (the default) -------
        _scenario(
            "p2p_link_stalls",
            "p2p weights, one bucket an update, over a link that all but stalls for 6 s at "
            "t=10: the writes begun then take ~100 s, and the update waits for them before it "
            "stamps. With --miles-bug-p2p-failures-logged, miles' wait_transfers gives up on "
            "each write after 30 s and the engines are stamped without the bucket",
            (F("slow_link", at=10.0, duration=6.0, factor=130000.0),),
            transfer_mode=TransferMode.P2P,
            update_weight_buffer_size=64 * 1024**2,  # 2 writes an update: 2 x 30 s of waiting
        ),
        _scenario(
            "sync_fails_then_engine_hangs",
            "fault tolerance, --max-route-attempts 1, responses of ~20 s: while a batch "
            "generates, engine-1 dies and is recovered, cell 0 dies sending its sync (which "
            "raises; the run goes on, the next update brings engine-1 the weights), then "
            "engine-0 hangs: the health monitor finds it and the batch completes. With "
            "--miles-bug-health-monitor-left-paused the failed sync left the monitor paused "
            "until the next rollout, which waits for this batch",
            (
                F("kill_engine", engine="engine-1", at=32.0),
                F("kill_cell", cell=0, point="after_bucket", bucket=0, after_time=32.0),
                F("hang_engine", engine="engine-0", at=36.0),
            ),
            # little jitter, so that t=32..36 falls inside step 1's drain on every seed
            timing=TimeModel(
                response_tokens_mean=2048.0, response_tokens_sigma=0.05, train_jitter=0.0
            ),
            max_route_attempts=1,
            # its point is 31f1ca9's sync of a recovered engine; under today both engines
            # wait for an update that waits for this batch (scenarios/test_miles_cells.py)
            miles_profile=MilesProfile.AUG2026,
            **_FT,
        ),
        _scenario(
            "ft_update_meets_a_hung_engine",
            "liveness mode, fault tolerance at miles' 30 s health checks: engine-1 hangs as step "
            "2 begins and the update after it reaches the hung engine before the monitor's next "
            "check (the monitor is paused through updates); the update's own deadline on each "
            "control call gets it past the engine. Every fault is healed as step 5 begins, and "
            "3 steps must then commit within the liveness bound",
            (F("hang_engine", engine="engine-1", point="step_begin", step=2),),
            world=WorldShape(num_engines=3),
            liveness=Liveness(heal_step=5, steps=3),
            steps=6,
            use_fault_tolerance=True,
            rollout_health_check_interval=30.0,
            rollout_health_check_timeout=30.0,
        ),
    )
}
