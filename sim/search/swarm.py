"""Swarm testing: each seed draws its own cluster, flags, fault mix and fault moments.

Faults happen in a fault phase (the first ~60 % of the run); a quiet phase
follows in which progress must resume (the progress oracle). Each seed draws,
for its cells and for its engines, either faults at times or faults at named
points of the control plane's work:

- cells at points: one dies before the allreduce of a step; the updater dies
  after bucket k of an update; a cell dies while it is being healed;
- engines at points: one restarts right after bucket k of an update (k is
  often the last, the window between the last bucket and the stamp); one dies
  halfway through a request; with fault tolerance, one dies or hangs as a step
  begins and nothing restarts it but the health monitor, its new process
  sometimes dying while it starts;
- at times: kills and restarts;
- impairments (a slow cell, a slow link, a delayed or failing router), each
  opening as a step begins and long enough to act on something its witness
  can see.

The budget keeps at least one cell and one engine alive: cell faults are
spaced further apart than detection plus healing takes, and every killed
component is restarted (by a fault, or by fault tolerance's recovery). A seed
may also draw miles' dynamic filter with 0/1 rewards. ``total_loss=True``
instead kills every cell and expects the run to end with NoAliveCellError.

Streams of their own (so the rest of a seed's drawing is the same either way)
draw: liveness mode (a quarter of the seeds; the heal at a step's beginning or,
a third of those, as that step's update brings a bucket), a LoRA run (a fifth;
half of them with an adapter larger than the update buffer), miles' 30 s health
checks, the control calls' round trip, the submission granularity, and an SGLang
before #31962 (a third of in_place seeds, which must pass as any; 5% of
fully-async retract seeds, which draw no faults and must end FlushTimeoutError).
"""

from __future__ import annotations

import dataclasses
import math
import random

from miles_core.buffer import UnusedHandler
from miles_core.coverage import CoverageCell
from miles_core.filters import FILTERS
from miles_core.kinds import FaultPoint, PauseMode, RunStatus, SubmissionGranularity
from miles_core.loop import LoopConfig
from miles_core.scenario import Expect, Scenario, TimeModel, WorldShape, derive_seed
from miles_core.scenario.faults import (
    HUNG_CALLS,
    After,
    AnyFault,
    AtTime,
    Partition,
    SlowLink,
    make_fault,
    target_engine,
)
from miles_core.scenario.liveness import Liveness, step_parts
from miles_core.transfer import TransferMode
from sim.search.aim import CELL, ENGINE, IMPAIRMENT, adjust, aimed_faults, family, probe_with
from sim.search.draw import Draw
from sim.search.swarm_controller import ft_controller
from sim.search.swarm_driver import restart_driver
from sim.search.swarm_field_bugs import FieldBug, field_bug
from sim.search.swarm_kill import kill_job
from sim.search.swarm_profile import miles_profile
from sim.search.swarm_staleness import staleness_policy

SWARM = "swarm"
SWARM_TOTAL_LOSS = "swarm_total_loss"


HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, HEARTBEAT_THRESHOLD = 2.0, 1.0, 3
"""The trainer heartbeat monitor of every swarm seed."""
SWARM_ENGINE_REQUEST_TIMEOUT = 5.0
"""--update-weight-engine-request-timeout in the swarm's worlds (today's profile reads it)."""


def _world_and_loop(rng: random.Random, steps: int) -> tuple[WorldShape, LoopConfig]:
    world = WorldShape(
        num_cells=rng.choice([2, 3, 4]),
        num_engines=rng.choice([1, 2, 3, 4]),
        gpus_per_node=rng.choice([1, 2, 8]),
    )
    mode = rng.choice(["fully_async", "fully_async", "one_step_off"])
    capacities = [0.5, 1.0, 2.0, 4.0] if mode == "fully_async" else [1.0, 2.0, 4.0]
    pauses = [PauseMode.RETRACT, PauseMode.IN_PLACE]  # fully_async refuses abort, as miles
    n = rng.choice([1, 2, 4])
    groups = rng.choice([None, 2, 8, 16])
    loop = LoopConfig(
        steps=steps,
        mode=mode,
        rollout_batch_size=rng.choice([2, 4, 8]),
        n_samples_per_prompt=n,
        max_weight_staleness=rng.choice([None, 0, 1, 2, 4]),
        unused_samples_handler=rng.choice(list(UnusedHandler)),
        capacity_factor=rng.choice(capacities),
        async_max_concurrent_samples=None if groups is None else groups * n,
        pause_generation_mode=rng.choice(pauses if mode == "fully_async" else list(PauseMode)),
        update_weight_buffer_size=rng.choice([8, 16, 64]) * 1024**2,
        transfer_mode=rng.choice([TransferMode.BROADCAST, TransferMode.P2P]),
        heartbeat_interval=HEARTBEAT_INTERVAL,
        heartbeat_timeout=HEARTBEAT_TIMEOUT,
        heartbeat_failure_threshold=HEARTBEAT_THRESHOLD,
        use_fault_tolerance=rng.random() < 0.5,
        rollout_health_check_interval=rng.choice([2.0, 5.0]),
        rollout_health_check_timeout=rng.choice([1.0, 3.0]),
        # today's per-call deadline at the swarm's scale (seconds, as its health timeouts;
        # miles' 300 s would outlast the progress window): no draw, so aug2026 is unchanged
        update_weight_engine_request_timeout=SWARM_ENGINE_REQUEST_TIMEOUT,
    )
    if n > 1 and rng.random() < 0.2:  # a group of one always has zero std
        loop = dataclasses.replace(loop, dynamic_sampling_filter=rng.choice(list(FILTERS)))
    return world, loop


def _cells_at_points(d: Draw, rate: float) -> None:
    for s in d.slots(d.rng.randint(0, round(2 * rate))):
        what = d.rng.choice(["before_allreduce", "after_bucket", "during_heal"])
        F = make_fault
        if what == "before_allreduce":
            cell = d.rng.randrange(d.world.num_cells)
            d.faults += [
                _cell_or_rank_fault(d, cell, s),
                F("start_cell", cell=cell, point="step_begin", step=s + 2),
            ]
        elif what == "after_bucket":  # cell 0 is the updater while it is alive
            cell = 0
            bucket = d.rng.randrange(d.n_buckets)
            d.faults += [
                F("kill_cell", cell=cell, point="after_bucket", bucket=bucket, after_step=s - 1),
                F("start_cell", cell=cell, point="step_begin", step=s + 2),
            ]
        else:  # the cell being healed dies during its heal, and is started again
            cell = d.rng.randrange(1, d.world.num_cells)
            d.faults += [
                F("kill_cell", cell=cell, point="before_allreduce", step=s),
                F("start_cell", cell=cell, point="step_begin", step=s + 1),
                F("kill_cell", cell=cell, point="during_heal", after_step=s),
                F("start_cell", cell=cell, point="step_begin", step=s + 3),
            ]
        d.killed_cells.add(cell)


def _cell_or_rank_fault(d: Draw, cell: int, step: int) -> AnyFault:
    """A cell of several ranks loses one of them half the time: a rank that dies, or one
    that raises with its process alive (miles #1443), before the exchange of ``step``."""
    ranks = d.world.gpus_per_cell
    if ranks > 1 and d.relative.random() < RANK_FAULT_SHARE:
        kind = d.relative.choice(["kill_rank", "fail_rank"])
        rank = d.relative.randrange(ranks)
        return make_fault(kind, cell=cell, rank=rank, point="before_allreduce", step=step)
    return make_fault("kill_cell", cell=cell, point="before_allreduce", step=step)


def _recovered_by_fault_tolerance(d: Draw, engine: str, step: int) -> None:
    """A death or a hang that only the health monitor undoes; a recovery may die starting."""
    kind = d.rng.choice(["kill_engine", "hang_engine"])
    patience = d.health_interval + d.health_timeout
    if kind == "hang_engine" and d.relative.random() < 0.5:  # one call hangs, not the process
        call = d.relative.choice(d.calls)
        d.faults.append(
            make_fault("hang_call", engine=engine, call=call, point="step_begin", step=step)
        )
    elif kind == "kill_engine" and patience <= 10.0 and d.relative.random() < SLOW_START_SHARE:
        # its recovery starts slower than the monitor's patience, which must wait for it
        # rather than replace the process being started; the kill follows the slow start
        slow = {"seconds": d.relative.uniform(1.5, 3.0) * patience}
        slow["duration"] = 3 * patience + d.step_seconds
        d.faults.append(
            make_fault("slow_start", engine=engine, point="step_begin", step=step, **slow)
        )
        d.faults.append(
            make_fault("kill_engine", engine=engine, after={"fault": len(d.faults) - 1})
        )
    else:
        d.faults.append(make_fault(kind, engine=engine, point="step_begin", step=step))
    # with miles' 30 s checks a recovery may come after the run's last step (seed 1814's
    # kill at step 7 of 12 was never recovered, so its during_recovery kill never fired)
    if kind == "kill_engine" and d.rng.random() < 0.5 and d.health_interval <= 5.0:
        d.faults.append(
            make_fault("kill_engine", engine=engine, point="during_recovery", after_step=step - 1)
        )


def _engines_at_points(d: Draw, rate: float) -> None:
    """A mid-generation kill strikes at the first request of its engine that gets halfway
    after its step, which may be steps later, after the restart drawn with it: without
    fault tolerance that engine may then stay down, so only one such kill is drawn (two
    could leave no engine up, a schedule no control plane survives). It is drawn only where
    a step's samples are at least the engines, so that the router, which sends each request
    to the least loaded engine, gives every engine requests (with 2 samples a step and 4
    engines, seed 5678's engine-3 drew none in 22 picks, and its kill never fired)."""
    lasting_kill = False
    spread = d.samples_per_step >= d.world.num_engines
    # with miles' 30 s health checks a dead engine stays down for several steps: a second
    # fault on it three steps later found it dead still (seed 5518's kill had no effect)
    spacing = 3 if d.health_interval <= 5.0 else 6
    for s in d.slots(d.rng.randint(0, round(2 * rate)), spacing=spacing):
        engine = f"engine-{d.rng.randrange(d.world.num_engines)}"
        if d.fault_tolerance and d.rng.random() < 0.4:
            _recovered_by_fault_tolerance(d, engine, s)
        elif d.world.num_engines > 1 and d.rng.random() < 0.4 and spread and not lasting_kill:
            lasting_kill = not d.fault_tolerance
            d.faults += [
                make_fault("kill_engine", engine=engine, point="mid_generation", after_step=s - 1),
                make_fault("restart_engine", engine=engine, point="step_begin", step=s + 2),
            ]
        else:  # the last bucket half the time: the window between buckets and stamp
            last = d.n_buckets - 1
            bucket = last if d.rng.random() < 0.5 else d.rng.randrange(d.n_buckets)
            d.faults.append(
                make_fault(
                    "restart_engine",
                    engine=engine,
                    point="after_bucket",
                    bucket=bucket,
                    after_step=s - 1,
                )
            )


def _times(d: Draw, kind_rate: float, rate: float, spacing: float = 0.0) -> list[float]:
    chosen: list[float] = []
    for _ in range(d.rng.randint(0, round(2 * kind_rate * rate))):
        t = d.rng.uniform(0.0, d.fault_phase)
        if all(abs(t - other) > spacing for other in chosen):
            chosen.append(t)
    return sorted(chosen)


def _cells_at_times(d: Draw, rate: float) -> None:
    for t in _times(d, 1.0, rate, spacing=4 * d.step_seconds):
        cell = d.rng.randrange(d.world.num_cells)
        kind = "stop_cell" if d.rng.random() < 0.25 else "kill_cell"
        later = d.rng.uniform(0.5, d.step_seconds)
        # once the control plane has stopped it: only for the cell's first kill here, since
        # any stop of the cell sets it off (seed 6148's second start followed the first stop)
        if d.relative.random() < AFTER_SHARE and cell not in d.killed_cells:
            stopped = {"event": "CellStateChanged", "cell": cell, "new": "stopped"}
            start = make_fault("start_cell", cell=cell, after=stopped | {"seconds": later})
        else:
            start = make_fault("start_cell", cell=cell, at=t + later)
        d.faults += [make_fault(kind, cell=cell, at=t), start]
        d.killed_cells.add(cell)


def _engines_at_times(d: Draw, rate: float) -> None:
    for t in _times(d, 1.0, rate, spacing=4 * d.step_seconds):
        engine = f"engine-{d.rng.randrange(d.world.num_engines)}"
        lone = d.world.num_engines == 1 and not d.fault_tolerance  # a kill would end the run
        if lone or d.rng.random() < 0.5:
            # the new process starts slowly; only with fault tolerance, since without it a
            # run whose every engine is down fails, as miles' does (seeds 62 and 239: a lone
            # engine's slow restart ended them with NoLiveEngineError)
            if d.fault_tolerance and d.relative.random() < SLOW_START_SHARE:
                seconds = d.relative.uniform(1.0, 3.0) * d.step_seconds
                slow = {"seconds": seconds, "duration": d.step_seconds}
                d.faults.append(make_fault("slow_start", engine=engine, at=t, **slow))
                index = len(d.faults) - 1
                d.faults.append(make_fault("restart_engine", engine=engine, after={"fault": index}))
                continue
            d.faults.append(make_fault("restart_engine", engine=engine, at=t))
        else:
            later = d.rng.uniform(1.0, d.step_seconds)
            if d.relative.random() < AFTER_SHARE:  # after its process exited
                exited = {"event": "EngineExited", "engine": engine, "seconds": later}
                restart = make_fault("restart_engine", engine=engine, after=exited)
            else:
                restart = make_fault("restart_engine", engine=engine, at=t + later)
            d.faults += [make_fault("kill_engine", engine=engine, at=t), restart]


def _unstruck_engines(d: Draw) -> list[str]:
    """The engines no fault drawn so far strikes."""
    struck = {getattr(f, "engine", None) for f in d.faults}
    return [e for e in d.world.engine_ids if e not in struck]


ORPHAN_SHARE = 0.25
"""The share of fault-tolerance seeds with faults that lose an engine's actor, its server
left running in the router (orphan_engine, miles #100)."""


def _orphan(seed: int, d: Draw) -> None:
    """An orphan, from a stream of its own, as a step begins in the fault phase: only with
    fault tolerance, which brings the engine back with a new process (without it the
    engine stays down, and with one engine the run would end), and only on an engine no
    other fault strikes (seed 77's hang_call found the orphan's engine still starting
    again, with no process to hang)."""
    stream = random.Random(derive_seed(seed, "swarm.orphan"))
    if not d.fault_tolerance or stream.random() >= ORPHAN_SHARE:
        return
    if d.health_interval > 5.0:  # miles' 30 s checks: its recovery may come after the end
        return  # (seed 5915's orphan at step 7 of 12 was never brought back)
    free = _unstruck_engines(d)
    if not free:
        return
    step = stream.randint(1, max(1, round(0.6 * d.steps)))
    engine = stream.choice(free)
    d.faults.append(make_fault("orphan_engine", engine=engine, point="step_begin", step=step))


HUNG_MID_UPDATE_SHARE = 0.5
"""The share of eligible fault-tolerance seeds whose engine hangs between two buckets of
a broadcast, with the collective timeout at HUNG_COLLECTIVE_TIMEOUT."""
HUNG_COLLECTIVE_TIMEOUT = 15.0
"""Seconds a broadcast waits for a member that takes no part (miles' default is 30 min)."""


def _hung_mid_update(seed: int, d: Draw, loop: LoopConfig) -> LoopConfig:
    """An engine that hangs right after bucket 0 of an update, from a stream of its own:
    bucket 1's broadcast stalls every member until the collective timeout, then fails as a
    whole and names the member that took no part (ft_engine_hangs_mid_update's story, the
    probe collective_stalled_by_hung_member). Only with fault tolerance (the engine is
    taken out and recovered), broadcast (a p2p send stalls its own link only), two buckets
    or more, two engines or more, and on an engine no other fault strikes."""
    stream = random.Random(derive_seed(seed, "swarm.hung_mid_update"))
    eligible = (
        d.fault_tolerance
        and loop.transfer_mode is TransferMode.BROADCAST
        and d.n_buckets > 1
        and d.world.num_engines > 1
        and d.health_interval <= 5.0
    )
    if not eligible or stream.random() >= HUNG_MID_UPDATE_SHARE:
        return loop
    free = _unstruck_engines(d)
    if not free:
        return loop
    step = stream.randint(1, max(1, round(0.5 * d.steps)))
    hang = {"point": "after_bucket", "bucket": 0, "after_step": step - 1}
    d.faults.append(make_fault("hang_engine", engine=stream.choice(free), **hang))
    return dataclasses.replace(loop, update_weight_collective_timeout=HUNG_COLLECTIVE_TIMEOUT)


POISON_SHARE = 0.15
"""The share of seeds with faults whose data set has one over-long prompt (poison_prompt)."""


def _poison(seed: int, d: Draw) -> None:
    """One prompt longer than the engines' context, asked for after a step in the fault
    phase begins, from a stream of its own (NeMo-RL #3938)."""
    stream = random.Random(derive_seed(seed, "swarm.poison"))
    if stream.random() < POISON_SHARE:
        step = stream.randint(1, max(1, round(0.6 * d.steps)))
        d.faults.append(make_fault("poison_prompt", point="step_begin", step=step))


def _impairments(d: Draw, rate: float, forced: str | None = None) -> None:
    """At most one window of each kind, each opening as a step begins (so that it has a
    step, an update or requests to act on) on a step of its own, long enough for them."""
    rng, step = d.rng, d.step_seconds
    starts = d.slots(4, spacing=3)  # apart, so that one window does not delay another's
    rng.shuffle(starts)
    spared = [c for c in range(d.world.num_cells) if c not in d.killed_cells]
    kinds: list[tuple[str, dict[str, object]]] = []
    if spared and (rng.random() < 0.35 * rate or forced == "slow_cell"):
        slow = {"cell": rng.choice(spared), "factor": rng.uniform(1.5, 5)}
        kinds.append(("slow_cell", slow | {"duration": rng.uniform(1.5, 3) * step}))
    # not over updates that take seconds already: a bucket keeps the pace it began with,
    # so one begun in the window outlasts a liveness heal by minutes (seed 7268 --liveness:
    # 7 s x 58 held the healed run past its bound)
    if (rng.random() < 0.35 * rate and not d.slow_updates) or forced == "slow_link":
        # open long enough for the step's training (even retried) and the update after it
        slow = {"factor": rng.uniform(1.5, 100), "duration": rng.uniform(4, 6) * step}
        kinds.append(("slow_link", slow))
    # a lone engine that a fault takes away leaves the router nothing to act on
    lone = d.world.num_engines == 1 and any(target_engine(f) for f in d.faults)
    if not lone and (rng.random() < 0.35 * rate or forced == "delay_router"):
        delay = {"seconds": rng.uniform(0.5, 3), "duration": rng.uniform(1, 2) * step}
        kinds.append(("delay_router", delay))
    if not lone and (rng.random() < 0.25 * rate or forced == "fail_router"):
        kinds.append(("fail_router", {"duration": rng.uniform(1, 2) * step}))
    if forced == "partition":  # drawn on its own stream otherwise (_partition)
        kinds.append(("partition", {"duration": rng.uniform(1, 3) * step}))
    for (kind, keys), s in zip(kinds, starts, strict=False):
        d.faults.append(make_fault(kind, point="step_begin", step=s, **keys))


def _update_calls(loop: LoopConfig) -> tuple[str, ...]:
    """The control calls every update makes to each engine: miles flushes unless in_place."""
    if loop.pause_generation_mode is PauseMode.IN_PLACE:
        return tuple(c for c in HUNG_CALLS if c != "flush_cache")
    return HUNG_CALLS


ROUND_TRIP_SHARE = 0.5
"""The share of seeds with no other cell fault whose updater goes away and comes back twice."""


def _updater_round_trip(seed: int, d: Draw) -> None:
    """The updater (cell 0) dies, comes back, an engine restarts, and it dies again: the
    update moves to another cell and back, then to that cell again with an engine process
    new since its group was made (the sequence miles #1444 is about). From a stream of its
    own; only in a seed with no other cell fault (two cells down at once is a total loss)."""
    stream = random.Random(derive_seed(seed, "swarm.round_trip"))
    if d.killed_cells or d.steps < 9 or stream.random() >= ROUND_TRIP_SHARE:
        return
    s = stream.randint(1, d.steps - 8)
    engine = f"engine-{stream.randrange(d.world.num_engines)}"
    F = make_fault
    motif = [
        F("kill_cell", cell=0, point="step_begin", step=s),
        F("start_cell", cell=0, point="step_begin", step=s + 2),
        F("restart_engine", engine=engine, point="step_begin", step=s + 3),
        F("kill_cell", cell=0, point="step_begin", step=s + 5),
        F("start_cell", cell=0, point="step_begin", step=s + 7),
    ]
    if any(f in d.faults for f in motif):  # the same fault twice is an error
        return
    d.faults += motif
    d.killed_cells.add(0)


def _lost_heartbeats(d: Draw, rate: float) -> None:
    """A healthy cell whose heartbeats are lost for longer than detection takes (misses x
    interval + timeout): declared dead and stopped, a false positive, then started again.
    Only in a seed with no other cell fault (two cells gone at once is a total loss) and on
    a step of its own."""
    if d.killed_cells or d.rng.random() >= 0.3 * rate:
        return
    slots = d.slots(1, spacing=3)
    if not slots:
        return
    detection = HEARTBEAT_INTERVAL * HEARTBEAT_THRESHOLD + HEARTBEAT_TIMEOUT
    cell, s = d.rng.randrange(d.world.num_cells), slots[0]
    lost = {"cell": cell, "duration": d.rng.uniform(1.5, 2) * detection}
    d.faults += [
        make_fault("drop_heartbeat", point="step_begin", step=s, **lost),
        make_fault("start_cell", cell=cell, point="step_begin", step=s + 3),
    ]
    d.killed_cells.add(cell)


def _ordered(faults: list[AnyFault]) -> tuple[AnyFault, ...]:
    """Faults at points in the order drawn (step order), then faults at times by time, then
    faults after an event or another fault in the order drawn. ``after = {fault = N}`` is
    drawn with N the position in ``faults`` and renumbered to the fault's new place."""
    drawn = range(len(faults))
    timed = sorted(
        (i for i in drawn if isinstance(faults[i].when, AtTime)), key=lambda i: faults[i].when.at
    )  # type: ignore[union-attr]
    after = [i for i in drawn if isinstance(faults[i].when, After)]
    points = [i for i in drawn if faults[i].point is not None and i not in after]
    order = [*points, *timed, *after]
    place = {old: new for new, old in enumerate(order)}
    return tuple(_renumbered(faults[i], place) for i in order)


def _renumbered(fault: AnyFault, place: dict[int, int]) -> AnyFault:
    when = fault.when
    if not isinstance(when, After) or when.fault is None:
        return fault
    return dataclasses.replace(fault, when=dataclasses.replace(when, fault=place[when.fault]))


CONTROL_REPLIES = (0.0, 0.002, 0.01, 0.05)
"""An engine control call's round trip, drawn per seed: with 0 the update's pause and stamp
answer at once, as before; otherwise a fault at a time can strike between an update's
start and its first bucket, or its last bucket and the stamp."""


AIMED_PAUSE_REPLY_SECONDS = 0.25
"""The control reply time of a seed whose mid-generation kill is aimed at ``paused``: a
request must get halfway inside the pause's round trip, which 0.05 s let 5 of seeds 0-59 do
(0.25 s: 41 of seeds 0-149, 0.5 s: 52; 1 s, the swarm's health check timeout, fails runs
whose engines then never answer a control call in time)."""


def _control_reply(seed: int, aim: CoverageCell | None) -> float:
    """From a stream of its own, so the rest of the drawing is the same for either value;
    an aim at a window that only control calls open gets a reply time that opens it, and a
    mid-generation kill aimed at ``paused`` one a request can get halfway inside."""
    reply = random.Random(derive_seed(seed, "swarm.control")).choice(CONTROL_REPLIES)
    if aim is not None and aim.phase in ("paused", "stamping") and reply == 0.0:
        reply = CONTROL_REPLIES[-1]
    if aim is not None and aim.phase == "paused" and aim.how == "mid_generation":
        reply = AIMED_PAUSE_REPLY_SECONDS
    return reply


def _granularity(seed: int, loop: LoopConfig) -> SubmissionGranularity | None:
    """--rollout-submission-granularity, from a stream of its own (the rest of the drawing
    is the same for either): miles' fully-async default, sample, two times in three where
    the buffer holds the producer's whole budget, else group. With a budget the buffer
    cannot hold, sample backfill runs ahead by many groups, all finished and blocked, and
    then submits nothing for steps (as miles' worker loop would: seed 288 had 24 groups
    blocked before a buffer of one), so a router window drawn there has no request to act
    on and fault_witness fails without a control bug (4 of 1,000 seeds)."""
    stream = random.Random(derive_seed(seed, "swarm.submission"))
    drawn = stream.choice([SubmissionGranularity.SAMPLE] * 2 + [SubmissionGranularity.GROUP])
    if loop.mode != "fully_async":
        return None  # one_step_off submits its shortfall at once: nothing to pace
    if loop.in_flight_groups > loop.buffer_config().capacity:
        return SubmissionGranularity.GROUP
    return drawn


AIMED_HEAL_SECONDS = 2.0
"""How long a heal lasts in a seed whose mid-generation kill is aimed at ``healing`` (about
a request's decode): at the swarm's own checkpoint rate a heal takes about 0.1 s, and a
request got halfway inside one in 5 of seeds 0-39 (17 with this alone)."""


def _checkpoint_rate(world: WorldShape, aim: CoverageCell | None) -> float:
    """The default rate, or for a mid-generation kill aimed at ``healing`` one slow enough
    for the heal (the weights and two optimizer moments) to last AIMED_HEAL_SECONDS. Only
    there: other aims hit ``healing`` at the default, and a slower heal moves their draws'
    timing (restart_engine@at_time:healing seed 0 then drew a router delay no request saw)."""
    if aim is None or aim.phase != "healing" or aim.how != "mid_generation":
        return TimeModel.checkpoint_bytes_per_second
    return 3 * world.param_bytes / AIMED_HEAL_SECONDS


def _miles_health_checks(seed: int, loop: LoopConfig) -> LoopConfig:
    """With fault tolerance, miles' own health-check settings (30 s interval and timeout) in
    a third of the seeds, from a stream of their own: against 5 s steps an update then often
    reaches a hung engine before the monitor's next check, and only the update's deadline
    on each control call (the monitor is paused through it) gets past it."""
    stream = random.Random(derive_seed(seed, "swarm.health"))
    if not loop.use_fault_tolerance or stream.random() >= 1 / 3:
        return loop
    return dataclasses.replace(
        loop, rollout_health_check_interval=30.0, rollout_health_check_timeout=30.0
    )


def _node_addresses(seed: int) -> str:
    """How the seed's nodes are named, from a stream of its own: IPv4 half the time, else
    IPv6, hostnames or a mix (the placement oracle holds their order to the rule)."""
    stream = random.Random(derive_seed(seed, "swarm.nodes"))
    return stream.choice(["ipv4", "ipv4", "ipv4", "ipv6", "hostnames", "mixed"])


LORA_SHARE = 0.2
"""The share of seeds that train and push only a LoRA adapter."""

TOKEN_PACE_SHARE = 0.2
"""The share of seeds whose engines keep a token pace ([sim] engine_token_seconds)."""


def _token_pace(seed: int, world: WorldShape) -> WorldShape:
    """The engines' token pace, from a stream of its own: in a fifth of the seeds a floor
    of 0.02 s a token (twice the simulator's decode time), so requests live across more
    updates."""
    stream = random.Random(derive_seed(seed, "swarm.pace"))
    if stream.random() >= TOKEN_PACE_SHARE:
        return world
    return dataclasses.replace(world, engine_token_seconds=0.02)


def _lora(seed: int, loop: LoopConfig) -> LoopConfig:
    """A LoRA run (--lora-adapter), from a stream of its own: the adapter is one atomic
    update unit, unloaded then loaded; in half of them the update buffer is 64 KiB, smaller
    than the adapter (1 MiB), so the unit is larger than a bucket and goes alone."""
    stream = random.Random(derive_seed(seed, "swarm.lora"))
    if stream.random() >= LORA_SHARE:
        return loop
    small = stream.random() < 0.5
    buffer = 64 * 1024 if small else loop.update_weight_buffer_size
    return dataclasses.replace(loop, lora_adapter="policy", update_weight_buffer_size=buffer)


SLOW_UPDATE_SHARE = 0.15
"""The share of fault-tolerance seeds (health timeout up to 3 s) whose weight updates keep
the engines paused longer than the health check's timeout."""


def _slow_updates(seed: int, world: WorldShape, loop: LoopConfig) -> dict[str, float]:
    """Link rates (between nodes and within one) that make a weight update last 1.5 to 3
    health-check timeouts, from a stream of their own: a /health_generate is a request,
    which a paused engine does not schedule, so only a monitor paused around updates (as
    miles pauses it) leaves the healthy engines alone."""
    stream = random.Random(derive_seed(seed, "swarm.slow_updates"))
    timeout = loop.rollout_health_check_timeout
    if not loop.use_fault_tolerance or timeout > 3.0 or stream.random() >= SLOW_UPDATE_SHARE:
        return {}
    seconds = stream.uniform(1.5, 3.0) * timeout
    rate = world.param_bytes * max(1, world.num_engines) / seconds
    return {"link_bytes_per_second": rate, "nvlink_bytes_per_second": rate}


def _slowest_update(world: WorldShape, timing: TimeModel, faults: list[AnyFault]) -> float:
    """An update's wire time, as slow as the slowest slow_link drawn makes it (with the
    default links a few milliseconds; with slow updates seconds, and a slow_link of 58x on
    seed 386 held one for 448 s, past the window of 60 s), and held by the longest cut."""
    rate = min(timing.link_bytes_per_second, timing.nvlink_bytes_per_second)
    factor = max((f.factor for f in faults if isinstance(f, SlowLink)), default=1.0)
    cut = max((f.duration for f in faults if isinstance(f, Partition)), default=0.0)
    return world.param_bytes * max(1, world.num_engines) / rate * factor + cut


PARTITION_SHARE = 0.15
"""The share of seeds with faults whose trainers and engines are cut apart once."""


def _partition(seed: int, d: Draw) -> None:
    """A cut between the trainers and the engines, from a stream of its own (the rest of the
    drawing stays as it was): opening as a step begins, for one to three steps, shorter
    than the collective timeout (miles' 30 min), so an update under it waits, then goes on."""
    stream = random.Random(derive_seed(seed, "swarm.partition"))
    if stream.random() >= PARTITION_SHARE:
        return
    step = stream.randint(1, max(1, min(int(0.6 * d.steps), d.steps - 4)))
    duration = stream.uniform(1, 3) * d.step_seconds
    d.faults.append(make_fault("partition", point="step_begin", step=step, duration=duration))


AFTER_SHARE = 0.5
"""The share of timed kills whose start or restart follows by event (``after``), not time."""

RANK_FAULT_SHARE = 0.5
"""The share of a multi-rank cell's kills before the exchange that strike one rank."""

RANKS_PER_CELL, RANKS_PER_ENGINE = (1, 1, 2), (1, 1, 1, 2)
"""GPUs per cell and per engine, drawn per seed from a stream of their own (a cell of two
is sharded by FSDP2 on the CPU backend; an engine of two may land across two nodes)."""


def _gpus_per_part(seed: int, world: WorldShape) -> WorldShape:
    stream = random.Random(derive_seed(seed, "swarm.ranks"))
    cell, engine = stream.choice(RANKS_PER_CELL), stream.choice(RANKS_PER_ENGINE)
    return dataclasses.replace(world, gpus_per_cell=cell, gpus_per_engine=engine)


SLOW_START_SHARE = 0.4
"""The share of fault-tolerance engine kills (monitor patience up to 10 s) whose recovery
starts slower than the patience, and of timed restarts whose new process starts slowly
(a slow_start, the kill or restart set off by it: ``after = {fault = N}``)."""

OLD_SGLANG_SHARE = 0.05
"""The share of fully-async retract seeds whose engines run an SGLang before #31962."""


def _old_sglang(seed: int, world: WorldShape, loop: LoopConfig) -> tuple[WorldShape, bool]:
    """SGLang before #31962 (a flush refused while any request waits), from a stream of its
    own. Under fully-async retract, miles flushes after a pause that put every request in
    flight back in the queue: each flush is refused until --flush-cache-max-retries run
    out, and the run must end with FlushTimeoutError at its first update (miles #1497,
    #1750), refusals paced and recorded; such a seed draws no faults and is judged on that
    ending (True). Under in_place, where miles never flushes, a third of the seeds run it
    and must pass as any other."""
    stream = random.Random(derive_seed(seed, "swarm.sglang"))
    draw = stream.random()
    if loop.pause_generation_mode is PauseMode.IN_PLACE and draw < 1 / 3:
        return dataclasses.replace(world, flush_refuses_while_queued=True), False
    retract = loop.mode == "fully_async" and loop.pause_generation_mode is PauseMode.RETRACT
    if retract and draw < OLD_SGLANG_SHARE:
        return dataclasses.replace(world, flush_refuses_while_queued=True), True
    return world, False


PREFIX_CACHE_SHARE = 0.5
"""The share of seeds whose engines keep a prefix cache."""


def _prefix_cache(seed: int, world: WorldShape, loop: LoopConfig) -> WorldShape:
    """The engines' prefix cache, from a stream of its own: half the seeds keep one, keyed
    by weight version or shared as SGLang's radix cache. Shared only where every update
    flushes it (not in_place): under in_place it hands prompts KV from weights the
    staleness filter never sees, and a correct control plane still fails cached_kv_fresh
    (scenarios/files/prefix_cache_across_updates.toml), so the swarm would judge the
    world, not the loop."""
    stream = random.Random(derive_seed(seed, "swarm.prefix"))
    if stream.random() >= PREFIX_CACHE_SHARE:
        return world
    shared = stream.random() < 0.5 and loop.pause_generation_mode is not PauseMode.IN_PLACE
    return dataclasses.replace(world, prefix_cache="shared" if shared else "by_version")


def _paced_rollout(world: WorldShape, timing: TimeModel, loop: LoopConfig) -> float:
    """A step's generation at the engines' token pace, in waves of the in-flight cap: the
    progress window's room for it where a pace is drawn (seed 6981: 32 samples 8 at a time
    at 0.02 s a token, and the window of 8 train steps was 2 s short)."""
    if not world.engine_token_seconds:
        return 0.0
    samples = loop.rollout_batch_size * loop.n_samples_per_prompt
    waves = math.ceil(samples / (loop.async_max_concurrent_samples or samples))
    return waves * step_parts(world, timing, loop)["rollout"]


def _detection(loop: LoopConfig) -> float:
    """How long a hung engine may hold a step with fault tolerance: an update's call waits
    out the health check's timeout, then the monitor's next check and its timeout."""
    if not loop.use_fault_tolerance:
        return 0.0
    return 2 * (loop.rollout_health_check_interval + loop.rollout_health_check_timeout)


LIVENESS_SHARE = 0.25
"""The share of seeds the swarm runs in liveness mode (``--liveness``: all of them)."""
HEAL_MID_UPDATE_SHARE = 1 / 3
"""The share of liveness seeds whose heal strikes mid-update (after_bucket)."""


def _liveness(seed: int, steps: int, forced: bool | None) -> Liveness | None:
    """Liveness mode, from a stream of its own (the rest of the drawing is the same either
    way): in a quarter of the seeds, or in all with ``forced``; the heal as a step from a
    third of the run to its end begins, so the faults last a drawn span; in a third of
    them the heal strikes as that step's update brings its first bucket instead (a heal
    while an update is in flight)."""
    stream = random.Random(derive_seed(seed, "swarm.liveness"))
    drawn = stream.random() < LIVENESS_SHARE
    heal_step = stream.randint(max(1, steps // 3), steps)
    mid_update = stream.random() < HEAL_MID_UPDATE_SHARE
    if not (drawn if forced is None else forced):
        return None
    point = FaultPoint.AFTER_BUCKET if mid_update else FaultPoint.STEP_BEGIN
    return Liveness(heal_step=heal_step, steps=3, heal_point=point)


def swarm_scenario(
    seed: int,
    steps: int = 12,
    total_loss: bool = False,
    aim: CoverageCell | None = None,
    liveness: bool | None = None,
) -> Scenario:
    """The scenario that ``seed`` draws (the run itself then uses the same seed); ``aim``
    puts one fault in that cell of the coverage map (sim/search/aim.py); ``liveness``: in
    liveness mode or not (None: as the seed draws)."""
    rng = random.Random(derive_seed(seed, "swarm"))
    world, loop = _world_and_loop(rng, steps)
    world = _gpus_per_part(seed, world)
    loop = dataclasses.replace(loop, rollout_submission_granularity=_granularity(seed, loop))
    loop = _miles_health_checks(seed, _lora(seed, loop))
    if aim is not None:
        world, loop = adjust(aim, world, loop)
    world = _token_pace(seed, _prefix_cache(seed, world, loop))
    # 0/1 rewards give the filter work: a group of 2 is all equal half the time, so a step
    # may wait for twice the generation; the progress window makes room for that
    filtered = loop.dynamic_sampling_filter is not None
    timing = TimeModel(
        node_addresses=_node_addresses(seed),
        reward_success_rate=0.5 if filtered else None,
        control_reply_seconds=_control_reply(seed, aim),
        checkpoint_bytes_per_second=_checkpoint_rate(world, aim),
        **_slow_updates(seed, world, loop),
    )
    step_seconds = timing.train_step_seconds + timing.allreduce_seconds + 1.0
    shape = Scenario(SWARM, world=world, loop=loop)
    phase = 0.6 * steps * step_seconds
    d = Draw(
        rng,
        world,
        steps,
        shape.n_buckets,
        step_seconds,
        phase,
        [],
        set(),
        loop.use_fault_tolerance,
        loop.rollout_batch_size * loop.n_samples_per_prompt,
        loop.rollout_health_check_interval,
        _update_calls(loop),
        random.Random(derive_seed(seed, "swarm.after")),
        loop.rollout_health_check_timeout,
        timing.link_bytes_per_second < TimeModel().link_bytes_per_second,
    )
    drawn = aim is None and not total_loss and liveness is not True  # liveness: no failure
    world, refused = _old_sglang(seed, world, loop) if drawn else (world, False)
    if refused:
        # a buffer that holds the producer's whole budget keeps requests in flight at the
        # first update (with 0.5, seed 3022's producer sat blocked, nothing was queued, and
        # the flush went through)
        loop = dataclasses.replace(loop, capacity_factor=4.0)
        expect = Expect(RunStatus.FAILED, "FlushTimeoutError")
        why = "SGLang before #31962 under fully-async retract: the first update's flush is refused"
        return Scenario(SWARM, why, world, timing, loop, (), expect)
    if total_loss:
        t = rng.uniform(0.1, 0.5) * d.fault_phase
        faults = [make_fault("kill_cell", cell=c, at=t + c * 0.1) for c in range(world.num_cells)]
        expect = Expect(RunStatus.FAILED, "NoAliveCellError")
        return Scenario(
            SWARM_TOTAL_LOSS, "every cell dies", world, timing, loop, tuple(faults), expect
        )
    rate = rng.choice([0.5, 1.0, 2.0])  # faults per kind in the fault phase, on average
    aimed = family(aim)
    cells = _cells_at_points if rng.random() < 0.5 else _cells_at_times
    if aimed != CELL:
        cells(d, rate)
    engines = _engines_at_points if rng.random() < 0.5 else _engines_at_times
    if aimed != ENGINE:
        engines(d, rate)
    if aimed is None:
        _updater_round_trip(seed, d)
    if aimed != ENGINE:
        _orphan(seed, d)
    if aimed is None:
        _poison(seed, d)
        loop = _hung_mid_update(seed, d, loop)
    hung = loop.update_weight_collective_timeout == HUNG_COLLECTIVE_TIMEOUT
    stall = 2 * HUNG_COLLECTIVE_TIMEOUT if hung else 0.0  # the stall, and its retry's sync
    _impairments(d, rate, forced=aim.kind if aim is not None and aimed == IMPAIRMENT else None)
    if aimed != IMPAIRMENT:
        _partition(seed, d)
    if aimed != CELL:
        _lost_heartbeats(d, rate)
    if aim is not None and aimed in (CELL, ENGINE):  # last: a probe sees every other fault
        run = probe_with(dataclasses.replace(shape, timing=timing), seed)
        d.faults += aimed_faults(d, aim, lambda faults: run(_ordered(faults)))
    live = _liveness(seed, steps, liveness)
    restart = 0.0
    if aim is None and live is None:  # the whole job killed once (sim/search/swarm_kill.py)
        shape_of = (d.n_buckets, step_seconds)
        loop, d.faults, restart = kill_job(seed, loop, world, timing, shape_of, d.faults)
    comeback = 0.0
    if aim is None and live is None and not restart:  # the FT controller brings cells back
        loop, d.faults, comeback = ft_controller(seed, loop, world, d.faults)
    loop = staleness_policy(seed, loop)
    loop = miles_profile(seed, loop, world.num_engines, world.num_cells, d.faults)
    adoption = 0.0
    if aim is None and live is None and not restart:  # a new driver adopts the processes
        d.faults, adoption = restart_driver(seed, loop, (d.n_buckets, step_seconds), d.faults)
    bug = FieldBug(loop, d.faults)
    if aim is None and live is None and not restart and not adoption:  # an oracle's catch
        bug = field_bug(seed, loop, world, steps, d.faults)
        loop, d.faults = bug.loop, bug.faults
    description = f"{len(d.faults)} faults drawn by seed {seed}"
    return Scenario(
        SWARM,
        description,
        world,
        timing,
        loop,
        _ordered(d.faults),
        progress_window=(24 if filtered else 8) * step_seconds
        + _detection(loop)
        + _paced_rollout(world, timing, loop)
        + _slowest_update(world, timing, d.faults)
        + stall
        + restart
        + comeback
        + adoption
        + bug.seconds,
        liveness=live,
        expect=bug.expect,
    )
