"""What every oracle returns, and the small helpers they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Generic, TypeVar
from weakref import WeakKeyDictionary

from miles_core.events import Event, History, RunEnded, RunStarted
from miles_core.versions import INITIAL_WEIGHTS_VERSION

Indexed = tuple[int, Event]

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


def evidence(*items: Indexed | None) -> tuple[Indexed, ...]:
    """The given (seq, event) pairs that exist, in history order."""
    return tuple(sorted((x for x in items if x is not None), key=lambda x: x[0]))


class _KindIndex:
    """A history's events grouped by class, in history order, grown as the history grows."""

    def __init__(self) -> None:
        self.size = 0
        self.last: Event | None = None
        self.by_kind: dict[type, list[Indexed]] = {}

    def update(self, history: History) -> None:
        size = len(history)
        if size < self.size or (self.size and history[self.size - 1] is not self.last):
            self.size, self.last, self.by_kind = 0, None, {}  # not what it indexed: start over
        by_kind = self.by_kind
        for seq, e in islice(history.indexed(), self.size, None):
            kind = by_kind.get(type(e))
            if kind is None:
                kind = by_kind[type(e)] = []
            kind.append((seq, e))
        self.size = size
        self.last = history[size - 1] if size else None


_INDEXES: WeakKeyDictionary[History, _KindIndex] = WeakKeyDictionary()


def select(history: History, *kinds: type[Event]) -> Sequence[Indexed]:
    """The (seq, event) pairs of the events that are instances of ``kinds``, in history order.

    Every oracle reads the whole history, most of it samples and stamps that
    only some oracles care about; indexing it by class once lets each oracle
    walk only the events it reads, with the same loop it would run over all of
    them. The index is kept per history and extended as the history grows (the
    live checks judge it every few steps).
    """
    index = _INDEXES.get(history)
    if index is None:
        index = _INDEXES[history] = _KindIndex()
    index.update(history)
    runs = [pairs for kind, pairs in index.by_kind.items() if issubclass(kind, kinds)]
    if len(runs) == 1:
        return runs[0]
    return sorted(chain.from_iterable(runs))  # seqs are unique: events are never compared


def forget(history: History) -> None:
    """Drop the history's index (it holds a pair per event): judging is over."""
    _INDEXES.pop(history, None)
