"""Rare-state probes: named moments that matter, counted from a history alone.

A sweep that passes says little if its runs never reached the states where
control bugs live (FoundationDB's and Antithesis' "sometimes assertions"). A
probe names one such state and is hit when a history shows it; any world's
history is read the same way, so a real run counts too. ``sim sweep`` reports
how many seeds hit each probe and the ones none hit; ``--require-probes`` fails
a sweep that missed one of the CORE set (what CI's sweep must reach).

Every probe reads only recorded events, through one walk over the history
(``_Walk``): what was under way (updates), which engines were
alive or hung, which buckets had arrived, which engines were stamped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from miles_core.backend import LINK_CUT
from miles_core.engines import EngineState
from miles_core.events import (
    AttemptBegan,
    BucketReceived,
    CellRestartAsked,
    CellStarted,
    DriverAdopted,
    EngineExited,
    EngineGivenUp,
    EngineHealthFailed,
    EngineRecoveryAsked,
    EnginesResumed,
    EngineStamped,
    EngineStarted,
    EngineStateChanged,
    EngineSuspended,
    Event,
    FaultInjected,
    FaultsHealed,
    FlushRefused,
    GroupDropped,
    GroupRecycled,
    HealBegan,
    HealEnded,
    HeartbeatMissed,
    JobKilled,
    JobResumed,
    OrphanRemoved,
    ParticipantsStopped,
    PlacementMade,
    RequestRetried,
    RunStarted,
    SampleGenerated,
    StepCommitted,
    UpdateAborted,
    UpdateBegan,
    UpdateGroupConnected,
    UpdateWindowWaiting,
    VersionPublished,
)
from miles_core.kinds import AbortCause, FaultKind, SampleOutcome
from miles_core.oracles.placement import order_key
from miles_core.update_connections import ConnectReason
from miles_core.weight_update import UpdateKind


@dataclass
class _Update:
    """One update under way: its engines, whether its last bucket arrived, who is stamped."""

    engines: frozenset[str]
    n_buckets: int
    last_arrived: bool = False
    stamped: set[str] = field(default_factory=set)


@dataclass
class _Walk:
    """What was under way at a moment of the history (updated after the probes saw it)."""

    num_cells: int = 0
    alive: set[str] = field(default_factory=set)
    incarnation: dict[str, int] = field(default_factory=dict)
    hung: dict[str, int] = field(default_factory=dict)
    """Engine -> the process a hang (of the process, or of one call) struck, until a later
    process of it is stamped: an update aborted on one is an update a hang held."""
    updates: dict[int, _Update] = field(default_factory=dict)
    versions_begun: dict[int, frozenset[str]] = field(default_factory=dict)
    """version -> the engines of the last update that began with it."""
    published: bool = False
    generated_under_none: bool = False
    healed: bool = False
    slow_starts: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Engine -> (end of its slow_start window, the seconds a start begun in it takes)."""
    slow_recoveries: dict[str, float] = field(default_factory=dict)
    """Engine -> when a recovery was asked for it inside its slow_start window."""
    ranks_per_cell: dict[int, int] = field(default_factory=dict)
    """Cell -> its ranks, as the world placed them."""
    cuts: list[tuple[float, float]] = field(default_factory=list)
    """The partition windows opened so far: (start, end)."""

    def see(self, e: Event) -> None:
        if isinstance(e, JobKilled):  # a new job follows: its processes, updates, versions
            fresh = _Walk(cuts=self.cuts, slow_starts=self.slow_starts)
            self.__dict__.update(fresh.__dict__)
        elif isinstance(e, RunStarted):
            self.num_cells = e.num_cells
            self.alive = set(e.engines)
            self.incarnation = dict.fromkeys(e.engines, 0)
        elif isinstance(e, EngineStarted):
            self.alive.add(e.engine)
            self.incarnation[e.engine] = e.incarnation
            self.slow_recoveries.pop(e.engine, None)
        elif isinstance(e, EngineExited):
            self.alive.discard(e.engine)
        elif isinstance(e, FaultInjected) and e.fault in _HANGS and e.engine:
            self.hung[e.engine] = self.incarnation.get(e.engine, 0)
        elif isinstance(e, FaultInjected) and e.fault is FaultKind.PARTITION:
            self.cuts.append((e.t, e.t + (e.duration or 0.0)))
        elif isinstance(e, FaultInjected) and e.fault is FaultKind.SLOW_START and e.engine:
            self.slow_starts[e.engine] = (e.t + (e.duration or 0.0), e.seconds or 0.0)
        elif isinstance(e, EngineRecoveryAsked) and e.t < self.slow_starts.get(e.engine, (0,))[0]:
            self.slow_recoveries[e.engine] = e.t
        elif isinstance(e, UpdateBegan):
            self.updates[e.update_id] = _Update(frozenset(e.engines), e.n_buckets)
            self.versions_begun[e.version] = frozenset(e.engines)
        elif isinstance(e, BucketReceived) and e.update_id in self.updates:
            if e.bucket >= e.n_buckets - 1:
                self.updates[e.update_id].last_arrived = True
        elif isinstance(e, EngineStamped):
            if e.update_id in self.updates:
                self.updates[e.update_id].stamped.add(e.engine)
            if e.incarnation > self.hung.get(e.engine, e.incarnation):
                del self.hung[e.engine]  # a later process of it was synced
        elif isinstance(e, EnginesResumed | UpdateAborted):
            self.updates.pop(e.update_id, None)
        elif isinstance(e, VersionPublished):
            self.published = True
        elif isinstance(e, SampleGenerated) and e.version is None:
            self.generated_under_none = True
        elif isinstance(e, FaultsHealed):
            self.healed = True
        elif isinstance(e, PlacementMade):
            self.ranks_per_cell = {cell: len(ranks) for cell, ranks in enumerate(e.cells)}


Test = Callable[[Event, _Walk], bool]


@dataclass(frozen=True)
class Probe:
    """A named state: ``test`` says whether this event, in the state before it, shows it."""

    name: str
    doc: str
    test: Test
    core: bool = False


def _lost_between_last_bucket_and_stamp(e: Event, w: _Walk) -> bool:
    """The process that received the last bucket is gone before its stamp: either it went
    after the last bucket was recorded, or the record names an incarnation already
    replaced (a fault that strikes as the bucket arrives is recorded before it)."""
    if isinstance(e, BucketReceived) and e.bucket >= e.n_buckets - 1:
        return any(
            w.incarnation.get(engine) != inc or engine not in w.alive
            for engine, inc in zip(e.engines, e.incarnations, strict=False)
        )
    if not isinstance(e, EngineExited | EngineStarted):
        return False
    return any(
        u.last_arrived and e.engine in u.engines and e.engine not in u.stamped
        for u in w.updates.values()
    )


def _every_engine_down(e: Event, w: _Walk) -> bool:
    return isinstance(e, EngineExited) and w.alive == {e.engine}


def _heal_during_update(e: Event, w: _Walk) -> bool:
    """A cell's heal, or liveness mode's heal of every fault, while an update was under way
    (a step's heal cannot meet a sync of its own loop: both hold the weights lock)."""
    return isinstance(e, HealBegan | FaultsHealed) and bool(w.updates)


def _shrunk_retry(e: Event, w: _Walk) -> bool:
    return isinstance(e, AttemptBegan) and e.attempt > 0 and len(e.cells) < w.num_cells


def _update_held_by_hang(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateAborted) and e.cause is AbortCause.ENGINE and e.component in w.hung


def _collective_stalled(e: Event, w: _Walk) -> bool:
    """A broadcast waited for a member that took no part (the reason both worlds give)."""
    return isinstance(e, UpdateAborted) and "took no part in the broadcast" in e.reason


def _engine_lost_mid_update(e: Event, w: _Walk) -> bool:
    return isinstance(e, EngineExited) and any(e.engine in u.engines for u in w.updates.values())


def _update_retried(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateBegan) and e.version in w.versions_begun


def _update_retried_on_fewer(e: Event, w: _Walk) -> bool:
    if not isinstance(e, UpdateBegan) or e.version not in w.versions_begun:
        return False
    return len(e.engines) < len(w.versions_begun[e.version])


def _first_update_from_none(e: Event, w: _Walk) -> bool:
    return isinstance(e, VersionPublished) and not w.published and w.generated_under_none


def _progress_after_heal(e: Event, w: _Walk) -> bool:
    return isinstance(e, StepCommitted) and w.healed


def _nodes(e: Event, least: int) -> bool:
    return isinstance(e, PlacementMade) and len(set(e.nodes)) >= least


def _address_families(e: Event, w: _Walk) -> bool:
    if not isinstance(e, PlacementMade):
        return False
    return len({order_key(address)[0] for address in e.sort_as}) >= 2


def _engine_across_nodes(e: Event, w: _Walk) -> bool:
    if not isinstance(e, PlacementMade):
        return False
    return any(len({e.nodes[p] for p in positions}) > 1 for positions in e.engines)


def _call_deadline(e: Event, w: _Walk) -> bool:
    """An engine taken out because a control call of an update got no answer in time (the
    reason the update's own calls record, in every world)."""
    return (
        isinstance(e, EngineStateChanged)
        and e.new is EngineState.DOWN
        and e.reason.startswith("no answer to ")
    )


def _slow_recovery_awaited(e: Event, w: _Walk) -> bool:
    """A recovery asked inside a slow_start window came up, after the seconds that start
    takes: the monitor waited for it instead of replacing the process being started."""
    if not isinstance(e, EngineStarted) or e.engine not in w.slow_recoveries:
        return False
    return e.t - w.slow_recoveries[e.engine] >= w.slow_starts[e.engine][1] - 1e-9


def _sharded_cell_healed(e: Event, w: _Walk) -> bool:
    return isinstance(e, HealEnded) and e.ok and w.ranks_per_cell.get(e.dst_cell, 1) > 1


def _kinds(*kinds: type[Event]) -> Test:
    return lambda e, w: isinstance(e, kinds)


def _lora(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateBegan) and e.kind is UpdateKind.LORA


def _multi_bucket(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateBegan) and e.n_buckets > 1


def _cell_lost_mid_update(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateAborted) and e.cause is AbortCause.CELL


def _cell_restarted(e: Event, w: _Walk) -> bool:
    return isinstance(e, CellStarted) and e.incarnation > 0


def _engine_restarted(e: Event, w: _Walk) -> bool:
    return isinstance(e, EngineStarted) and e.incarnation > 0


def _kept_kv(e: Event, w: _Walk) -> bool:
    return isinstance(e, SampleGenerated) and e.kept_kv


def _held_by_a_cut(e: Event, w: _Walk) -> bool:
    """A bucket whose send began while the trainers and engines were cut apart arrived once
    the cut ended, or an update failed on a collective the cut held past its timeout."""
    if isinstance(e, UpdateAborted):
        return LINK_CUT in e.reason
    if not isinstance(e, BucketReceived) or not w.cuts:
        return False
    began = e.t - e.seconds
    return any(start <= began < end <= e.t for start, end in w.cuts)


def _refused(e: Event, w: _Walk) -> bool:
    return isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.REFUSED


def _prompt_kv_reused(e: Event, w: _Walk) -> bool:
    return isinstance(e, SampleGenerated) and bool(e.cached_versions)


def _stale_group_renewed(e: Event, w: _Walk) -> bool:
    return isinstance(e, UpdateGroupConnected) and e.reason == ConnectReason.STALE


def _resumed_from_save(e: Event, w: _Walk) -> bool:
    return isinstance(e, JobResumed) and e.save_step is not None


def _torn_save_skipped(e: Event, w: _Walk) -> bool:
    return isinstance(e, JobResumed) and bool(e.torn)


_HANGS = (FaultKind.HANG_ENGINE, FaultKind.HANG_CALL)


def _lock_held_by_a_raised_rank(e: Event, w: _Walk) -> bool:
    """An update aborted on a broadcast of a cell whose rank 0 waited for the weight-update
    lock that a rank which raised still holds (both worlds name it in the reason), or a
    raise_holding_lock fault fired and the run stalled."""
    if isinstance(e, UpdateAborted):
        return "which raised holding it" in e.reason
    return False


_CORE: tuple[tuple[str, str, Test], ...] = (
    ("restart_between_last_bucket_and_stamp",
     "an engine of an update exited or restarted after the last bucket, before its stamp",
     _lost_between_last_bucket_and_stamp),
    ("every_engine_down", "no engine was alive at once", _every_engine_down),
    ("heal_during_update", "a heal (a cell's, or liveness mode's) began while an update was "
     "under way", _heal_during_update),
    ("retry_on_shrunk_quorum", "a step's retry ran on fewer cells than the run has",
     _shrunk_retry),
    ("flush_refused", "an engine refused a cache flush", _kinds(FlushRefused)),
    ("update_held_by_a_hang",
     "an update aborted on an engine a hang had struck (the process's, or one call's)",
     _update_held_by_hang),
    ("engine_lost_mid_update", "an engine of an update under way exited",
     _engine_lost_mid_update),
    ("cell_lost_mid_update", "an update aborted because its updating cell failed",
     _cell_lost_mid_update),
    ("update_retried_same_version", "an update began again with a version begun before",
     _update_retried),
    ("update_retried_on_fewer_engines",
     "an update began again, with its version, on fewer engines (one failed the first try)",
     _update_retried_on_fewer),
    ("cell_restarted", "a cell started again (a later incarnation)", _cell_restarted),
    ("engine_restarted", "an engine started again (a later incarnation)", _engine_restarted),
    ("heartbeat_missed", "a cell's heartbeat went unanswered", _kinds(HeartbeatMissed)),
    ("cell_resumed_by_controller", "the FT controller resumed a stopped cell",
     _kinds(CellRestartAsked)),
    ("request_retried", "a generate request was sent again", _kinds(RequestRetried)),
    ("group_recycled", "a group came back to be generated again", _kinds(GroupRecycled)),
    ("lora_update", "a LoRA update began", _lora),
    ("multi_bucket_update", "an update of more than one bucket began", _multi_bucket),
    ("first_update_from_none",
     "the first version was published over engines that had generated with no version",
     _first_update_from_none),
    ("progress_after_heal", "a step committed after the faults were healed",
     _progress_after_heal),
    ("call_deadline_passed", "an engine was taken out when an update's call to it got no "
     "answer in time", _call_deadline),
    ("slow_recovery_awaited", "a recovery asked while its engine starts slowly (slow_start) "
     "came up, after all the seconds that start takes", _slow_recovery_awaited),
    ("placed_on_many_nodes", "the world placed its GPUs on 3 nodes or more",
     lambda e, w: _nodes(e, 3)),
    ("sharded_cell_healed", "a cell of several ranks was healed back (rank by rank)",
     _sharded_cell_healed),
    ("engine_across_nodes", "an engine's GPUs were placed on more than one node",
     _engine_across_nodes),
    ("nodes_of_two_address_families",
     "the nodes were named two ways or more (IPv4, IPv6, unresolved names)", _address_families),
    ("stale_update_group_renewed", "an updater cell made its weight-update group afresh "
     "because a refresh had reconfigured the cells since it connected (miles #1444)",
     _stale_group_renewed),
    ("update_held_by_a_cut", "a weight update waited out a partition between the trainers "
     "and the engines (or failed on it, past the collective timeout)", _held_by_a_cut),
    ("prompt_kv_reused", "a request started from prompt KV an engine's prefix cache held "
     "(miles #2782)", _prompt_kv_reused),
    ("orphan_removed_from_router", "the control plane took out of the router a server "
     "whose actor was gone (miles #100)", _kinds(OrphanRemoved)),
    ("request_refused", "an engine refused a request itself (an over-long prompt: NeMo-RL "
     "#3938)", _refused),
    ("collective_stalled_by_hung_member", "a broadcast waited out its timeout for a member "
     "that took no part (a hang mid-update)", _collective_stalled),
    ("job_resumed_from_save", "a job killed whole resumed from a committed save",
     _resumed_from_save),
    ("torn_save_skipped", "a job killed whole found a save the kill had torn, and resumed "
     "from an older one (or from scratch)", _torn_save_skipped),
    # today's miles (issue 50): the rare states its rollout side adds
    ("window_waited_on_a_pending_cell", "a full update's window waited for an engine still "
     "initializing (InferenceController._ensure_cells_ready)", _kinds(UpdateWindowWaiting)),
    ("cells_stopped_by_an_aborted_window", "an aborted update window stopped the engines of "
     "its snapshot (any may hold partial weights)", _kinds(ParticipantsStopped)),
    ("engine_given_up_by_an_update", "an update gave up one engine past "
     "--update-weight-engine-request-timeout and went on with the rest", _kinds(EngineGivenUp)),
    ("engine_suspended_by_the_controller", "the rollout side's mini FT controller suspended "
     "an unhealthy or down engine", _kinds(EngineSuspended)),
    ("driver_adopted_the_processes", "a restarted driver adopted the live trainers and "
     "engines (hot restart)", _kinds(DriverAdopted)),
)  # fmt: skip
"""The probes CI's sweep must reach (``--require-probes``), as (name, what, test)."""

_OTHER: tuple[tuple[str, str, Test], ...] = (
    ("engine_health_failed", "an engine failed a health check", _kinds(EngineHealthFailed)),
    ("group_dropped", "a group was dropped", _kinds(GroupDropped)),
    ("kept_kv_across_update", "a sample kept its KV cache across an update", _kept_kv),
    ("lock_held_by_a_raised_rank", "a rank raised holding its cell's weight-update ticket "
     "lock and lived on, and an update of that cell then waited for it (today's miles: "
     "distributed_lock.py fails closed, no lease)", _lock_held_by_a_raised_rank),
)  # fmt: skip
"""Counted and reported, not required."""

PROBES: tuple[Probe, ...] = (
    *(Probe(name, doc, test, core=True) for name, doc, test in _CORE),
    *(Probe(name, doc, test) for name, doc, test in _OTHER),
)
PROBE_NAMES = tuple(p.name for p in PROBES)
NOT_IN_LIVENESS = frozenset(
    {"flush_refused", "job_resumed_from_save", "torn_save_skipped", "cell_resumed_by_controller"}
)
"""Core probes liveness mode cannot reach: the swarm's only refused flushes are those of an
SGLang before #31962 under retract, whose runs must fail (FlushTimeoutError), and a
liveness run must not; liveness mode draws no kill_job (its heal would have to span the
job's restart), and no FT controller (its heal starts the cells: sim/search/swarm_controller.py)."""
CORE = frozenset(p.name for p in PROBES if p.core)


def probes_hit(history: Iterable[Event]) -> frozenset[str]:
    """The probes this history hit (each once, however often)."""
    walk, hit = _Walk(), set[str]()
    for e in history:
        hit.update(p.name for p in PROBES if p.name not in hit and p.test(e, walk))
        walk.see(e)
    return frozenset(hit)


__all__ = ["CORE", "NOT_IN_LIVENESS", "PROBES", "PROBE_NAMES", "Probe", "probes_hit"]
