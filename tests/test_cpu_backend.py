"""The CPU backend for real: Ray with virtual GPUs, torch trainers, HTTP engines, gloo.

One Ray session serves the module (each test's actors and placement group are
removed when its run returns; Ray and its temporary directory when the module
ends). The conformance set runs each scenario in the simulator and for real
and requires the same decisions (miles_core.conformance); rollout counts,
which depend on timing, are printed side by side.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU backend needs the cpu extra (see the README)")

from backends.common.run.ray_run import TRAIN, RealResult, layout_of, run_in_ray
from backends.common.session.ray_session import (
    node_addresses,
    placed_bundles,
    ray_session,
    remove_placement_group,
)
from backends.common.stack import CPU_STACK, Wire
from backends.common.training.hf_checkpoint import write_random_checkpoint
from backends.common.world.router import RayRouter
from miles_core.cells import CellState
from miles_core.conformance import decisions, rollout
from miles_core.engines import EngineState
from miles_core.events import (
    BucketReceived,
    CellRestartAsked,
    CellStarted,
    CellStateChanged,
    EngineExited,
    EngineGivenUp,
    EngineRecoveryAsked,
    EnginesFlushed,
    EngineStarted,
    EngineStateChanged,
    EngineSuspended,
    FaultInjected,
    FaultsHealed,
    GateArmed,
    GateReleased,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    HealEnded,
    History,
    ModelDescribed,
    OrphanRemoved,
    QuorumChanged,
    RequestRetried,
    SampleGenerated,
    StepCommitted,
    StepMetrics,
    TasksWaiting,
    UpdateAborted,
    UpdateBegan,
    UpdateGroupConnected,
    UpdateGroupMade,
    VersionPublished,
    WeightsChecked,
)
from miles_core.kinds import AbortCause, FaultKind, PauseMode, RunStatus, SampleOutcome
from miles_core.profile import MilesProfile
from miles_core.scenario.faults import RANK_FAILED, make_fault
from miles_core.scenario.liveness import Liveness
from miles_core.transfer import TransferMode
from miles_core.update_connections import ConnectReason
from sim.run import Scenario, run_scenario
from sim.scenarios import SCENARIOS, load_scenario_file
from sim.timing.run_fit import read_history
from tests.ray_cluster import session_processes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ray_cluster():
    with ray_session(num_gpus=8):
        yield


def _failed(result: RealResult) -> str:
    return "\n".join(str(v) for v in result.verdicts.values() if v)


def test_training_raises_reward_and_engines_hold_the_trainers_weights(
    ray_cluster, tmp_path: Path
) -> None:
    result = run_in_ray(TRAIN, seed=0, steps=12, timeout=600, save_to=tmp_path)
    assert result.ok, _failed(result)
    rewards = [result.step_rewards[s] for s in sorted(result.step_rewards)]
    assert len(rewards) == 12
    assert statistics.fmean(rewards[-3:]) > rewards[0] + 0.15, rewards
    # after every update each engine's weights were hashed and equal the trainer's
    checks = [e for e in result.history if isinstance(e, WeightsChecked)]
    published = [e.version for e in result.history if isinstance(e, VersionPublished)]
    assert {(c.engine, c.version) for c in checks} >= {
        (engine, v) for engine in ("engine-0", "engine-1") for v in published
    }
    assert all(c.checksum == c.trainer_checksum for c in checks)
    summary = result.summary()
    assert summary["transfer"]["updates"] == 12
    assert summary["transfer"]["bytes_per_update"] > 0
    # resume from the checkpoint: the sequence continues, engines get version 12 first
    resumed = run_in_ray(TRAIN, seed=1, steps=2, timeout=600, load_from=tmp_path)
    assert resumed.ok, _failed(resumed)
    assert resumed.report.versions == [13, 14]
    synced = [e for e in resumed.history if isinstance(e, WeightsChecked) and e.version == 12]
    assert {e.engine for e in synced} == {"engine-0", "engine-1"}
    trained = [c.trainer_checksum for c in checks if c.version == 12]
    assert {e.checksum for e in synced} == set(trained)  # the checkpoint's weights, bitwise
    assert statistics.fmean(resumed.step_rewards.values()) > rewards[0] + 0.15


def _replacement_waits() -> Scenario:
    s = load_scenario_file(
        ROOT / "scenarios" / "files" / "replacement_waits_for_the_next_update.toml"
    )
    return dataclasses.replace(s, faults=s.faults[:1], loop=dataclasses.replace(s.loop, steps=4))


def _conformance_cases() -> list[tuple[Scenario, int | None]]:
    # cells of two FSDP2 ranks: one rank raises (alive), then another dies; each time the
    # cell is failed whole, the survivor trains alone, and the cell is healed rank by rank
    ranks = load_scenario_file(ROOT / "scenarios" / "files" / "rank_faults.toml")
    # a recovery slower than the health monitor's patience, waited for in both worlds
    slow = load_scenario_file(ROOT / "scenarios" / "files" / "ft_engine_starts_slowly.toml")
    # SGLang before #31962 under retract: the first update's flushes are refused until the
    # retries run out, and the run fails with FlushTimeoutError in both worlds
    # faults set off by events and by other faults (after = {...}): the same moments in both
    after = load_scenario_file(ROOT / "scenarios" / "files" / "after_triggers.toml")
    # one control call never answered (miles #2983): fault tolerance's deadline takes the
    # engine out, in both worlds, while it still generates
    flush_hangs = load_scenario_file(ROOT / "scenarios" / "files" / "ft_flush_never_answers.toml")
    old_sglang = load_scenario_file(
        ROOT / "scenarios" / "files" / "sglang_flush_refused_while_queued.toml"
    )
    cut = load_scenario_file(ROOT / "scenarios" / "files" / "partition_mid_update.toml")
    # miles #1444: the cell that updates again after another consumed has_new_engines makes
    # its stale weight-update group afresh (real gloo groups, kept across updates)
    kept = load_scenario_file(
        ROOT / "scenarios" / "files" / "update_group_kept_across_failover.toml"
    )
    # miles #2782: a prefix cache keyed by weight version under in_place, where no flush
    # comes between updates: real KV reused only under the weights that computed it
    prefix = load_scenario_file(ROOT / "scenarios" / "files" / "prefix_cache_across_updates.toml")
    # miles #100: an actor lost, its server left running in the router; taken out by its
    # address, what it served aborted, and the engine brought back
    orphan = load_scenario_file(ROOT / "scenarios" / "files" / "orphan_engine_in_router.toml")
    # NeMo-RL #3938: a prompt past the engines' context, refused with a real 400
    over_long = load_scenario_file(ROOT / "scenarios" / "files" / "over_long_prompt.toml")
    # AReaL's staleness gate (--staleness-policy gate_submission): the producer, far ahead of
    # the trainer, is held at the gate instead of generating groups the buffer would drop
    gate = load_scenario_file(ROOT / "scenarios" / "files" / "staleness_gate_submission.toml")
    return [
        (SCENARIOS["no_failure"], None),
        (SCENARIOS["cell_crash_before_allreduce"], None),
        (SCENARIOS["crash_mid_weight_update"], None),
        (SCENARIOS["all_cells_dead"], None),
        (SCENARIOS["engine_crash_mid_generation"], None),
        (ranks, None),
        (slow, None),
        (old_sglang, None),
        (after, None),
        (flush_hangs, None),
        (kept, None),
        (prefix, None),
        (orphan, None),
        (over_long, None),
        (gate, None),
        # issue 50 item 4 (today): a hung engine published unhealthy by the checker, which
        # does nothing else; the mini FT controller suspends it (its actor killed) and resumes
        # it (a new process), which serves after the next update
        (load_scenario_file(ROOT / "scenarios" / "files" / "mini_ft_heals_a_hung_engine.toml"), 4),
        # a cut between trainers and engines mid-update: a bucket waits out the collective
        # timeout and its cell fails; the retry on the other cell waits out the rest
        (cut, None),
        # issue 50 item 8: the driver's loop dies as step 4 begins, the Ray actors up; a new
        # loop reads the state the trainer ranks hold, rolls them back, adopts the engines
        (load_scenario_file(ROOT / "scenarios" / "files" / "restart_driver_mid_run.toml"), 6),
        # the restart lands between the last bucket and the stamp (instant in the simulator,
        # seconds for real): in both worlds the update is retried and the engine synced. The
        # new process takes seconds to start here (importing torch and transformers), tens
        # of steps: the scenario's until_witnessed runs on until it serves, however long
        # that takes on this machine, and the simulator then runs as many steps
        (SCENARIOS["restart_before_stamp"], None),
        # today's miles (issue 50 items 1-2): the replacement of a killed engine is pending
        # weights until the next full update, whose window waits while it is still starting
        # (its first kill only, 4 steps: the slow start of the file's second adds 8 s)
        (_replacement_waits(), None),
        # Left out to keep CI under 15 minutes, each run for real elsewhere in this file:
        # heal_twice (two cells killed and healed: update_group_kept_across_failover kills
        # and heals the updater twice, cell_crash_before_allreduce heals a cell at its step),
        # engine_restart (a restart awaited as a step begins: the one-step-off restart test)
        # and retract_long_generations (miles' default pause mode: test_real_pause_modes,
        # paced so that updates land mid-request)
        # a collective with a hung member stalls for everyone until its timeout, then fails
        # as a whole; in both worlds the member that took no part is the one taken out (miles
        # at 31f1ca9: today's aborted window stops every participant, its own case above)
        (_aug2026(SCENARIOS["ft_engine_hangs_mid_update"]), None),
        # issue 50 item 3 (today): a stamp never answered gives up only that engine after
        # --update-weight-engine-request-timeout, and the update publishes to the other
        (_file("engine_hangs_mid_update_isolated"), 4),
        # issue 50 item 7 (today): SGLang's shared radix cache under in_place, its prompt KV
        # namespaced per train call (extra_key) as miles' --namespaced-radix-cache does
        (_file("namespaced_radix_cache"), 4),
        # marin #2374 at 1/100: the weights held 3.4 s, inside --update-weights-timeout 6 s
        (_file("trainer_restart_slower_than_weight_wait"), 4),
        # issue 50 item 6: disk-delta over real files, overwrite encoded: engine-1's delta
        # applied a second time past its check changes nothing (idempotent), in both worlds
        (_file("disk_delta_overwrite_applied_twice"), 2),
        # issue 50 item 5 (today): rank 1 of cell 0 raises holding the cell's weight-update
        # ticket lock (a real StoreTicketLock in the cell's store) and lives on; rank 0 waits
        # for it, the broadcast waits out its 5 s timeout, cell 0 fails and the update fails over
        (load_scenario_file(ROOT / "scenarios" / "files" / "field_bugs" / LOCK_FAILS_OVER), None),
    ]


LOCK_FAILS_OVER = "lock_held_fails_over.toml"


def _the_lock_holder_is_named(history: History) -> None:
    """Cell 0 is named for the broadcast it took no part in, with the lock rank 0 waited in:
    read from the cell's store, the ticket held by rank 1, which raised holding it."""
    (aborted,) = [e for e in history if isinstance(e, UpdateAborted)]
    assert aborted.component == "cell-0" and "took no part in the broadcast" in aborted.reason
    says = "rank 0 waited for cell 0's weight-update lock (process 0): ticket"
    assert says in aborted.reason and "held by rank 1, which raised holding it" in aborted.reason
    assert "injected: the rank raised holding the weight-update lock" in aborted.reason


def _file(name: str) -> Scenario:
    return load_scenario_file(ROOT / "scenarios" / "files" / f"{name}.toml")


def _aug2026(scenario: Scenario) -> Scenario:
    """The scenario under miles at 31f1ca9 (its point is that miles' behaviour)."""
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    return dataclasses.replace(scenario, loop=loop)


def _the_new_driver_adopts_the_live_actors(history: History) -> None:
    """restart_driver_mid_run: the world saw the loop die, a new one adopted the same engine
    processes (0 and 0) at version 4, the last published before the death, and went on."""
    from miles_core.events import DriverAdopted, DriverRestarted

    died = [i for i, e in enumerate(history) if isinstance(e, DriverRestarted)]
    adopted = [(i, e) for i, e in enumerate(history) if isinstance(e, DriverAdopted)]
    assert len(died) == 1 and len(adopted) == 1 and died[0] < adopted[0][0]
    event = adopted[0][1]
    assert (event.version, event.next_step, event.incarnations) == (4, 4, (0, 0))
    after = [e for e in list(history)[adopted[0][0] :] if isinstance(e, WeightsChecked)]
    assert {e.version for e in after} >= {4, 5}  # synced to the held version, then on


def _cell_shrinks_and_heals(history: History) -> None:
    quorums = [e.members for e in history if isinstance(e, QuorumChanged)]
    assert (0,) in quorums and quorums[-1] == (0, 1)
    assert [e.dst_cell for e in history if isinstance(e, HealEnded) and e.ok] == [1]


def _engine_kill_recycles_its_groups(history: History) -> None:
    down = [e for e in history if isinstance(e, EngineStateChanged) and not e.up]
    assert [e.engine for e in down] == ["engine-1"]
    recycled = [e for e in history if isinstance(e, GroupRecycled)]
    assert any(e.reason.startswith("aborted") and e.t >= down[0].t for e in recycled)


def _the_hung_member_is_blamed_after_the_collective_timeout(history: History) -> None:
    aborted = [e for e in history if isinstance(e, UpdateAborted)]
    assert [(e.component, e.cause) for e in aborted][:1] == [("engine-1", AbortCause.ENGINE)]
    # the hang reaches the actor a moment after the fault fires (a Ray call), so the first
    # broadcast it misses is bucket 1 or a later one
    assert re.fullmatch(r"took no part in the broadcast of bucket \d+: .*", aborted[0].reason)
    began = next(
        e for e in history if isinstance(e, UpdateBegan) and e.update_id == aborted[0].update_id
    )
    assert aborted[0].t - began.t >= 15.0  # the whole group waited its timeout
    down = [e.engine for e in history if isinstance(e, EngineStateChanged) and not e.up]
    assert down == ["engine-1"]


def _each_rank_fault_fails_its_cell_whole(history: History) -> None:
    stops = [
        e.reason for e in history if isinstance(e, CellStateChanged) and e.new is CellState.STOPPED
    ]
    assert len(stops) == 2 and stops[0].endswith(f"RuntimeError: {RANK_FAILED}"), stops
    assert [e.dst_cell for e in history if isinstance(e, HealEnded) and e.ok] == [1, 1]


def _the_slow_recovery_is_awaited(history: History) -> None:
    asked = [e.t for e in history if isinstance(e, EngineRecoveryAsked)]
    started = [e.t for e in history if isinstance(e, EngineStarted) and e.engine == "engine-1"]
    assert len(asked) == 1 and started[-1] - asked[0] >= 5.0  # one ask, its start waited for


def _the_stale_group_is_made_afresh(history: History) -> None:
    connects = [
        (e.updater, e.reason, dict(zip(e.engines, e.incarnations, strict=True)))
        for e in history
        if isinstance(e, UpdateGroupConnected)
    ]
    assert connects[-1] == (1, ConnectReason.STALE, {"engine-0": 1}), connects
    updates = [e for e in history if isinstance(e, UpdateBegan)]
    assert len(updates) > len(connects)  # most updates kept their cell's group
    # the world timed the making of each group it made, and of none it kept: every
    # (re)connect whose update sent a bucket made its group once, as that bucket went
    sent = {e.update_id for e in history if isinstance(e, BucketReceived)}
    made = [
        (e.update_id, e.updater, dict(zip(e.engines, e.incarnations, strict=True)))
        for e in history
        if isinstance(e, UpdateGroupMade)
    ]
    assert made == [
        (e.update_id, e.updater, dict(zip(e.engines, e.incarnations, strict=True)))
        for e in history
        if isinstance(e, UpdateGroupConnected) and e.update_id in sent
    ]
    assert all(e.seconds > 0 for e in history if isinstance(e, UpdateGroupMade))


def _the_cut_stalls_then_fails_the_sender(history: History) -> None:
    aborted = [e for e in history if isinstance(e, UpdateAborted)]
    assert [(e.component, e.cause) for e in aborted] == [("cell-0", AbortCause.CELL)], aborted
    assert "the link to the engines is cut" in aborted[0].reason
    cuts = [e for e in history if isinstance(e, FaultInjected) and e.fault is FaultKind.PARTITION]
    for cut in cuts:  # nothing that began in a window went through before it closed
        end = cut.t + (cut.duration or 0.0)
        sent = [
            b for b in history if isinstance(b, BucketReceived) and cut.t <= b.t - b.seconds < end
        ]
        assert sent and all(b.t >= end - 0.05 for b in sent), (cut, sent)


def _prompt_kv_reused_under_its_own_weights(history: History) -> None:
    reused = [e for e in history if isinstance(e, SampleGenerated) and e.cached_versions]
    assert reused, "no request started from the prefix cache"
    # a group's samples share its prompt; whether a stale group is recycled, and its
    # prompt met again, is timing (a CI run had none), so it is not asked here
    assert all(set(e.cached_versions) <= set(e.all_versions[:1]) for e in reused)


def _prompt_kv_reused_within_its_namespace(history: History) -> None:
    """A group's samples share its prompt and its train call's namespace (extra_key): the
    real cache hands one the KV another computed; none of it older than the bound allows
    (cached_kv_fresh, judged with every oracle)."""
    assert [e for e in history if isinstance(e, SampleGenerated) and e.cached_versions]


def _the_orphan_leaves_the_router(history: History) -> None:
    exited = next(e for e in history if isinstance(e, EngineExited) and e.engine == "engine-1")
    removed = [(e.engine, e.incarnation) for e in history if isinstance(e, OrphanRemoved)]
    assert removed == [("engine-1", exited.incarnation)]
    sent_after = [  # the router sent the orphan nothing once it was removed
        e
        for e in history
        if isinstance(e, SampleGenerated)
        and (e.engine, e.incarnation) == ("engine-1", exited.incarnation)
        and e.sent > exited.t
    ]
    assert sent_after == []


def _the_over_long_prompt_is_dropped(history: History) -> None:
    refused = [
        e for e in history if isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.REFUSED
    ]
    assert refused and {e.prompt_id for e in refused} == {refused[0].prompt_id}
    dropped = [e.reason for e in history if isinstance(e, GroupDropped)]
    assert dropped == ["refused"]
    assert not any(isinstance(e, EngineStateChanged) and not e.up for e in history)


def _the_gate_holds_instead_of_dropping(history: History) -> None:
    assert any(isinstance(e, GateArmed) for e in history)
    stale = [e for e in history if isinstance(e, GroupDropped | GroupRecycled)]
    assert stale == [], stale  # nothing generated only to be refused as stale
    assert sum(e.groups for e in history if isinstance(e, GateReleased)) > 0  # held, then let go


def _only_the_hung_engine_is_given_up(history: History) -> None:
    given = [e for e in history if isinstance(e, EngineGivenUp)]
    assert [(e.engine, e.incarnation, e.call) for e in given] == [("engine-1", 0, "stamp")]
    assert not [e for e in history if isinstance(e, UpdateAborted)]  # it went on without it
    published = [e for e in history if isinstance(e, VersionPublished)]
    assert any(e.update_id == given[0].update_id for e in published)


def _the_held_update_is_waited_for(history: History) -> None:
    assert not [e for e in history if isinstance(e, UpdateAborted)]
    cut = next(e for e in history if isinstance(e, FaultInjected))
    # a bucket waited out the hold, within --update-weights-timeout
    assert any(isinstance(e, BucketReceived) and e.seconds >= 3.0 and e.t > cut.t for e in history)


def _the_controller_suspends_then_resumes(history: History) -> None:
    """Today: nothing but the mini FT controller restarts the hung engine; it was suspended
    (found unhealthy by a check, or down once an update gave it up) and resumed no sooner
    than the resume delay (2 s) later, on a new process."""
    suspended = [e for e in history if isinstance(e, EngineSuspended)]
    asked = [e for e in history if isinstance(e, EngineRecoveryAsked)]
    assert [e.engine for e in suspended] == ["engine-0"] == [e.engine for e in asked]
    assert asked[0].t >= suspended[0].t + 2.0 and "FT controller" in asked[0].reason
    assert any(isinstance(e, EngineStarted) and e.t >= asked[0].t for e in history)


STORIES: dict[str, Callable[[History], None]] = {
    "mini_ft_heals_a_hung_engine": _the_controller_suspends_then_resumes,
    "staleness_gate_submission": _the_gate_holds_instead_of_dropping,
    "over_long_prompt": _the_over_long_prompt_is_dropped,
    "orphan_engine_in_router": _the_orphan_leaves_the_router,
    "prefix_cache_across_updates": _prompt_kv_reused_under_its_own_weights,
    "namespaced_radix_cache": _prompt_kv_reused_within_its_namespace,
    "partition_mid_update": _the_cut_stalls_then_fails_the_sender,
    "update_group_kept_across_failover": _the_stale_group_is_made_afresh,
    "rank_faults": _each_rank_fault_fails_its_cell_whole,
    "ft_engine_starts_slowly": _the_slow_recovery_is_awaited,
    # the survivor trains alone, then the healed cell trains on with it
    "cell_crash_before_allreduce": _cell_shrinks_and_heals,
    "restart_driver_mid_run": _the_new_driver_adopts_the_live_actors,
    "engine_crash_mid_generation": _engine_kill_recycles_its_groups,
    "ft_engine_hangs_mid_update": _the_hung_member_is_blamed_after_the_collective_timeout,
    "engine_hangs_mid_update_isolated": _only_the_hung_engine_is_given_up,
    "trainer_restart_slower_than_weight_wait": _the_held_update_is_waited_for,
    "lock_held_fails_over": _the_lock_holder_is_named,
}
"""What a scenario's real run must show on its own, beside agreeing with the simulator."""


@pytest.mark.parametrize(
    ("scenario", "steps"), _conformance_cases(), ids=lambda c: getattr(c, "name", str(c))
)
def test_conformance_with_the_simulator(ray_cluster, scenario: Scenario, steps) -> None:
    real = run_in_ray(scenario, seed=0, steps=steps, timeout=600)
    assert real.ok, _failed(real)
    sim = run_scenario(scenario, 0, _steps_run(scenario, steps, real))
    assert sim.ok
    steps_run = f"{scenario.name}, {real.report.steps_done} steps"
    print(f"\n{steps_run}: sim {rollout(sim.history)} | real {rollout(real.history)}")
    assert decisions(real.history).differences(decisions(sim.history)) == []
    # every published version reached every live engine bitwise (trainers may be sharded)
    checked = {e.version for e in real.history if isinstance(e, WeightsChecked)}
    assert set(real.report.versions) <= checked
    if scenario.name in STORIES:
        STORIES[scenario.name](real.history)


def test_a_lying_engine_is_caught_from_its_bytes_in_both_worlds(ray_cluster) -> None:
    """tokenspeed #1373 (scenarios/files/field_bugs/lying_engine.toml): engine-1 answers
    every load with success and loads nothing. The CPU engine's checksum is sha256 of its
    own tensors (tests/test_lying_engine.py), and published_weights fails in both worlds,
    naming the same engine and version; the rest of the decisions match."""
    path = ROOT / "scenarios" / "files" / "field_bugs" / "lying_engine.toml"
    scenario = load_scenario_file(path)
    real = run_in_ray(scenario, seed=0, timeout=600)
    sim = run_scenario(scenario, 0, _steps_run(scenario, None, real))
    for world in (real, sim):
        failed = {name for name, verdict in world.verdicts.items() if verdict}
        assert failed == {"published_weights"}, _failed(world) if world is real else failed
    says = "engine engine-1's weights at version 2 differ from the trainer's"
    assert says in str(real.verdicts["published_weights"])
    assert says in str(sim.verdicts["published_weights"])
    assert decisions(real.history).differences(decisions(sim.history)) == []


SHM_STACK = dataclasses.replace(CPU_STACK, wire=Wire.SHM)


def test_conformance_over_shared_memory(ray_cluster) -> None:
    """``--wire shm``, p2p (one pair group per engine, the bucket written once for all):
    the same decisions as the simulator, every version bitwise in every engine; an engine
    that dies between buckets breaks the group as it breaks gloo's."""
    killed = SCENARIOS["engine_killed_mid_update"]
    scenario = dataclasses.replace(
        killed, loop=dataclasses.replace(killed.loop, transfer_mode=TransferMode.P2P)
    )
    real = run_in_ray(scenario, seed=0, timeout=600, stack=SHM_STACK)
    assert real.ok, _failed(real)
    assert real.stack.collective_backend == "shm"
    sim = run_scenario(scenario, 0)
    assert decisions(real.history).differences(decisions(sim.history)) == []
    checked = {e.version for e in real.history if isinstance(e, WeightsChecked)}
    assert set(real.report.versions) <= checked
    assert real.summary()["transfer"]["updates"] >= len(real.report.versions)
    down = [e for e in real.history if isinstance(e, EngineStateChanged) and not e.up]
    assert [e.engine for e in down] == ["engine-1"]  # the kill broke its shm group


def _steps_run(scenario: Scenario, steps: int | None, real: RealResult) -> int | None:
    """The steps for the simulator's side: as many as the real run took where its
    until_witnessed ran it past its steps (waiting for a restarted process, which takes
    10 to 13 s here: most runs go past their steps for it, a slow one need not)."""
    if scenario.until_witnessed is None:
        return steps
    asked = steps or scenario.loop.steps
    assert real.report.steps_done >= asked
    return real.report.steps_done


def test_placement_orders_what_ray_reports(ray_cluster) -> None:
    layout = layout_of(load_scenario_file(ROOT / "scenarios" / "files" / "heal_twice.toml"))
    pg, placement = placed_bundles(layout)
    try:
        keys = [(b.node, b.gpu_id) for b in placement.bundles]
        assert keys == sorted(keys) and len(set(keys)) == layout.total_gpus
        # the address Ray reports for its (one, local) node, not a node id
        assert {b.node for b in placement.bundles} == set(node_addresses().values())
    finally:
        remove_placement_group(pg)


def test_the_gcs_keeps_no_task_events(ray_cluster) -> None:
    """Ray's task events are off in a local session (ray_session.SYSTEM_CONFIG): they grew
    the GCS 56.5 MB per 20,000 actor calls, the soak's daemons' growth. With them on, the
    GCS holds these calls' events a second after they end."""
    import ray
    from ray._private.state import state  # the GCS's own table of task events

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, x: int) -> int:
            return x

    echo = Echo.remote()
    assert ray.get([echo.echo.remote(i) for i in range(20)]) == list(range(20))
    time.sleep(2.0)  # workers report task events every second when they are on
    assert state._global_state_accessor.get_task_events() == []
    ray.kill(echo)


def test_a_real_restart_under_one_step_off_is_awaited(ray_cluster) -> None:
    """abort_one_step_off with its engine restart, for real: the new process takes seconds
    to start, so the run goes on past its 8 steps (until_witnessed, on one-step-off's
    path, where the next batch is generated before the update it waits for) until the
    new process serves. Its sync pauses it with abort while it holds no request."""
    scenario = SCENARIOS["abort_one_step_off"]
    result = run_in_ray(scenario, seed=0, timeout=600)
    assert result.ok, _failed(result)
    assert result.report.steps_done >= scenario.loop.steps
    if result.report.steps_done > scenario.loop.steps:  # the usual case: the start is slower
        assert result.report.reason.endswith("more until every fault was witnessed)")
    started = [(e.engine, e.incarnation) for e in result.history if isinstance(e, EngineStarted)]
    assert started == [("engine-1", 1)]
    samples = [e for e in result.history if isinstance(e, SampleGenerated)]
    assert not any(s.outcome is SampleOutcome.ABORTED for s in samples)


PACED = 0.01
"""Seconds per generated token in the pause-mode runs: a request lives ~40 ms, so updates
find requests in flight (the tiny policy alone takes about a millisecond a token)."""


def test_sync_mode_for_real(ray_cluster) -> None:
    """mode = sync on Ray (miles' train.py): each batch generated on the current weights,
    then trained, then the weights updated; nothing in flight while they change."""
    scenario = dataclasses.replace(TRAIN, loop=dataclasses.replace(TRAIN.loop, mode="sync"))
    result = run_in_ray(scenario, seed=0, steps=3, timeout=600)
    assert result.ok, _failed(result)
    h = result.history
    ages = [e.staleness for e in h if isinstance(e, GroupGot) and e.staleness is not None]
    assert ages and set(ages) == {0}
    begun = {e.update_id: e.t for e in h if isinstance(e, UpdateBegan) and e.publishes}
    changing = [(begun[e.update_id], e.t) for e in h if isinstance(e, VersionPublished)]
    samples = [e for e in h if isinstance(e, SampleGenerated)]
    assert changing and not [s for s in samples for a, b in changing if s.sent < b and s.t > a]


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("retract_long_generations", 6),
        ("in_place_long_generations", 6),
        ("abort_one_step_off", 6),
    ],
)
def test_real_pause_modes(ray_cluster, name: str, steps: int) -> None:
    """Each mode for real: retracted requests continue on new weights with their KV
    recomputed, frozen ones keep it, abort runs one-step-off; no update aborts a request.
    (abort_one_step_off's engine restart is left out here: its sync pauses a process with
    nothing in flight; the test above runs it.)"""
    scenario = dataclasses.replace(SCENARIOS[name], faults=())
    # the pace as the scenario's own key ([sim] engine_token_seconds), which the CPU
    # backend's engines honour as --engine-token-seconds does: without it nothing spans
    paced = dataclasses.replace(scenario.world, engine_token_seconds=PACED)
    scenario = dataclasses.replace(scenario, world=paced)
    result = run_in_ray(scenario, seed=0, steps=steps, timeout=600)
    assert result.ok, _failed(result)
    samples = [e for e in result.history if isinstance(e, SampleGenerated)]
    spanning = [s for s in samples if len(set(s.all_versions)) > 1]
    flushed = [e for e in result.history if isinstance(e, EnginesFlushed)]
    mode = scenario.loop.pause_generation_mode
    assert not any(s.outcome is SampleOutcome.ABORTED for s in samples)
    if mode is PauseMode.ABORT:  # one-step-off updates wait for the batch: nothing spans
        assert not spanning and flushed
    else:
        assert spanning, "no request was in flight at any update"
        assert all(s.kept_kv is (mode is PauseMode.IN_PLACE) for s in spanning)
        assert bool(flushed) is (mode is PauseMode.RETRACT)
    metrics = [dict(e.metrics) for e in result.history if isinstance(e, StepMetrics)]
    mixed = sum(m["rollout/fully_async/samples_on_mixed_weights"] for m in metrics)
    assert (mixed > 0) is (mode is PauseMode.IN_PLACE)


@pytest.mark.parametrize(
    "name",
    [
        "ft_every_engine_dies",  # generation waits for the recovered engines
        "every_engine_dies_without_ft",
        # the hung engine is found, killed and recovered seconds later, and the second
        # kill strikes a recovery: their scenarios' until_witnessed runs on until the
        # faults took effect and every recovered engine serves again
        "ft_engine_hangs",
        # 31f1ca9's monitor asks again for a recovery whose process died starting; today's
        # controller backs off 5 x 2^n s instead (scenarios/test_miles_health.py), past the
        # steps of a real run at 0.1 s a step
        "ft_engine_dies_during_recovery@aug2026",
    ],
)
def test_real_engine_fault_tolerance(ray_cluster, name: str) -> None:
    """With --use-fault-tolerance dead and hung engines come back with no injected restart
    and the run completes; without it, losing every engine fails clearly. Neither hangs."""
    name, _, profile = name.partition("@")
    scenario = SCENARIOS[name] if not profile else _aug2026(SCENARIOS[name])
    started = time.monotonic()
    result = run_in_ray(scenario, seed=0, timeout=300)
    assert result.ok, _failed(result)
    assert result.report.status is scenario.expect.status
    assert time.monotonic() - started < 300
    asked = [e for e in result.history if isinstance(e, EngineRecoveryAsked)]
    if scenario.loop.use_fault_tolerance:
        assert asked and result.report.steps_done >= scenario.loop.steps
        for engine in {e.engine for e in asked}:  # each recovered engine serves again
            last_asked = max(e.t for e in asked if e.engine == engine)
            assert any(
                isinstance(e, EngineStateChanged)
                and e.engine == engine
                and e.new is EngineState.SERVING
                and e.t >= last_asked
                for e in result.history
            ), f"{engine} was asked to recover at t={last_asked:g} and never served again"
    else:
        assert not asked and type(result.report.error).__name__ == "NoLiveEngineError"


def test_a_generation_error_ends_the_real_run_with_its_cause(ray_cluster, monkeypatch) -> None:
    """An exception in generation that is not an engine or router failure ends the run as a
    crash with its type and cause, at once: no hang, no lost task."""
    generate = RayRouter.generate

    async def broken(self: RayRouter, engine: str, incarnation: int, request: Any) -> Any:
        if request.group_id == 5:
            raise ZeroDivisionError("planted: a reward function divided by zero")
        return await generate(self, engine, incarnation, request)

    monkeypatch.setattr(RayRouter, "generate", broken)
    started = time.monotonic()
    result = run_in_ray(SCENARIOS["no_failure"], seed=0, timeout=120)
    assert time.monotonic() - started < 120
    assert result.report.status is RunStatus.CRASHED
    assert type(result.report.error) is ZeroDivisionError
    assert "planted: a reward function divided by zero" in result.report.reason
    assert "the run crashed: ZeroDivisionError" in str(result.verdicts["end_state"])


def test_liveness_mode_heals_a_killed_engine_for_real(ray_cluster) -> None:
    """Liveness mode on Ray: engine-1 is killed and nothing restarts it (no fault
    tolerance); as step 4 begins the heal gives it a new process, which is synced and
    serves, and the run commits its 3 steps after the heal within the bound."""
    kill = make_fault("kill_engine", engine="engine-1", point="step_begin", step=2)
    base = dataclasses.replace(SCENARIOS["no_failure"], name="killed_then_healed", faults=(kill,))
    scenario = base.with_run(steps=4).with_liveness(heal_step=4, steps=3)
    result = run_in_ray(scenario, seed=0, timeout=300)
    assert result.ok, _failed(result)
    (healed,) = [e for e in result.history if isinstance(e, FaultsHealed)]
    assert healed.step == 4
    assert any(  # the heal's new process, reported by the world as any other
        isinstance(e, EngineStarted) and e.engine == "engine-1" and e.t >= healed.t
        for e in result.history
    )
    after = [e for e in result.history if isinstance(e, StepCommitted) and e.t > healed.t]
    assert len(after) >= 3


def test_liveness_mode_finds_the_lock_a_raised_rank_holds_for_real(ray_cluster) -> None:
    """field_bugs/lock_held_by_a_raised_rank on Ray: rank 1 of cell 0 raises holding the
    real StoreTicketLock in the cell's TCPStore and lives on; nothing commits, the heal
    comes once no step has for the bound and frees nothing (the holder is alive), and the
    run stops STALLED at the bound with the wait-for graph's root at the lock, naming the
    holder and its ticket, as the simulator's does. The file's timing shrunk, heartbeats off
    (bound 12.7 s, slack 1, one step after the heal): the run ends in about 35 s, not the
    file's 5 minutes (its bound is 145 s). Under load (world start 60 s) this run once healed
    before step 0 and never stalled: the stall watch counted the start-up (schedule.py)."""
    file = load_scenario_file(
        ROOT / "scenarios" / "files" / "field_bugs" / "lock_held_by_a_raised_rank.toml"
    )
    timing = dataclasses.replace(
        file.timing, response_tokens_mean=32.0, train_step_seconds=5.0, train_jitter=0.0
    )
    loop = dataclasses.replace(file.loop, heartbeat_interval=None)
    liveness = Liveness(heal_step=4, steps=1, slack=1.0)
    scenario = dataclasses.replace(file, timing=timing, loop=loop, liveness=liveness)
    sim = run_scenario(scenario, 0)
    real = run_in_ray(scenario, seed=0, timeout=300)
    for result in (sim, real):
        assert result.report.status is RunStatus.STALLED
        assert "missed the liveness bound" in result.report.reason
        assert result.verdicts["liveness"] is not None
        assert [
            v for k, v in result.verdicts.items() if v and k not in ("liveness", "end_state")
        ] == []
        (waits,) = [e for e in result.history if isinstance(e, TasksWaiting)]
        assert "weight-update lock" in waits.root, waits.root
        assert "held by rank 1, which raised holding it" in waits.root, waits.root
        assert "stays alive (fail closed, no lease" in waits.root
        assert re.search(r"waiting: ticket \d+ \(rank 0\)", waits.root), waits.root
    assert [e.step for e in real.history if isinstance(e, FaultsHealed)] == [
        e.step for e in sim.history if isinstance(e, FaultsHealed)
    ]


def test_a_router_that_fails_at_once_is_retried_once_an_interval_for_real(ray_cluster) -> None:
    """RayRouter fails a request at once; each in-flight sample tries again once per
    --request-retry-interval (miles' _post), not in a hot loop (before, the unused-samples
    handler recycled 51,680 groups in 3 to 4 s), and the outage costs no group."""
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(base.loop, steps=6, request_retry_interval=0.5)
    outage = make_fault("fail_router", point="step_begin", step=1, duration=3.0)
    scenario = dataclasses.replace(base, name="router_outage", loop=loop, faults=(outage,))
    result = run_in_ray(scenario, seed=0, timeout=120)
    assert result.ok, _failed(result)
    (fired,) = [e for e in result.history if isinstance(e, FaultInjected)]
    retries = [e for e in result.history if isinstance(e, RequestRetried)]
    assert retries and all(fired.t <= e.sent < fired.t + 3.0 for e in retries)
    in_flight = loop.in_flight_groups * loop.n_samples_per_prompt
    assert len(retries) <= in_flight * (3.0 / 0.5 + 1), len(retries)
    sends: dict[tuple[int, int], list[float]] = {}
    for e in result.history:
        if isinstance(e, RequestRetried | SampleGenerated):
            sends.setdefault((e.group_id, e.sample), []).append(e.sent)
    for retry in retries:  # the next try (unless the run's end came first) waited the interval
        later = sends[(retry.group_id, retry.sample)][retry.attempt :]
        assert not later or later[0] - retry.t >= 0.5 - 1e-3, (retry, later)
    assert not any(
        isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.ROUTER_FAILED
        for e in result.history
    )
    assert not any(isinstance(e, GroupRecycled | GroupDropped) for e in result.history)
    last = max(e.t for e in result.history if isinstance(e, StepCommitted))
    assert last >= fired.t + 3.0  # the steps past what was queued waited out the outage


def _raising_trainer_actor(cell: int, step: int) -> Any:
    """A trainer rank of ``cell`` that raises a Python exception in ``step``, between its
    backward and the allreduce: a live process, not a death. A ``RuntimeError``, as miles'
    own tests inject (``RuntimeError("Injected failure in train")``): torch's own errors are
    RuntimeErrors too, and a rank that took one for a failed exchange would retry it."""
    import ray

    from backends.common.world.trainer import TrainerRank

    class RaisingRank(TrainerRank):
        def train(self, step_: int, *args: Any, **kwargs: Any) -> Any:
            self._raise_now = (self.cell, step_) == (cell, step)
            return super().train(step_, *args, **kwargs)

        def reduce_grads(self) -> None:
            if self._raise_now:
                raise RuntimeError("planted: the loss went NaN on this rank")

    return ray.remote(num_cpus=0, max_concurrency=4)(RaisingRank)


def test_the_ft_controller_resumes_a_killed_cell_for_real(ray_cluster) -> None:
    """miles' mini FT controller on real Ray: cell 1 dies before its exchange at step 1 and
    nothing starts it; the controller finds it stopped, waits its resume delay, the world
    creates new rank actors, and the next refresh heals the cell from cell 0."""
    scenario = SCENARIOS["ft_controller_heals_a_killed_cell"]
    loop = dataclasses.replace(
        scenario.loop,
        steps=24,
        mini_ft_controller_poll_interval=0.05,
        mini_ft_controller_resume_delay=0.1,
    )
    kill = make_fault("kill_cell", cell=1, point="before_allreduce", step=1)
    real = run_in_ray(dataclasses.replace(scenario, loop=loop, faults=(kill,)), seed=0, timeout=600)
    assert real.ok, _failed(real)
    _cell_shrinks_and_heals(real.history)
    (asked,) = [e for e in real.history if isinstance(e, CellRestartAsked)]
    assert asked.t - asked.suspended >= 0.1
    started = [e for e in real.history if isinstance(e, CellStarted) and e.cell == 1]
    assert [e.t >= asked.t for e in started] == [True]


def test_an_exception_in_one_cell_fails_that_cell_only(ray_cluster) -> None:
    """A rank that raises (not dies) is its cell's failure, and the other cells go on, as
    miles' ``RayTrainCell._execute_raw`` isolates any exception from a cell's actors
    (miles' TestPerCellErrorIsolation): the same decisions as cell_crash_before_allreduce,
    whose cell 1 dies at that point of step 2 and is healed back at step 5. (An exception
    there used to end the whole run CRASHED; then a RuntimeError was taken for a failed
    exchange, and the cell discarded its attempts until the step gave up.)"""
    killed = SCENARIOS["cell_crash_before_allreduce"]
    heal_only = tuple(f for f in killed.faults if f.kind != "kill_cell")
    assert len(heal_only) == len(killed.faults) - 1
    scenario = dataclasses.replace(killed, faults=heal_only)
    stack = dataclasses.replace(CPU_STACK, trainer_actor=_raising_trainer_actor(1, 2))
    real = run_in_ray(scenario, seed=0, timeout=600, stack=stack)
    assert real.ok, _failed(real)
    sim = run_scenario(killed, 0)
    assert decisions(real.history).differences(decisions(sim.history)) == []
    stopped = [
        e for e in real.history if isinstance(e, CellStateChanged) and e.new is CellState.STOPPED
    ]
    assert [e.cell for e in stopped] == [1]  # its stop records why, as the world said
    assert stopped[0].reason == (
        "step 2 attempt 1 errored: a rank raised in train: "
        "RuntimeError: planted: the loss went NaN on this rank"
    )


def test_a_dead_rank_refuses_its_cells_heartbeat(ray_cluster) -> None:
    """Ray refuses a call to a dead actor at once, and the cell reports that as its failure,
    which the heartbeat checker counts as a miss without waiting out its timeout (miles'
    test_rpc_error_propagates_as_unhealthy; the simulator's dead cells refuse the same way).
    A RayActorError let through would end the checker's round as a crash instead."""
    import asyncio
    from types import SimpleNamespace

    import ray

    from backends.common.world.cell import RayCell
    from miles_core.backend import CellFailure

    class Answering:
        def heartbeat(self) -> bool:
            return True

    cluster = SimpleNamespace(impaired=lambda key: False)
    cell = RayCell(cluster, 3)  # type: ignore[arg-type]  # a heartbeat reads only impaired()
    cell.ranks = [ray.remote(num_cpus=0)(Answering).remote() for _ in range(2)]
    asyncio.run(asyncio.wait_for(cell.heartbeat(), 60))  # both alive: answered
    ray.kill(cell.ranks[1])  # asynchronous: calls sent soon after may still be answered
    deadline = time.monotonic() + 60
    while True:  # so wait until Ray knows it is dead (one call was not always enough in CI)
        try:
            ray.get(cell.ranks[1].heartbeat.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "Ray never reported the killed actor dead"
        time.sleep(0.1)
    with pytest.raises(CellFailure) as refused:
        asyncio.run(asyncio.wait_for(cell.heartbeat(), 60))
    assert refused.value.args == (3, "a rank died: the heartbeat was refused")
    for rank in cell.ranks:
        ray.kill(rank)


@pytest.fixture
def ray_tmpdir():
    """A short per-run RAY_TMPDIR (Ray's socket paths must fit in 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield path
    for pid in session_processes(path):  # only after a failed test: do not leak them
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def test_cli_json_and_no_process_outlives_the_run(ray_tmpdir: Path) -> None:
    """The CLI on a checkpoint and a JSONL with miles' flags, 16 x 8 samples: more requests
    in flight than aiohttp's default pool (100), which once deadlocked the first update."""
    tmp_path = ray_tmpdir
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path)}
    files = Path(tempfile.mkdtemp(prefix="history", dir="/tmp"))
    write_random_checkpoint(files / "ckpt", "llama", hidden_size=32, layers=1, heads=2, seed=1)
    rows = [f'{{"input": "{a}+{b}=", "label": "{a + b}"}}' for a in range(4) for b in range(4)]
    (files / "train.jsonl").write_text("\n".join(rows) + "\n")
    command = [sys.executable, "-m", "backends.cpu", "run", "--steps", "2", "--json"]
    command += ["--update-weight-transfer-mode", "p2p"]  # one gloo group per engine
    command += ["--hf-checkpoint", str(files / "ckpt"), "--prompt-data", str(files / "train.jsonl")]
    command += ["--label-key", "label", "--rm-type", "math", "--rollout-batch-size", "16"]
    command += ["--n-samples-per-prompt", "8", "--plot", str(files / "curve.png")]
    history_file = files / "h.jsonl"
    command += ["--history", str(history_file)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    history = read_history(str(history_file))  # what the run saw, for sim calibrate
    assert (files / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shutil.rmtree(files)
    assert history.hash() == info["history_hash"]
    (model,) = [e for e in history if isinstance(e, ModelDescribed)]  # the real model's units
    first = min(e.update_id for e in history if isinstance(e, BucketReceived))
    to_one = [  # p2p: one delivery per engine, so the bytes one engine received
        e.nbytes
        for e in history
        if isinstance(e, BucketReceived) and e.update_id == first and "engine-0" in e.engines
    ]
    assert sum(model.unit_bytes) == sum(to_one) > 0
    assert info["steps"] == 2 and info["final_version"] == 2
    assert info["oracles"]["published_weights"] == "pass"  # p2p delivered bitwise weights
    assert set(info["oracles"].values()) == {"pass"}
    assert info["mean_reward_first"] is not None and info["transfer"]["median_gbps"] > 0
    assert session_processes(tmp_path) == []
    assert list(tmp_path.iterdir()) == []  # the session directory was removed


def test_sigterm_mid_run_leaves_no_ray_process(ray_tmpdir: Path) -> None:
    """A run stopped by SIGTERM (CI cancelled, Ctrl-\\ from a wrapper) still shuts Ray down."""
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmpdir)}
    command = [sys.executable, "-m", "backends.cpu", "run", "--steps", "50", "--json"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        # the driver, Ray's daemons and agents, and the run's actors (2 cells, 2 engines)
        while len(session_processes(ray_tmpdir)) < 8 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(session_processes(ray_tmpdir)) >= 8, "the run never started its actors"
        time.sleep(3)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 30
    while session_processes(ray_tmpdir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session_processes(ray_tmpdir) == []
