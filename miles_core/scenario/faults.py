"""Faults as data: one type per kind, a trigger that says when, checked against the world.

A fault is what it does (its kind and target) and when it strikes (its trigger):

    trigger              keys                 strikes
    at                   at                   at that many seconds into the run
    before_allreduce     step                 a cell has done step ``step``'s forward/backward
    after_bucket         bucket, ARMED        bucket ``bucket`` of an update reached its engines
    during_heal          ARMED                a checkpoint is on its way to a healing cell
    mid_generation       ARMED                an engine is halfway through a request
    step_begin           step                 training step ``step`` begins
    during_recovery      ARMED                a new engine process is starting, not yet serving
    during_save          ARMED                a periodic save is half written, not committed
    after                fault | event, ...   seconds after fault N fired, or an event matched

Steps count from 0. ARMED is ``after_step?`` and ``after_time?``: ``after_step``
arms a point only once that step committed, ``after_time`` only from that many
seconds into the run (the first matching moment after both fires the fault);
without them the first matching moment does. A time puts a point fault in a
window that no step boundary names (a request halfway through while a cell
heals, say). Each point takes exactly the keys above: a key a point
would ignore is an error, not a silent no-op. A cell fault at a point fires
only at that cell's moment (the updater's bucket, a healing cell).

Which kinds take which triggers: kills and restarts (kill_cell, kill_rank, stop_cell,
kill_engine, restart_engine, kill_job, restart_driver) any; fail_rank (a rank that
raises, alive) only
``before_allreduce``; hang_engine any but ``mid_generation`` (an exit
halfway through a request); hang_call, orphan_engine, lying_engine, poison_prompt, start_cell,
raise_holding_lock, the disk-delta faults (delta_applied_twice, delta_skipped, delta_torn:
each arms the next pull or write) and the timed
impairments
(slow_cell, slow_start, slow_link, partition, delay_router, fail_router, drop_heartbeat)
``at`` or ``step_begin``, since they start a window of time rather than strike inside a
call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from miles_core.errors import ConfigError, int_at_least
from miles_core.events import Event, event_names, event_type, plain
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.scenario.fields import check_value, require_table

MIN_SLOWDOWN = 1.5
"""A slowdown a witness can tell from the noise: the simulator's 10 % step jitter, a
loaded machine's timing."""


# -- triggers -------------------------------------------------------------------


@dataclass(frozen=True)
class AtTime:
    at: float
    point: ClassVar[FaultPoint | None] = None


@dataclass(frozen=True)
class BeforeAllreduce:
    step: int
    point: ClassVar[FaultPoint | None] = FaultPoint.BEFORE_ALLREDUCE


@dataclass(frozen=True)
class AfterBucket:
    bucket: int
    after_step: int | None = None
    after_time: float | None = None
    point: ClassVar[FaultPoint | None] = FaultPoint.AFTER_BUCKET


@dataclass(frozen=True)
class DuringHeal:
    after_step: int | None = None
    after_time: float | None = None
    point: ClassVar[FaultPoint | None] = FaultPoint.DURING_HEAL


@dataclass(frozen=True)
class MidGeneration:
    after_step: int | None = None
    after_time: float | None = None
    point: ClassVar[FaultPoint | None] = FaultPoint.MID_GENERATION


@dataclass(frozen=True)
class StepBegin:
    step: int
    point: ClassVar[FaultPoint | None] = FaultPoint.STEP_BEGIN


@dataclass(frozen=True)
class DuringRecovery:
    after_step: int | None = None
    after_time: float | None = None
    point: ClassVar[FaultPoint | None] = FaultPoint.DURING_RECOVERY


@dataclass(frozen=True)
class DuringSave:
    after_step: int | None = None
    after_time: float | None = None
    point: ClassVar[FaultPoint | None] = FaultPoint.DURING_SAVE


@dataclass(frozen=True)
class After:
    """``after = { fault = N, seconds = S }`` or ``after = { event = KIND, seconds = S, ... }``:
    ``seconds`` after fault ``N`` of the scenario fired, or after the first event of that
    kind whose fields have the values given (``{ event = "HealBegan", dst_cell = 1 }``)
    was recorded. A moment of the run's own story means the same in every world, where a
    time does not (a real world's clock includes its start-up)."""

    fault: int | None = None
    event: str | None = None
    seconds: float = 0.0
    fields: tuple[tuple[str, Any], ...] = ()
    """The event's field values to match, as (name, value) in the order written."""
    point: ClassVar[FaultPoint | None] = None

    def matches(self, event: Event) -> bool:
        """Whether ``event`` is the event this trigger waits for."""
        if type(event).__name__ != self.event:
            return False
        return all(_frozen(plain(getattr(event, k))) == v for k, v in self.fields)

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": self.fault} if self.fault is not None else {}
        if self.event is not None:
            out |= {"event": self.event, **dict(self.fields)}
        return out | ({"seconds": self.seconds} if self.seconds else {})


Trigger = (
    AtTime
    | BeforeAllreduce
    | AfterBucket
    | DuringHeal
    | MidGeneration
    | StepBegin
    | DuringRecovery
    | DuringSave
    | After
)
TRIGGERS: Mapping[FaultPoint | None, type[Trigger]] = {
    t.point: t
    for t in (
        AtTime,
        BeforeAllreduce,
        AfterBucket,
        DuringHeal,
        MidGeneration,
        StepBegin,
        DuringRecovery,
        DuringSave,
    )
}
"""Trigger type by point (None: a time)."""


def trigger_keys(trigger: type[Trigger]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(trigger))


def describe(trigger: Trigger) -> str:
    """Where a fault strikes, in words (recorded with the fault, printed by the CLIs)."""
    if isinstance(trigger, AtTime):
        return f"at t={trigger.at:g}"
    if isinstance(trigger, After):
        if trigger.fault is not None:
            what = f"fault {trigger.fault}"
        else:
            args = ", ".join(f"{k}={v}" for k, v in trigger.fields)
            what = f"{trigger.event}({args})" if args else f"{trigger.event}"
        return f"after {what}" + (f" +{trigger.seconds:g}s" if trigger.seconds else "")
    parts = [trigger.point.value if trigger.point else ""]
    parts += [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k in trigger_keys(type(trigger))
        if (v := getattr(trigger, k)) is not None
    ]
    return " ".join(parts)


# -- faults -----------------------------------------------------------------------

ANY_POINT = frozenset(TRIGGERS)
WINDOW_POINTS = frozenset({None, FaultPoint.STEP_BEGIN})


@dataclass(frozen=True, kw_only=True)
class FaultSpec:
    """Base of every fault type: ``when`` it strikes; subclasses add the target and parameters."""

    when: Trigger
    kind: ClassVar[FaultKind]
    points: ClassVar[frozenset[FaultPoint | None]] = ANY_POINT

    @property
    def point(self) -> FaultPoint | None:
        return self.when.point

    @property
    def detail(self) -> str:
        return describe(self.when)

    def to_mapping(self) -> dict[str, Any]:
        """The keys a scenario file writes for this fault (dump and load round-trip)."""
        out: dict[str, Any] = {"kind": self.kind.value}
        out |= {f.name: getattr(self, f.name) for f in fields(self) if f.name != "when"}
        if isinstance(self.when, After):
            return out | {"after": self.when.to_mapping()}
        if self.point is not None:
            out["point"] = self.point.value
        for key in trigger_keys(type(self.when)):
            if (value := getattr(self.when, key)) is not None:
                out[key] = value
        return out


def target_cell(fault: FaultSpec) -> int | None:
    return getattr(fault, "cell", None)


def target_engine(fault: FaultSpec) -> str | None:
    return getattr(fault, "engine", None)


@dataclass(frozen=True, kw_only=True)
class KillCell(FaultSpec):
    """Every process of the cell dies (at once in time, or inside the call at a point)."""

    cell: int
    kind: ClassVar[FaultKind] = FaultKind.KILL_CELL


@dataclass(frozen=True, kw_only=True)
class KillRank(FaultSpec):
    """One rank's process of the cell dies; its cell-mates live on, waiting in the cell's
    collectives, until the control plane stops the cell (a cell is failed as a whole)."""

    cell: int
    rank: int
    kind: ClassVar[FaultKind] = FaultKind.KILL_RANK

    @property
    def detail(self) -> str:
        return f"rank {self.rank}, {describe(self.when)}"


RANK_FAILED = "injected: the rank failed its step (fail_rank)"
"""What a rank that a fail_rank fault strikes raises (a RuntimeError), in every world."""


@dataclass(frozen=True, kw_only=True)
class FailRank(FaultSpec):
    """One rank of the cell raises in its step, after its backward and before the exchange
    (a NaN loss, a CUDA error), while its process stays alive: the cell is failed and its
    processes killed at once (miles #1443, ``RayTrainCell._execute_raw`` kill_on_failure),
    not left errored and alive until the next reconfiguration."""

    cell: int
    rank: int
    kind: ClassVar[FaultKind] = FaultKind.FAIL_RANK
    points: ClassVar[frozenset[FaultPoint | None]] = frozenset({FaultPoint.BEFORE_ALLREDUCE})

    @property
    def detail(self) -> str:
        return f"rank {self.rank}, {describe(self.when)}"


LOCK_RAISED = "injected: the rank raised holding the weight-update lock (raise_holding_lock)"
"""What a rank that a raise_holding_lock fault strikes raises inside the lock, in every world."""


@dataclass(frozen=True, kw_only=True)
class RaiseHoldingLock(FaultSpec):
    """One rank of the cell takes the cell's weight-update ticket lock, raises inside it and
    lives on: ``StoreTicketLock.__exit__`` releases only when nothing was raised, and the
    lock has no lease (miles/utils/distributed_lock.py, 4d412b5a), so every later ticket
    waits for ever; the next bucket's broadcast never starts and the engines wait out the
    collective timeout. Today's profile, cells of more than one rank (broadcast.py 069a4115
    takes the lock only when pp.size > 1). The exception reaches no one who kills the cell
    (miles' ``RayTrainCell._execute_raw`` would kill it, and rank 0's store with it)."""

    cell: int
    rank: int
    kind: ClassVar[FaultKind] = FaultKind.RAISE_HOLDING_LOCK
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS

    @property
    def detail(self) -> str:
        return f"rank {self.rank}, {describe(self.when)}"


@dataclass(frozen=True, kw_only=True)
class StopCell(FaultSpec):
    """The cell's processes are stopped by an operator (the control plane sees a death)."""

    cell: int
    kind: ClassVar[FaultKind] = FaultKind.STOP_CELL


@dataclass(frozen=True, kw_only=True)
class StartCell(FaultSpec):
    """New processes for a dead cell, started once the control plane has stopped it."""

    cell: int
    kind: ClassVar[FaultKind] = FaultKind.START_CELL
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class SlowCell(FaultSpec):
    """The cell computes ``factor`` times slower for ``duration`` seconds."""

    cell: int
    duration: float
    factor: float
    kind: ClassVar[FaultKind] = FaultKind.SLOW_CELL
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class DropHeartbeat(FaultSpec):
    """The cell stays healthy but stops answering heartbeats (a false suspicion)."""

    cell: int
    duration: float
    kind: ClassVar[FaultKind] = FaultKind.DROP_HEARTBEAT
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class KillEngine(FaultSpec):
    engine: str
    kind: ClassVar[FaultKind] = FaultKind.KILL_ENGINE


@dataclass(frozen=True, kw_only=True)
class RestartEngine(FaultSpec):
    """The engine's process is replaced by a new one (initial weights, no version)."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.RESTART_ENGINE


@dataclass(frozen=True, kw_only=True)
class HangEngine(FaultSpec):
    """The engine's process stays alive but stops answering anything, until it is killed.

    Not at ``mid_generation``: that point is a process exiting halfway through a request,
    which the Ray worlds arrange as the request is sent (a kill marks the engine doomed and
    the request carries the exit); a hang has no such path, so it would strike as the
    request is sent there and halfway through it in the simulator."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.HANG_ENGINE
    points: ClassVar[frozenset[FaultPoint | None]] = ANY_POINT - {FaultPoint.MID_GENERATION}


@dataclass(frozen=True, kw_only=True)
class OrphanEngine(FaultSpec):
    """The engine's actor is lost and its server process lives on, serving the weights it
    holds, still in the router (miles #100: the health monitor killed the actor without its
    ``shutdown``; or the actor's own process died, its server a process of its own). The
    world reports the actor's exit; the router still sends the server requests (it has the
    fewest in flight) until the control plane removes it by its address."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.ORPHAN_ENGINE
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class PoisonPrompt(FaultSpec):
    """The prompt of the first request sent after it fires is longer than the engines'
    context: every engine refuses each request for it (SGLang answers 400, "the input is
    longer than the model's context length"), as one over-long prompt in a data set does
    (NeMo-RL #3938: one such prompt froze a 32-node run)."""

    kind: ClassVar[FaultKind] = FaultKind.POISON_PROMPT
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class LyingEngine(FaultSpec):
    """From now on the engine's process answers every weight-update call with success and
    loads nothing: it keeps the weights it held, stamped with every new version (tokenspeed
    #1373: ``/update_weights_from_distributed`` reports success without transferring). No
    control plane gets past it; the weights oracle (published_weights, from the checksum the
    world reads off the engine's own tensors) must catch it: the swarm draws it expecting
    that (``expect.caught_by``, sim/search/swarm_field_bugs.py).
    A new process of the engine loads what it is sent."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.LYING_ENGINE
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class DeltaAppliedTwice(FaultSpec):
    """disk-delta: the engine's next /pull_weights, after its verified apply, applies the
    last version's delta once more, unverified (a second applier on the same local
    checkpoint that trusts the first's check). xor reverts the bytes to the base (an
    involution) and the engine loads them; overwrite is idempotent. Only the weights oracle
    sees it (published_weights, from the checksum of what the engine loaded)."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.DELTA_APPLIED_TWICE
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class DeltaSkipped(FaultSpec):
    """disk-delta: the engine's next /pull_weights answers success and applies nothing (its
    applied-version marker stays): it loads the bytes it held, stamped with the new version.
    Nothing is verified, as nothing was applied; the weights oracle catches it."""

    engine: str
    kind: ClassVar[FaultKind] = FaultKind.DELTA_SKIPPED
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class DeltaTorn(FaultSpec):
    """disk-delta: the next version's delta file is truncated after its atomic write (the
    storage's fault: tmp + fsync + replace rule out the writer's). Every engine's per-tensor
    checksum fails, and the engine refuses the pull with nothing changed; the update's retry
    writes the version afresh."""

    kind: ClassVar[FaultKind] = FaultKind.DELTA_TORN
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


HUNG_CALLS = ("pause_generation", "flush_cache", "update_weight_version", "continue_generation")
"""The control calls of an update a hang_call fault can leave unanswered (SGLang's routes)."""


@dataclass(frozen=True, kw_only=True)
class HangCall(FaultSpec):
    """One control call of the engine's process (``call``: one of HUNG_CALLS) is accepted and
    never answered, while the process generates and answers everything else, health checks
    included, until it is replaced (miles #2983 / #3036: an engine whose abort never
    returns holds the update). Only a deadline on the call gets past it."""

    engine: str
    call: str
    kind: ClassVar[FaultKind] = FaultKind.HANG_CALL
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class SlowStart(FaultSpec):
    """Every new process of the engine begun within ``duration`` seconds takes ``seconds``
    longer to answer its first health check (a model loading for minutes). A start keeps
    the pace it began with. miles' health monitor must not take a start this slow for a
    dead engine and replace it, for ever (its rollout manager waits for the engines it
    restarts: recover_updatable_engines)."""

    engine: str
    seconds: float
    duration: float
    kind: ClassVar[FaultKind] = FaultKind.SLOW_START
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class SlowLink(FaultSpec):
    """The weight-transfer link moves bytes ``factor`` times slower."""

    duration: float
    factor: float
    kind: ClassVar[FaultKind] = FaultKind.SLOW_LINK
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class Partition(FaultSpec):
    """The network between the trainer cells and the engines is cut for ``duration`` seconds
    (a switch or a link down): a weight-update collective begun in the window moves no byte
    until it ends, and one that would wait longer than the group's timeout
    (``update_weight_collective_timeout``) fails as a whole, its updating cell raising, as
    torch's broadcast does (miles then errors that cell). Generation, the router, the
    control calls and the cells' own exchanges go other ways and are not cut."""

    duration: float
    kind: ClassVar[FaultKind] = FaultKind.PARTITION
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class DelayRouter(FaultSpec):
    """Every request through the router waits ``seconds`` more."""

    duration: float
    seconds: float
    kind: ClassVar[FaultKind] = FaultKind.DELAY_ROUTER
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class FailRouter(FaultSpec):
    """Every request through the router fails (the engines behind it are fine)."""

    duration: float
    kind: ClassVar[FaultKind] = FaultKind.FAIL_ROUTER
    points: ClassVar[frozenset[FaultPoint | None]] = WINDOW_POINTS


@dataclass(frozen=True, kw_only=True)
class KillJob(FaultSpec):
    """Every process of the run dies at once: its cells, engines and router, and the
    controller (a head node lost, a preemption of the whole job). The job restarts from its
    last committed save, or from scratch when none committed (miles_core.saves); a save the
    kill tore is never read."""

    kind: ClassVar[FaultKind] = FaultKind.KILL_JOB


@dataclass(frozen=True, kw_only=True)
class RestartDriver(FaultSpec):
    """The driver alone dies (the control-plane process: its buffer, ledger view and
    requests' bookkeeping), its cells, engines and router up; a new driver adopts them and
    goes on from the state the trainer held at its last published step (a hot restart:
    miles/utils/hot_restart.py; miles_core.loop.adopt)."""

    kind: ClassVar[FaultKind] = FaultKind.RESTART_DRIVER


AnyFault = (
    KillCell
    | KillRank
    | FailRank
    | StopCell
    | StartCell
    | SlowCell
    | DropHeartbeat
    | KillEngine
    | RestartEngine
    | HangEngine
    | HangCall
    | OrphanEngine
    | PoisonPrompt
    | SlowStart
    | SlowLink
    | Partition
    | DelayRouter
    | FailRouter
    | LyingEngine
    | DeltaAppliedTwice
    | DeltaSkipped
    | DeltaTorn
    | KillJob
    | RestartDriver
    | RaiseHoldingLock
)
FAULT_TYPES: Mapping[FaultKind, type[FaultSpec]] = {
    t.kind: t
    for t in (
        KillCell,
        KillRank,
        FailRank,
        StopCell,
        StartCell,
        SlowCell,
        DropHeartbeat,
        KillEngine,
        RestartEngine,
        HangEngine,
        OrphanEngine,
        PoisonPrompt,
        HangCall,
        SlowStart,
        SlowLink,
        Partition,
        DelayRouter,
        FailRouter,
        LyingEngine,
        DeltaAppliedTwice,
        DeltaSkipped,
        DeltaTorn,
        KillJob,
        RestartDriver,
        RaiseHoldingLock,
    )
}
_HINTS = {"int": int, "float": float, "str": str}
"""Field annotations are strings under ``from __future__ import annotations``."""


def _params(cls: type[FaultSpec]) -> dict[str, Any]:
    """A fault type's target and parameters: key -> type."""
    return {f.name: _HINTS[f.type] for f in fields(cls) if f.name != "when"}  # type: ignore[index]


def make_fault(kind: FaultKind | str, **keys: Any) -> AnyFault:
    """A fault from the keys a scenario file uses: ``make_fault("kill_cell", cell=1, at=3.0)``."""
    return fault_from_mapping({"kind": kind, **keys})


def fault_from_mapping(data: Mapping[str, Any], where: str = "fault") -> AnyFault:
    """One ``[[faults]]`` table as a typed fault; ConfigError names the key and the fix."""
    data = require_table(data, where, "write each fault as a [[faults]] table")
    kind = check_value(FaultKind, data.get("kind"), f"{where}.kind")
    cls = FAULT_TYPES[kind]
    where = f"{where} ({kind.value})"
    if "after" in data:
        return _fault_after(cls, data, where)
    point = check_value(FaultPoint | None, data.get("point"), f"{where}.point")
    if point is None and "at" not in data:
        choices = sorted(p.value for p in cls.points if p is not None)
        raise ConfigError(
            where,
            "says neither 'at' nor 'point'",
            f"set at = seconds, or point to one of {choices}",
        )
    if point is not None and "at" in data:
        raise ConfigError(where, "sets both 'at' and 'point'", "keep one of them")
    if point not in cls.points:
        choices = sorted(p.value for p in cls.points if p is not None)
        choices = ["at", *choices] if None in cls.points else choices
        key, moment = ("point", point.value) if point is not None else ("at", "a time")
        fix = f"use one of {choices}" if len(choices) > 1 else f"set point = {choices[0]!r}"
        raise ConfigError(f"{where}.{key}", f"{kind.value} cannot strike at {moment}", fix)
    trigger_cls = TRIGGERS[point]
    params = _params(cls)
    allowed = {"kind", "point", *trigger_keys(trigger_cls), *params}
    stray = sorted(set(data) - allowed, key=str)
    if stray:
        what = f"point {point.value}" if point else "a fault at a time"
        raise ConfigError(
            f"{where}.{stray[0]}",
            f"is not used by {what} (keys {stray} would be ignored)",
            f"remove them; {what} takes {sorted(allowed - {'kind', 'point'})}",
        )
    return _built(cls, _trigger(trigger_cls, data, where), data, where)


def _built(cls: type[FaultSpec], trigger: Trigger, data: Mapping[str, Any], where: str) -> AnyFault:
    values = {}
    for key, hint in _params(cls).items():
        if key not in data:
            raise ConfigError(f"{where}.{key}", "is missing", _missing_fix(key))
        _check_engine_index(key, data[key], where)
        values[key] = check_value(hint, data[key], f"{where}.{key}")
    fault = cls(when=trigger, **values)
    _check_parameters(fault, where)
    return fault  # type: ignore[return-value]


def _fault_after(cls: type[FaultSpec], data: Mapping[str, Any], where: str) -> AnyFault:
    """A fault with an ``after`` trigger: no ``at``, no ``point``, its own keys only."""
    for key in ("at", "point"):
        if key in data:
            raise ConfigError(f"{where}.{key}", "is set beside 'after'", "keep one of them")
    stray = sorted(set(data) - {"kind", "after", *_params(cls)}, key=str)
    if stray:
        raise ConfigError(
            f"{where}.{stray[0]}",
            f"is not used by a fault with 'after' (keys {stray} would be ignored)",
            f"remove them; it takes {sorted({'after', *_params(cls)})}",
        )
    return _built(cls, after_from_mapping(data["after"], f"{where}.after"), data, where)


def after_from_mapping(data: Any, where: str) -> After:
    """``after = { fault = N | event = KIND, seconds = S, <field> = <value> ... }``."""
    table = require_table(data, where, "write after = { fault = 0, seconds = 5.0 }")
    seconds = check_value(float, table.get("seconds", 0.0), f"{where}.seconds")
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(f"{where}.seconds", f"got {seconds!r}", "pass finite seconds >= 0")
    if ("fault" in table) == ("event" in table):
        raise ConfigError(
            where, "names neither or both of 'fault' and 'event'", "name exactly one of them"
        )
    if "fault" in table:
        stray = sorted(set(table) - {"fault", "seconds"}, key=str)
        if stray:
            raise ConfigError(f"{where}.{stray[0]}", "is not used after a fault", "remove it")
        index = check_value(int, table["fault"], f"{where}.fault")
        if index < 0:
            raise ConfigError(f"{where}.fault", f"got {index!r}", "pass a fault's index (from 0)")
        return After(fault=index, seconds=seconds)
    name = check_value(str, table["event"], f"{where}.event")
    kind = event_type(name)
    if kind is None or name in _NOT_AWAITABLE:
        raise ConfigError(
            f"{where}.event",
            f"{name!r} is not an event a run records before its end",
            f"use one of {sorted(set(event_names()) - _NOT_AWAITABLE)}",
        )
    names = [f.name for f in fields(kind) if f.name != "t"]
    matched = []
    for key, value in table.items():
        if key in ("event", "seconds"):
            continue
        if key not in names:
            raise ConfigError(f"{where}.{key}", f"is not a field of {name}", f"use some of {names}")
        if isinstance(value, Mapping) or value is None:
            raise ConfigError(
                f"{where}.{key}", f"got {value!r}", "pass a number, a string, true/false or a list"
            )
        matched.append((key, _frozen(value)))
    return After(event=name, seconds=seconds, fields=tuple(matched))


def _frozen(value: Any) -> Any:
    """A list as a tuple, nested ones too (a fault is hashable; events hold tuples)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


_NOT_AWAITABLE = frozenset({"RunStarted", "RunEnded", "FaultScheduled", "TasksWaiting"})
"""Events no fault can wait for: before the schedule exists, or after the run."""


def _check_engine_index(key: str, value: object, where: str) -> None:
    """An engine named by its index, as a cell is (``engine = 1``): said with the id it
    means, not taken as that id (engines are named by id, cells by index)."""
    if key == "engine" and isinstance(value, int) and not isinstance(value, bool):
        raise ConfigError(
            f"{where}.engine",
            f"got {value!r}; engines are named by id, not by index",
            f'write engine = "engine-{value}"',
        )


def _missing_fix(key: str) -> str:
    return {
        "cell": "name the cell index (cells count from 0)",
        "rank": "name the rank within the cell (ranks count from 0)",
        "engine": "name the engine id, e.g. engine-0",
        "duration": "pass how many seconds the fault lasts",
        "factor": f"pass how many times slower, >= {MIN_SLOWDOWN}",
        "seconds": "pass the seconds added (to each request, or to each start of the engine)",
        "call": f"name the call left unanswered, one of {list(HUNG_CALLS)}",
    }.get(key, f"set {key}")


def _trigger(cls: type[Trigger], data: Mapping[str, Any], where: str) -> Trigger:
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = f"{where}.{f.name}"
        if f.name not in data:
            if f.default is dataclasses.MISSING:
                point = cls.point.value if cls.point else "a fault at a time"
                raise ConfigError(key, f"is missing for {point}", f"set {f.name}")
            continue
        if f.name in ("at", "after_time"):
            value = check_value(float, data[f.name], key)
            if value < 0:
                raise ConfigError(key, f"got {value!r}", "pass seconds >= 0")
        else:
            value = check_value(int, data[f.name], key)
            if value < 0:
                raise ConfigError(
                    key, f"got {value!r}", "pass an integer >= 0 (steps count from 0)"
                )
        values[f.name] = value
    return cls(**values)


def _check_parameters(fault: FaultSpec, where: str) -> None:
    cell = target_cell(fault)
    if cell is not None and not int_at_least(cell, 0):
        raise ConfigError(f"{where}.cell", f"got {cell!r}", "pass a cell index >= 0 (from 0)")
    rank = getattr(fault, "rank", None)
    if rank is not None and not int_at_least(rank, 0):
        raise ConfigError(f"{where}.rank", f"got {rank!r}", "pass a rank >= 0 (from 0)")
    for name in ("duration", "seconds"):
        value = getattr(fault, name, None)
        if value is not None and value <= 0:
            raise ConfigError(f"{where}.{name}", f"got {value!r}", "pass seconds > 0")
    call = getattr(fault, "call", None)
    if call is not None and call not in HUNG_CALLS:
        raise ConfigError(
            f"{where}.call", f"got {call!r}", f"name one of {list(HUNG_CALLS)} (SGLang's routes)"
        )
    factor = getattr(fault, "factor", None)
    if factor is not None and factor < MIN_SLOWDOWN:
        raise ConfigError(
            f"{where}.factor",
            f"got {factor!r}: a slowdown under {MIN_SLOWDOWN}x is lost in the timing noise, so "
            "its witness could not tell whether it happened",
            f"pass a factor >= {MIN_SLOWDOWN}",
        )


def faults_from_list(data: Any) -> tuple[AnyFault, ...]:
    if not isinstance(data, list):
        raise ConfigError("faults", f"is {data!r}, not a list", "write each fault as [[faults]]")
    return tuple(fault_from_mapping(item, f"faults[{i}]") for i, item in enumerate(data))
