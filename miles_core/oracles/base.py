"""What every oracle returns, and the small helpers they share.

The history's index by event class is miles_core.event_index's (the control side reads it
too); ``forget`` is named here as well, for the drivers that drop it once they have judged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from miles_core.event_index import Indexed, forget, select
from miles_core.events import Event, History, RunEnded, RunStarted
from miles_core.versions import INITIAL_WEIGHTS_VERSION

V = TypeVar("V")


class ByType(dict[type, V | None], Generic[V]):
    """A table keyed by event class that answers for subclasses as ``isinstance`` would.

    An oracle that reads a 100,000-event history dispatches on each event's type
    once (a dict hit) instead of testing it against class after class; a class
    it has not seen is resolved through its MRO once and remembered (None: no
    entry applies).
    """

    def __missing__(self, kind: type) -> V | None:
        value = next((dict.__getitem__(self, b) for b in kind.__mro__[1:] if b in self), None)
        self[kind] = value
        return value


@dataclass(frozen=True)
class Violation:
    oracle: str
    message: str
    evidence: tuple[Indexed, ...] = field(default=())
    """(seq, event) pairs that prove the violation, in history order."""

    def __str__(self) -> str:
        lines = [f"[{self.oracle}] {self.message}"]
        lines += [f"  #{seq} t={event.t}: {event}" for seq, event in self.evidence]
        return "\n".join(lines)


def version_number(version: int | None) -> int:
    """A version for arithmetic: the initial weights count as INITIAL_WEIGHTS_VERSION."""
    return INITIAL_WEIGHTS_VERSION if version is None else version


def first(history: Iterable[Indexed], predicate: Callable[[Event], bool]) -> Indexed | None:
    return next(((s, e) for s, e in history if predicate(e)), None)


def run_started(history: History) -> Indexed | None:
    return next(iter(select(history, RunStarted)), None)


def run_ended(history: History) -> Indexed | None:
    return next(iter(select(history, RunEnded)), None)


Process = tuple[str, int]
"""An engine process: the engine's id and its incarnation."""


@functools.lru_cache(maxsize=64)
def process_set(engines: tuple[str, ...], incarnations: tuple[int, ...]) -> frozenset[Process]:
    """The processes an update event names, as a set, built once per distinct list: every
    event of an update names the same few hundred, and the oracles check them all at
    once (C set operations) before walking them one by one."""
    return frozenset(zip(engines, incarnations, strict=True))


def evidence(*items: Indexed | None) -> tuple[Indexed, ...]:
    """The given (seq, event) pairs that exist, in history order."""
    return tuple(sorted((x for x in items if x is not None), key=lambda x: x[0]))


__all__ = [
    "ByType",
    "Process",
    "Violation",
    "evidence",
    "first",
    "forget",
    "process_set",
    "run_ended",
    "run_started",
    "version_number",
]
