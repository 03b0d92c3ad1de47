"""The event history: a typed record of everything the control plane does.

The simulator and the real backends append the same events to a History; the
oracles read nothing else. An event is a frozen dataclass with the time ``t``
at which it happened (virtual seconds in the simulator, seconds since the run
started for real). Cells are named by index, engines by id, groups by a
group_id unique per generation attempt, prompts by a prompt_id that survives
recycling. The history's hash (sha256 over its canonical JSON) is what
"the same seed gives the same run" is checked against.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from miles_core.errors import ConfigError


class FaultKind(StrEnum):
    KILL_CELL = "kill_cell"
    STOP_CELL = "stop_cell"
    START_CELL = "start_cell"
    SLOW_CELL = "slow_cell"
    KILL_ENGINE = "kill_engine"
    RESTART_ENGINE = "restart_engine"
    SLOW_LINK = "slow_link"
    DELAY_ROUTER = "delay_router"
    FAIL_ROUTER = "fail_router"
    DROP_HEARTBEAT = "drop_heartbeat"


class RunStatus(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    """Stopped with a clear error (e.g. no cell alive): not a hang."""
    STALLED = "stalled"
    """Nothing could make progress: the run was stopped from outside."""


_REGISTRY: dict[str, type[Event]] = {}


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event: ``t`` is when it happened."""

    t: float

    type_name: ClassVar[str] = "Event"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
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
        hint = hints[f.name]
        if isinstance(hint, type) and issubclass(hint, StrEnum):
            value = hint(value)
        kwargs[f.name] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


# -- the run -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    seed: int
    scenario: str
    engines: tuple[str, ...]
    num_cells: int
    max_weight_staleness: int | None


@dataclass(frozen=True, kw_only=True)
class RunEnded(Event):
    status: RunStatus
    reason: str
    outstanding_prompts: tuple[int, ...]
    """Prompts drawn but neither trained nor dropped: queued, in flight or awaiting regeneration."""


@dataclass(frozen=True, kw_only=True)
class FaultScheduled(Event):
    """A fault the run is set to inject; failover_witness checks that it fired."""

    fault: FaultKind
    cell: int | None = None
    engine: str | None = None
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    fault: FaultKind
    cell: int | None = None
    engine: str | None = None
    detail: str = ""


# -- training steps and cells -------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepBegan(Event):
    step: int


@dataclass(frozen=True, kw_only=True)
class AttemptBegan(Event):
    step: int
    attempt: int
    quorum_id: int
    cells: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class AttemptEnded(Event):
    step: int
    attempt: int
    decision: str
    normal: tuple[int, ...]
    discarded: tuple[int, ...]
    errored: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class StepCommitted(Event):
    step: int
    attempt: int
    n_groups: int


@dataclass(frozen=True, kw_only=True)
class CellStateChanged(Event):
    cell: int
    old: str
    new: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class QuorumChanged(Event):
    quorum_id: int
    members: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class HealBegan(Event):
    quorum_id: int
    src_cell: int
    dst_cell: int
    src_ranks: tuple[int, ...]
    dst_ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class HealEnded(Event):
    dst_cell: int
    ok: bool


# -- weight updates -----------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class UpdateBegan(Event):
    update_id: int
    version: int
    updater: int
    """The cell that performs the update."""
    kind: str
    n_buckets: int
    engines: tuple[str, ...]
    publishes: bool = True
    """False for a sync of restarted engines to the already published version."""


@dataclass(frozen=True, kw_only=True)
class EnginesPaused(Event):
    update_id: int
    engines: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class AdapterUnloaded(Event):
    """LoRA: the engines dropped the old adapter before the new one's buckets arrive."""

    update_id: int
    adapter: str
    engines: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class BucketSent(Event):
    update_id: int
    bucket: int
    n_buckets: int
    engines: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class EngineStamped(Event):
    update_id: int
    engine: str
    version: int


@dataclass(frozen=True, kw_only=True)
class LedgerRestored(Event):
    """The run resumed from a checkpoint whose ledger had published ``version``: the
    sequence continues from it, and engines must be synced to it before they serve."""

    version: int


@dataclass(frozen=True, kw_only=True)
class VersionPublished(Event):
    update_id: int
    version: int
    updater: int


@dataclass(frozen=True, kw_only=True)
class EnginesResumed(Event):
    update_id: int
    engines: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class UpdateAborted(Event):
    update_id: int
    version: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class WeightsChecked(Event):
    """An engine's weights compared with the trainer's after an update."""

    engine: str
    version: int
    checksum: str
    trainer_checksum: str


# -- engines, samples and groups ----------------------------------------------


@dataclass(frozen=True, kw_only=True)
class EngineStateChanged(Event):
    engine: str
    up: bool
    reason: str


@dataclass(frozen=True, kw_only=True)
class PromptDrawn(Event):
    prompt_id: int


@dataclass(frozen=True, kw_only=True)
class SampleGenerated(Event):
    """One generate call (one turn) finished on an engine."""

    group_id: int
    prompt_id: int
    sample: int
    turn: int
    engine: str
    version: int | None
    aborted: bool = False


@dataclass(frozen=True, kw_only=True)
class GroupPut(Event):
    group_id: int
    prompt_id: int
    fate: str
    """queued or blocked (recycle/drop verdicts are GroupRecycled/GroupDropped)."""


@dataclass(frozen=True, kw_only=True)
class GroupGot(Event):
    """The buffer handed a group to the trainer."""

    group_id: int
    prompt_id: int
    current_version: int | None
    staleness: int | None


@dataclass(frozen=True, kw_only=True)
class GroupRecycled(Event):
    group_id: int
    prompt_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class GroupDropped(Event):
    group_id: int
    prompt_id: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class GroupTrained(Event):
    """The group was part of a committed step."""

    group_id: int
    prompt_id: int
    step: int


_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""What ``json.dumps(..., sort_keys=True, separators=(",", ":"))`` uses, built once."""


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
        if self._events and event.t < self._events[-1].t:
            raise ConfigError(
                "event.t",
                f"{event.type_name} at t={event.t} is earlier than the last event at "
                f"t={self._events[-1].t}",
                "append events in time order",
            )
        self._events.append(event)
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
        """sha256 of the canonical JSON of every event, in order."""
        digest = hashlib.sha256()
        encode = _CANONICAL_JSON.encode
        for event in self._events:
            digest.update(encode(event.to_dict()).encode())
            digest.update(b"\n")
        return digest.hexdigest()

    @classmethod
    def from_dicts(cls, rows: Iterable[Mapping[str, Any]]) -> History:
        return cls(event_from_dict(row) for row in rows)
