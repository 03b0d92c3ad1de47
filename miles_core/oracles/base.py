"""What every oracle returns, and the small helpers they share."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
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


class _KindIndex:
    """A history's events by class (the positions of each class's events, in history order),
    grown as the history grows.

    It keeps a position per event, not a (seq, event) pair: a million-event history
    indexed as pairs allocates a million tuples, and the collector walks them all.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.by_kind: defaultdict[type, list[int]] = defaultdict(list)

    def update(self, history: History) -> None:
        events = self.events
        if len(history) < len(events) or (events and history[len(events) - 1] is not events[-1]):
            events = self.events = []  # not what it indexed: start over
            self.by_kind.clear()
        start = len(events)
        events.extend(islice(history, start, None))
        by_kind = self.by_kind
        for seq, kind in enumerate(map(type, islice(events, start, None)), start):
            by_kind[kind].append(seq)


class Selection(Sequence[Indexed]):
    """The (seq, event) pairs at some positions of a history, in history order.

    Iterating makes no pair that the loop does not keep (zip reuses its tuple).
    """

    __slots__ = ("_events", "_seqs")

    def __init__(self, seqs: list[int], events: list[Event]) -> None:
        self._seqs, self._events = seqs, events

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Indexed]:
        return zip(self._seqs, map(self._events.__getitem__, self._seqs), strict=True)

    def __getitem__(self, i: int) -> Indexed:  # type: ignore[override]
        seq = self._seqs[i]
        return seq, self._events[seq]


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
    runs = [seqs for kind, seqs in index.by_kind.items() if issubclass(kind, kinds)]
    if len(runs) == 1:
        return Selection(runs[0], index.events)
    return Selection(sorted(chain.from_iterable(runs)), index.events)


def forget(history: History) -> None:
    """Drop the history's index (it holds a pair per event): judging is over."""
    _INDEXES.pop(history, None)
