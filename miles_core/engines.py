"""Rollout engines as the control plane tracks them: states, processes and rotation.

An engine id names a slot; the process behind it changes when the world
restarts it. The world reports each new process with an incarnation number
(a dead actor replaced, a health check answered by a fresh server), and every
call the control plane makes is tied to the incarnation it was made to, so a
failure of an old process is stale news and an update never stamps a process
that did not receive its buckets. Decisions made here:

- a fresh process holds initial weights: it is UNSYNCED (out of rotation)
  until an update or a sync stamps and resumes *that* process; only when no
  version was ever reserved are the initial weights the current ones, and it
  serves at once;
- a failed call (or a reported exit) of the current process takes the engine
  DOWN, out of rotation, until a new process is reported;
- a process that answered the last step of an update (resume) is SERVING.

The state machine is the transition table ``TRANSITIONS`` (cells.py's shape).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from miles_core.errors import ConfigError, TransitionError


class EngineState(StrEnum):
    SERVING = "serving"
    """In rotation: this process holds the published weights and is stamped with them."""
    UNSYNCED = "unsynced"
    """A live process without the published weights: out of rotation until synced."""
    DOWN = "down"
    """No live process: out of rotation until the world reports a new one."""


class EngineEvent(StrEnum):
    STARTED = "started"
    """The world reported a new process (initial weights, no version)."""
    FAILED = "failed"
    """A call to the current process failed, or the world reported it exited."""
    SYNCED = "synced"
    """An update or sync stamped the current process and resumed it."""
    OUTDATED = "outdated"
    """The published version moved past what the process holds (a run resumed from a
    checkpoint): it must be synced before it serves again."""


S, E = EngineState, EngineEvent
TRANSITIONS: Mapping[tuple[EngineState, EngineEvent], EngineState] = {
    (S.SERVING, E.FAILED): S.DOWN,
    (S.UNSYNCED, E.FAILED): S.DOWN,
    (S.DOWN, E.STARTED): S.UNSYNCED,
    # a new process replaced one believed serving: its weights went with the old one
    (S.SERVING, E.STARTED): S.UNSYNCED,
    (S.UNSYNCED, E.STARTED): S.UNSYNCED,
    (S.UNSYNCED, E.SYNCED): S.SERVING,
    (S.SERVING, E.SYNCED): S.SERVING,
    (S.SERVING, E.OUTDATED): S.UNSYNCED,
}
del S, E


@dataclass(frozen=True)
class EngineTransition:
    engine: str
    old: EngineState
    new: EngineState
    event: EngineEvent
    incarnation: int
    reason: str


class EngineTable:
    """Every engine's state and current incarnation; emits transitions for the history."""

    def __init__(self, engine_ids: Iterable[str]) -> None:
        ids = tuple(engine_ids)
        if not ids:
            raise ConfigError("num_engines", "no engine", "pass at least one engine")
        self._states = dict.fromkeys(ids, EngineState.SERVING)
        self._incarnations = dict.fromkeys(ids, 0)
        self._transitions: list[EngineTransition] = []
        self._serving: tuple[str, ...] = ids
        """Kept up to date by every transition: the router asks for it on every request."""

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._states)

    def state(self, engine: str) -> EngineState:
        self._check(engine)
        return self._states[engine]

    def incarnation(self, engine: str) -> int:
        incarnation = self._incarnations.get(engine)
        if incarnation is None:
            self._check(engine)
        return incarnation  # type: ignore[return-value]

    def incarnations(self, engines: Iterable[str]) -> dict[str, int]:
        return {e: self.incarnation(e) for e in engines}

    def serving(self) -> tuple[str, ...]:
        return self._serving

    def live(self) -> tuple[str, ...]:
        """Engines with a live process (serving or waiting for a sync), sorted."""
        return tuple(sorted(e for e, s in self._states.items() if s is not EngineState.DOWN))

    def unsynced(self) -> tuple[str, ...]:
        return tuple(sorted(e for e, s in self._states.items() if s is EngineState.UNSYNCED))

    def current(self, engine: str, incarnation: int) -> bool:
        """Whether ``incarnation`` is still the engine's process."""
        known = self._incarnations.get(engine)
        if known is None:
            self._check(engine)
        return known == incarnation

    def replaced(self, processes: Mapping[str, int]) -> str | None:
        """The first engine (in the mapping's order) whose named process is no longer its
        process, or None: ``current`` for every engine of a bucket's 256 at once."""
        incarnations = self._incarnations
        for engine, incarnation in processes.items():
            # current() raises for an unknown engine (whose .get gave None)
            if incarnations.get(engine) != incarnation and not self.current(engine, incarnation):
                return engine
        return None

    def _check(self, engine: str) -> None:
        if engine not in self._states:
            raise ConfigError(
                "engine", f"unknown engine {engine!r}", f"use one of {sorted(self._states)}"
            )

    def _apply(self, engine: str, event: EngineEvent, reason: str) -> EngineTransition:
        old = self.state(engine)
        new = TRANSITIONS.get((old, event))
        if new is None:
            raise TransitionError(
                f"engine {engine}: event {event.value} is not allowed in state {old.value}"
            )
        self._states[engine] = new
        self._serving = tuple(e for e, s in self._states.items() if s is EngineState.SERVING)
        transition = EngineTransition(engine, old, new, event, self._incarnations[engine], reason)
        self._transitions.append(transition)
        return transition

    def started(self, engine: str, incarnation: int, reason: str) -> bool:
        """The world reported a new process; False when it is not newer than the one known."""
        if incarnation <= self.incarnation(engine):
            return False
        self._incarnations[engine] = incarnation
        self._apply(engine, EngineEvent.STARTED, reason)
        return True

    def failed(self, engine: str, incarnation: int, reason: str) -> bool:
        """A call to ``incarnation`` failed; False when that process is old news or gone."""
        if not self.current(engine, incarnation) or self.state(engine) is EngineState.DOWN:
            return False
        self._apply(engine, EngineEvent.FAILED, reason)
        return True

    def synced(self, engine: str, incarnation: int, reason: str) -> bool:
        """An update stamped and resumed ``incarnation``; False if it is no longer current."""
        if not self.current(engine, incarnation) or self.state(engine) is EngineState.DOWN:
            return False
        if self.state(engine) is EngineState.SERVING:
            return True  # a routine update: nothing changes, nothing to record
        self._apply(engine, EngineEvent.SYNCED, reason)
        return True

    def outdated(self, engine: str, reason: str) -> None:
        """The published version is newer than the serving process's weights."""
        if self.state(engine) is EngineState.SERVING:
            self._apply(engine, EngineEvent.OUTDATED, reason)

    def take_transitions(self) -> tuple[EngineTransition, ...]:
        taken, self._transitions = tuple(self._transitions), []
        return taken
