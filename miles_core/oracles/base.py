"""What every oracle returns, and the small helpers they share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from miles_core.events import Event, History, RunEnded, RunStarted
from miles_core.versions import INITIAL_WEIGHTS_VERSION

Indexed = tuple[int, Event]


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
    return first(history.indexed(), lambda e: isinstance(e, RunStarted))


def run_ended(history: History) -> Indexed | None:
    return first(history.indexed(), lambda e: isinstance(e, RunEnded))


def evidence(*items: Indexed | None) -> tuple[Indexed, ...]:
    """The given (seq, event) pairs that exist, in history order."""
    return tuple(sorted((x for x in items if x is not None), key=lambda x: x[0]))
