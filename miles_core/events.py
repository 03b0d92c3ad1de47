"""The event history: a typed record of what happened in one run.

The simulator and the real backends append the same events to a History; the
oracles read nothing else. Events record what happened, not what was meant:
a bucket when the world's transport says it arrived (BucketReceived), a stamp
when the engine answered, a process when the world saw it start, a cell's
attempt as the cell reported it. Fields that take one of a few values are
enums (CellState, Decision, AbortCause, ...), never free strings.

An event is a frozen dataclass with the time ``t`` at which it happened
(virtual seconds in the simulator, seconds since the run started for real).
Its fields are slots: a long run keeps over a million events alive, and an
object without a ``__dict__`` is one allocation instead of two, which the
run's memory and the collector's pass over it both feel. ``frozen_value`` makes
each class (``miles_core.values``: the dataclass, with an ``__init__`` that fills
the slots without a generic attribute write per field).
Cells are named by index, engines by id (and their processes by incarnation),
groups by a group_id unique per generation attempt, prompts by a prompt_id that
survives recycling. The history's hash (sha256 over its canonical JSON) is what
"the same seed gives the same run" is checked against.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import operator
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import StrEnum
from typing import Any, ClassVar

from miles_core.buffer import UnusedHandler
from miles_core.cells import CellState, Decision, Outcome
from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.kinds import (
    AbortCause,
    EngineHealth,
    FaultKind,
    FaultPoint,
    PauseMode,
    PutFate,
    RunStatus,
    SampleOutcome,
)
from miles_core.values import frozen_value
from miles_core.weight_update import UpdateKind

_REGISTRY: dict[str, type[Event]] = {}


class _FieldsByName:
    """``vars(event)`` and ``event.__dict__`` for events that keep their fields in slots:
    the fields by name, in a new dict (read code written for a plain dataclass keeps
    working; writing to it changes nothing, as an event is frozen)."""

    __slots__ = ()

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        return {name: getattr(self, name) for name in _field_names(type(self))}


@frozen_value(kw_only=True)
class Event(_FieldsByName):
    """Base of every event: ``t`` is when it happened."""

    t: float

    type_name: ClassVar[str] = "Event"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # super() with no arguments would name the class before frozen_value (slots) rebuilt it
        super(Event, cls).__init_subclass__(**kwargs)  # noqa: UP008
        cls.type_name = cls.__name__
        _REGISTRY[cls.__name__] = cls

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type_name}
        for name in _field_names(type(self)):
            out[name] = _plain(getattr(self, name))
        return out


@functools.cache
def _field_names(cls: type[Event]) -> tuple[str, ...]:
    """The dataclass fields of an event class, looked up once (hashing asks per event)."""
    return tuple(f.name for f in dataclasses.fields(cls))


_SCALARS = frozenset({int, float, str, bool, type(None)})


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:  # most fields: already plain
        return value
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def event_type(name: str) -> type[Event] | None:
    """The event class recorded under ``name`` (its class name), or None."""
    return _REGISTRY.get(name)


def event_names() -> tuple[str, ...]:
    """Every event class's name, sorted."""
    return tuple(sorted(_REGISTRY))


def plain(value: Any) -> Any:
    """A field's value as JSON and TOML hold it: an enum as its value, a tuple as a list."""
    return _plain(value)


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from ``Event.to_dict`` output (traces, events shipped as JSON)."""
    name = data.get("type")
    cls = _REGISTRY.get(name)  # type: ignore[arg-type]
    if cls is None:
        raise ConfigError("type", f"unknown event type {name!r}", f"use one of {sorted(_REGISTRY)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            raise ConfigError(f"{name}.{f.name}", "is missing", "pass every field of the event")
        value = data[f.name]
        enum = _enum_of(hints[f.name])
        if enum is not None and value is not None:
            value = enum(value)
        kwargs[f.name] = _tuples(value)
    return cls(**kwargs)


def _tuples(value: Any) -> Any:
    """JSON lists back into the tuples events hold, nested ones included."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _enum_of(hint: Any) -> type[StrEnum] | None:
    """The StrEnum a field holds (``E`` or ``E | None``), if any."""
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and issubclass(candidate, StrEnum):
            return candidate
    return None


# -- the run -----------------------------------------------------------------


@frozen_value(kw_only=True)
class RunStarted(Event):
    seed: int
    scenario: str
    engines: tuple[str, ...]
    num_cells: int
    max_weight_staleness: int | None
    steps: int = 0
    """Training steps the run is set to do (0: not stated)."""
    pause_mode: PauseMode = PauseMode.RETRACT
    """--pause-generation-mode: what an update may do to requests in flight."""
    fault_tolerance: bool = False
    unused_samples_handler: UnusedHandler | None = None
    """--async-unused-samples-handler: where a refused group goes (None: not stated)."""
    expected_status: RunStatus = RunStatus.COMPLETED
    """How the scenario says the run must end (end_state judges RunEnded against it)."""
    expected_error: str | None = None
    """The error class a scenario about a clean failure expects, e.g. NoAliveCellError."""


@frozen_value(kw_only=True)
class PlacementMade(Event):
    """Where the world put each cell's ranks and each engine's GPUs, by position in its
    bundle order (the world's own report, so the placement oracle judges any world)."""

    nodes: tuple[str, ...]
    """The node of each position, as Ray reported it."""
    sort_as: tuple[str, ...]
    """The address each position's node sorted as (its resolved address, or its name)."""
    gpus: tuple[int, ...]
    """The GPU id of each position on its node."""
    cells: tuple[tuple[int, ...], ...]
    """The positions of each cell's ranks."""
    engines: tuple[tuple[int, ...], ...]
    """The positions of each rollout engine's GPUs."""
    train_fraction: float
    engine_fraction: float
    """The GPU share a train actor and an engine's coordinator reserve in their bundle."""


@frozen_value(kw_only=True)
class ModelDescribed(Event):
    """The world's model as its weight updates send it: each update unit's bytes, in the
    order they are packed into buckets (a real world's model is its own, not the
    scenario's; the timing fit rebuilds its buckets from this)."""

    unit_bytes: tuple[int, ...]


@frozen_value(kw_only=True)
class RunEnded(Event):
    status: RunStatus
    reason: str
    outstanding_prompts: tuple[int, ...]
    """Prompts drawn but neither trained nor dropped: queued, in flight or awaiting regeneration."""
    awaiting_regeneration: tuple[int, ...] = ()
    """Of those, the prompts recycled and still waiting to be generated again."""
    error: str | None = None
    """The class name of the exception that ended the run, if one did."""
    traceback: str = ""
    """Where it was raised: frames as package-relative ``path:line in function``."""


@frozen_value(kw_only=True)
class FaultScheduled(Event):
    """A fault the run is set to inject; fault_witness checks that it fired and took effect."""

    index: int
    """Its position in the scenario's fault list."""
    fault: FaultKind
    cell: int | None = None
    engine: str | None = None
    detail: str = ""
    point: FaultPoint | None = None
    at: float | None = None
    """For a fault at a time: when."""


@frozen_value(kw_only=True)
class FaultInjected(Event):
    """The injector acted on the world (and nothing more: the world reports the effects)."""

    index: int
    fault: FaultKind
    cell: int | None = None
    engine: str | None = None
    detail: str = ""
    point: FaultPoint | None = None
    factor: float | None = None
    """slow_cell / slow_link: how many times slower."""
    seconds: float | None = None
    """delay_router: seconds added to each request."""
    duration: float | None = None
    """How long a slow_*, *_router or drop_heartbeat fault lasts."""


@frozen_value(kw_only=True)
class FaultsHealed(Event):
    """Liveness mode's heal (miles_core.scenario.liveness): the injector disarmed the faults
    that had not fired and asked the world to repair itself; what the world then did
    (engines restarted, cells started) it reports as it always does."""

    step: int | None
    """The step whose beginning brought the heal; None: no step had committed for the
    liveness bound, so the heal came then (the faults had stopped the run before)."""
    disarmed: tuple[int, ...]
    """The faults (their indices) that had not fired: they never will."""


@frozen_value(kw_only=True)
class LivenessArmed(Event):
    """After the heal, the run must commit ``steps`` steps and stamp every engine with the
    newest version by ``deadline`` (the liveness oracle judges it)."""

    deadline: float
    steps: int
    engines: tuple[str, ...]
    bound: str
    """How the bound was computed, term by term."""


@frozen_value(kw_only=True)
class TasksWaiting(Event):
    """The wait-for graph of the control plane's tasks when a run stalled or missed its
    liveness bound: each task, what it awaits and since when, and the root of the wait."""

    reason: str
    waits: tuple[str, ...]
    """One line per waiting task: ``task -> what it awaits (since t=...)``."""
    root: str
    """The cycle, or the party no one else waits for, at the bottom of the graph."""


# -- training steps and cells -------------------------------------------------


@frozen_value(kw_only=True)
class StepBegan(Event):
    step: int


@frozen_value(kw_only=True)
class AttemptBegan(Event):
    step: int
    attempt: int
    quorum_id: int
    cells: tuple[int, ...]


@frozen_value(kw_only=True)
class CellTrained(Event):
    """A cell's report of one attempt it finished (an errored cell raised instead)."""

    cell: int
    step: int
    attempt: int
    outcome: Outcome
    exchange: tuple[int, ...]
    """The cells whose gradients this cell exchanged with (its allreduce group)."""
    seconds: float
    """The cell's forward/backward time, as the world measured it."""


@frozen_value(kw_only=True)
class AttemptEnded(Event):
    step: int
    attempt: int
    decision: Decision
    normal: tuple[int, ...]
    discarded: tuple[int, ...]
    errored: tuple[int, ...]


@frozen_value(kw_only=True)
class StepCommitted(Event):
    step: int
    attempt: int
    n_groups: int


@frozen_value(kw_only=True)
class CellStateChanged(Event):
    cell: int
    old: CellState
    new: CellState
    reason: str


@frozen_value(kw_only=True)
class CellStarted(Event):
    """The world reports a new set of processes for a cell (they answered)."""

    cell: int
    incarnation: int
    how: str


@frozen_value(kw_only=True)
class QuorumChanged(Event):
    quorum_id: int
    members: tuple[int, ...]


@frozen_value(kw_only=True)
class HealBegan(Event):
    quorum_id: int
    src_cell: int
    dst_cell: int
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]


@frozen_value(kw_only=True)
class HealEnded(Event):
    dst_cell: int
    ok: bool


@frozen_value(kw_only=True)
class HeartbeatMissed(Event):
    """A cell did not answer a heartbeat within the timeout."""

    cell: int
    misses: int
    """Misses in a row, this one included."""
    sent: float
    """When the heartbeat was sent (``t`` is when its timeout ran out)."""


@frozen_value(kw_only=True)
class CellRestartAsked(Event):
    """The FT controller (--mini-ft-controller-enable) resumed a stopped cell: it asked the
    world for the cell's new processes, which the world reports (CellStarted) if it made
    them."""

    cell: int
    suspended: float
    """When the controller suspended the cell (``t`` is when it resumed it)."""
    reason: str


# -- weight updates -----------------------------------------------------------


@frozen_value(kw_only=True)
class UpdateBegan(Event):
    update_id: int
    version: int
    updater: int
    """The cell that performs the update."""
    kind: UpdateKind
    n_buckets: int
    engines: tuple[str, ...]
    """The engines the update's transfer plan names."""
    publishes: bool = True
    """False for a sync of restarted engines to the already published version."""


@frozen_value(kw_only=True)
class UpdateGroupConnected(Event):
    """The updater cell's weight-update group was made afresh, the world says, for these
    engine processes (miles' ``connect_rollout_engines``); kept for its next updates."""

    update_id: int
    updater: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]
    """The process of each engine, in the same order."""
    reason: str
    """Why it was made afresh (miles_core.update_connections.ConnectReason)."""


@frozen_value(kw_only=True)
class UpdateGroupMade(Event):
    """The world made a weight-update group that the updater connected (the cell's
    ``init_update_group`` and every member engine's /init_weights_update_group, all at
    once), as the first bucket over it went: recorded with that bucket, before its
    BucketReceived. The price of a (re)connect at scale, which the bucket's own seconds do
    not include. p2p makes one pair group per engine, each recorded. The simulator records
    it only where its time model charges for it (TimeModel ``group_make_seconds``), so a
    history made without that term is as it was."""

    update_id: int
    updater: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]
    """The process of each engine, in the same order."""
    seconds: float
    """How long making it took, as the world measured it (the simulator: what it charged)."""


@frozen_value(kw_only=True)
class EnginesPaused(Event):
    """The engine processes that answered the update's pause."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]
    """The process of each engine, in the same order."""


@frozen_value(kw_only=True)
class EnginesPausedAbortingBelow(EnginesPaused):
    """The engines that answered a pause that also aborted the requests declared to have
    started below ``abort_below`` (--pause-abort-below-start-weight-version; SGLang's draft
    ``abort_below_start_weight_version``, sglang #34185): recorded instead of EnginesPaused,
    only with that flag on (miles_core/pause_filter.py)."""

    abort_below: int


@frozen_value(kw_only=True)
class EnginesFlushed(Event):
    """The engine processes whose /flush_cache succeeded (miles flushes unless in_place)."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]


@frozen_value(kw_only=True)
class FlushRefused(Event):
    """An engine process refused /flush_cache (SGLang does while requests still hold KV);
    miles' ``SGLangEngine.flush_cache`` tries again 1 s later, and raises after the last."""

    update_id: int
    engine: str
    incarnation: int
    attempt: int
    """Which try this was, from 1."""
    reason: str


@frozen_value(kw_only=True)
class UpdateSessionOpened(Event):
    """The engine processes that answered /begin_weight_update."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]


@frozen_value(kw_only=True)
class UpdateSessionClosed(Event):
    """The engine processes that answered /end_weight_update."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]


@frozen_value(kw_only=True)
class AdapterUnloaded(Event):
    """LoRA: the engines dropped the old adapter before the new one's buckets arrive."""

    update_id: int
    adapter: str
    engines: tuple[str, ...]


@frozen_value(kw_only=True)
class BucketReceived(Event):
    """A bucket has arrived at these engines (the world's transport says so)."""

    update_id: int
    bucket: int
    n_buckets: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]
    """The process of each engine that received it, in the same order."""
    nbytes: int
    seconds: float
    """How long the send took, as the world measured it."""


@frozen_value(kw_only=True)
class EngineStamped(Event):
    """The engine process answered update_weight_version with ``version``."""

    update_id: int
    engine: str
    incarnation: int
    version: int


@frozen_value(kw_only=True)
class LedgerRestored(Event):
    """The run resumed from a checkpoint whose ledger had published ``version``: the
    sequence continues from it, and engines must be synced to it before they serve."""

    version: int


@frozen_value(kw_only=True)
class VersionPublished(Event):
    update_id: int
    version: int
    updater: int


@frozen_value(kw_only=True)
class EnginesResumed(Event):
    """The engine processes that answered the update's continue_generation."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]


@frozen_value(kw_only=True)
class UpdateAborted(Event):
    update_id: int
    version: int
    cause: AbortCause
    component: str
    """Who failed: ``cell-N`` or an engine id."""
    reason: str


@frozen_value(kw_only=True)
class EngineGivenUp(Event):
    """Today's miles (miles_core/loop/cell_isolation.py): one control call of an update to this
    process failed or outlived --update-weight-engine-request-timeout, so the update gave up
    only this engine (errored: no further call, no stamp, out of rotation) and went on with
    the others (rollout_cell_updater.py ``submit_client_call``, 3eacefd0)."""

    update_id: int
    engine: str
    incarnation: int
    call: str
    """The call that failed or went unanswered (pause, flush_cache, stamp, ...)."""
    reason: str


@frozen_value(kw_only=True)
class UpdateWindowWaiting(Event):
    """Today's miles (issue 50): a full update's window did not open at once, since some
    engines are still initializing (a recovery asked, its process not yet reported); it
    waits for them, polling (``InferenceController._ensure_cells_ready``, b8afde1e)."""

    version: int | None
    """The version published so far (the window reserves the next only once it opens)."""
    engines: tuple[str, ...]
    """The engines initializing when the wait began."""


@frozen_value(kw_only=True)
class UpdateWindowOpened(Event):
    """The window that waited opened: no engine is initializing any more."""

    waited: float
    """Seconds it waited."""


@frozen_value(kw_only=True)
class ParticipantsStopped(Event):
    """Today's miles (issue 50): an aborted update window stopped every engine process of
    its snapshot still matching it, since any may hold partial weights; each is replaced
    and the retry waits for the replacements (the driver's abort-with-snapshot, test id
    58310130319)."""

    update_id: int
    engines: tuple[str, ...]
    incarnations: tuple[int, ...]


@frozen_value(kw_only=True)
class WeightsChecked(Event):
    """An engine's weights compared with the trainer's after an update."""

    engine: str
    version: int
    checksum: str
    trainer_checksum: str


# -- engines, samples and groups ----------------------------------------------


@frozen_value(kw_only=True)
class EngineStarted(Event):
    """The world reports a new process for an engine slot (it answered its health check)."""

    engine: str
    incarnation: int
    how: str


@frozen_value(kw_only=True)
class EngineHealthFailed(Event):
    """The health monitor (--use-fault-tolerance) found an engine process dead or hung."""

    engine: str
    incarnation: int
    reason: str


@frozen_value(kw_only=True)
class EngineRecoveryAsked(Event):
    """The control plane asked the world for a new process for an engine slot."""

    engine: str
    reason: str


@frozen_value(kw_only=True)
class EngineHealthChanged(Event):
    """Today's rollout health checker (miles' ``SimpleHealthChecker``) changed the status it
    publishes for an engine process; it acts on nothing itself."""

    engine: str
    incarnation: int
    status: EngineHealth
    failures: int
    """Failed checks in a row behind the status (0 for healthy and unknown)."""


@frozen_value(kw_only=True)
class EngineSuspended(Event):
    """Today's mini FT controller suspended an unhealthy or down engine: out of rotation and
    its process stopped; the resume, ``resume_delay`` later, is an EngineRecoveryAsked."""

    engine: str
    incarnation: int
    reason: str


@frozen_value(kw_only=True)
class EngineExited(Event):
    """The world reports that an engine process is gone (its actor died, it exited)."""

    engine: str
    incarnation: int
    how: str


@frozen_value(kw_only=True)
class OrphanRemoved(Event):
    """The control plane took a process's server out of the router, and the world says it
    was still there, serving: its actor had gone without its ``shutdown`` (miles #100). What
    it still served was aborted."""

    engine: str
    incarnation: int


@frozen_value(kw_only=True)
class EngineStateChanged(Event):
    """The control plane moved an engine in its table (rotation); see miles_core.engines."""

    engine: str
    old: EngineState
    new: EngineState
    incarnation: int
    reason: str

    @property
    def up(self) -> bool:
        return self.new is not EngineState.DOWN


@frozen_value(kw_only=True)
class PromptDrawn(Event):
    prompt_id: int


@frozen_value(kw_only=True)
class GroupStarted(Event):
    """The producer started generating a group for a prompt (new or recycled)."""

    group_id: int
    prompt_id: int


@frozen_value(kw_only=True)
class SampleGenerated(Event):
    """One generate call (one turn) ended."""

    group_id: int
    prompt_id: int
    sample: int
    turn: int
    engine: str
    incarnation: int
    """The engine process the request was sent to."""
    version: int | None
    """The weight_version the engine reported (None: never updated, SGLang's 'default')."""
    versions: tuple[int | None, ...] = ()
    """The versions of its tokens' spans, in order (SGLang's meta_info weight_versions); a
    request that an update paused and resumed has more than one."""
    kept_kv: bool = False
    """It continued across an update on keys and values an older version computed (in_place)."""
    cached_versions: tuple[int | None, ...] = ()
    """The weights that computed the prompt KV it reused from the engine's prefix cache, as
    the world reports them (empty: it reused none)."""
    outcome: SampleOutcome = SampleOutcome.COMPLETED
    sent: float = 0.0
    """When the control plane sent the request (``t`` is when the answer came)."""
    engine_seconds: float | None = None
    """How long the engine says it spent on the request (None when it did not answer)."""

    @property
    def aborted(self) -> bool:
        return self.outcome is not SampleOutcome.COMPLETED

    @property
    def all_versions(self) -> tuple[int | None, ...]:
        """Every version its tokens came from (the reported one when no spans were given)."""
        return self.versions or (self.version,)


@frozen_value(kw_only=True)
class RequestRetried(Event):
    """A generate request failed at the router and will be sent again after the retry
    interval (miles' ``_post``: every failure but the last is retried); only its last try
    is recorded as SampleGenerated."""

    group_id: int
    prompt_id: int
    sample: int
    engine: str
    incarnation: int
    """The engine process the failed try was addressed to."""
    attempt: int
    """Which try failed, from 1."""
    sent: float
    """When that try was sent (``t`` is when its failure came back)."""
    reason: str


@frozen_value(kw_only=True)
class GroupPut(Event):
    group_id: int
    prompt_id: int
    fate: PutFate
    """queued or blocked (recycle/drop verdicts are GroupRecycled/GroupDropped)."""


@frozen_value(kw_only=True)
class GroupGot(Event):
    """The buffer handed a group to the trainer."""

    group_id: int
    prompt_id: int
    current_version: int | None
    staleness: int | None


@frozen_value(kw_only=True)
class GroupRecycled(Event):
    group_id: int
    prompt_id: int
    reason: str


@frozen_value(kw_only=True)
class GroupDropped(Event):
    group_id: int
    prompt_id: int
    reason: str


@frozen_value(kw_only=True)
class GateArmed(Event):
    """The producer gates its submissions by version (--staleness-policy gate_submission,
    AReaL's StalenessManager; miles_core.staleness_gate): a group goes out only while
    accepted + running < (max_staleness + version + 1) x batch_size. Recorded only under
    that policy, so a run without it has none."""

    max_staleness: int
    batch_size: int


@frozen_value(kw_only=True)
class GateHeld(Event):
    """The producer had room for another group and the gate refused it: ``accepted +
    running`` groups had reached ``limit``, counted from ``version``."""

    version: int
    accepted: int
    running: int
    limit: int


@frozen_value(kw_only=True)
class GateReleased(Event):
    """The hold that began at ``held_since`` ended: ``groups`` went out as the gate opened
    (0: the producer's own room closed first)."""

    held_since: float
    groups: int


@frozen_value(kw_only=True)
class StepMetrics(Event):
    """miles' rollout metrics for a step (rollout/fully_async/*, rollout/dynamic_filter/*),
    collected once per step, so each step's window covers that step only."""

    step: int
    metrics: tuple[tuple[str, float], ...]


@frozen_value(kw_only=True)
class GroupTrained(Event):
    """The group was part of a committed step."""

    group_id: int
    prompt_id: int
    step: int


# -- saves, and a job killed as a whole ---------------------------------------------
# A job killed whole (kill_job) leaves a history of segments: each run of the control
# plane from its start (or resume) to its death, joined in one history. JobKilled ends a
# segment; the next begins with the new controller's RunStarted and its JobResumed.


@frozen_value(kw_only=True)
class SaveBegan(Event):
    """The controller began a save after step ``step``: what it holds (miles_core.saves)."""

    step: int
    version: int | None
    cursor: int
    pending: tuple[int, ...]


@frozen_value(kw_only=True)
class SaveCommitted(Event):
    """The world's storage reports the save of step ``step`` whole and committed (its
    tracker written last), written by cell ``cell``'s processes."""

    step: int
    cell: int


@frozen_value(kw_only=True)
class JobKilled(Event):
    """The world saw every process of the job die at once (cells, engines, router, the
    controller): what the dead controller was doing is lost with it."""

    reason: str


@frozen_value(kw_only=True)
class JobResumed(Event):
    """The new controller of a killed job loaded save ``save_step`` (None: none had
    committed, a fresh start) and restored what it holds; ``torn``: the saves it found
    begun and never committed (torn by the kill), skipped."""

    save_step: int | None
    version: int | None
    next_step: int
    cursor: int
    pending: tuple[int, ...]
    torn: tuple[int, ...] = ()


# A driver hot restart (restart_driver; miles/utils/hot_restart.py) ends a segment as a kill
# does, its processes kept: DriverRestarted is a JobKilled of the driver alone, DriverAdopted
# a JobResumed from the state the trainer held in memory (miles_core.loop.adopt).


@frozen_value(kw_only=True)
class DriverRestarted(JobKilled):
    """The world saw the driver (the control-plane process) die alone: its buffer, ledger
    view and requests' bookkeeping are lost; cells, engines and router stay up."""


@frozen_value(kw_only=True)
class DriverAdopted(JobResumed):
    """A new driver took the live processes over: it rolled the trainer back to the state it
    held at its last published step (``save_step``, ``version``: None, nothing published),
    found each engine's process, its stamped version and any weight-update window the dead
    driver left open (``closed``: sessions it ended, ``resumed``: engines it found paused),
    and aborted ``aborted`` requests still in flight (miles' ``abort_all``)."""

    engines: tuple[str, ...] = ()
    incarnations: tuple[int, ...] = ()
    stamped: tuple[int | None, ...] = ()
    closed: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()
    aborted: int = 0


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""What ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` uses, built once."""

_Row = tuple[tuple[str, ...], Callable[[Event], tuple[Any, ...]]]


class _RowReaders(dict[type, _Row]):
    """Per event class: the keys of its canonical row (``to_dict``'s), sorted, and one getter
    of its values in that order (the class's ``type_name`` under "type").

    Hashing reads every event of a history, a million in a large run; a row made in
    one C call (``attrgetter``) instead of ``to_dict``'s loop takes a sixth off the
    hash (the rest is the encoder's own work). The values go to the encoder as they
    are: it writes an enum member (a ``StrEnum``) as its value and a tuple as a list,
    as it writes ``to_dict``'s plain values, so each row's JSON is the same text.
    """

    def __missing__(self, cls: type) -> _Row:
        keys = tuple(sorted(["type", *_field_names(cls)]))
        getter = operator.attrgetter(*("type_name" if key == "type" else key for key in keys))
        blank = [i for i, key in enumerate(keys) if key in _WHERE_NOT_WHAT.get(cls, ())]
        if blank:
            getter = _blanked(getter, blank)
        self[cls] = row = (keys, getter)
        return row


_WHERE_NOT_WHAT: dict[type, tuple[str, ...]] = {RunEnded: ("traceback",)}
"""Fields the hash reads as "": they say where in the source something was raised (file and
line), not what happened, so moving or editing code must not change a run's hash. The
history keeps them (``to_dict``, ``--history``); a run whose traceback is "" hashes as it
always did."""


def _blanked(getter: Callable[[Event], tuple[Any, ...]], blank: list[int]) -> Callable:
    def values(event: Event) -> tuple[Any, ...]:
        row = list(getter(event))
        for i in blank:
            row[i] = ""
        return tuple(row)

    return values


_ROWS = _RowReaders()


class History:
    """An append-only sequence of events; time never goes backwards."""

    def __init__(self, events: Iterable[Event] = ()) -> None:
        self._events: list[Event] = []
        self._observers: list[Callable[[Event], None]] = []
        for event in events:
            self.append(event)

    def observe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` with every event appended from now on (fault injectors, traces)."""
        self._observers.append(callback)

    def append(self, event: Event) -> Event:
        if not isinstance(event, Event):
            raise ConfigError("event", f"got {type(event).__name__}", "append Event instances")
        events = self._events
        if events and event.t < events[-1].t:
            raise ConfigError(
                "event.t",
                f"{event.type_name} at t={event.t} is earlier than the last event at "
                f"t={events[-1].t}",
                "append events in time order",
            )
        events.append(event)
        for callback in self._observers:
            callback(event)
        return event

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            self.append(event)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, seq: int) -> Event:
        return self._events[seq]

    def indexed(self) -> Iterator[tuple[int, Event]]:
        """(seq, event) pairs; seq is the event's position, cited by oracle evidence."""
        return enumerate(self._events)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self._events]

    def hash(self) -> str:
        """sha256 of the canonical JSON of every event, in order (a traceback read as "":
        ``_WHERE_NOT_WHAT``)."""
        digest = hashlib.sha256()
        encode, rows = _CANONICAL_JSON.encode, _ROWS
        for event in self._events:
            keys, values = rows[type(event)]
            digest.update(encode(dict(zip(keys, values(event), strict=True))).encode())
            digest.update(b"\n")
        return digest.hexdigest()

    @classmethod
    def from_dicts(cls, rows: Iterable[Mapping[str, Any]]) -> History:
        return cls(event_from_dict(row) for row in rows)
