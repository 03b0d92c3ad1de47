"""What the run's history holds in the driver's memory: bytes an event, measured over a
spread of the events themselves, so that the soak can tell the driver's growth by design (a
history that grows with the run, every event kept for the oracles at the end) from a leak
(whatever else grows).

An event's bytes are its object's and those of the values only it holds (floats, strings,
tuples): a value shared with another event of the spread (an enum member, an interned
engine id, None) counts once, as it is held once. The figure is an estimate from at most
``SPREAD`` events taken evenly through the history.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Sequence

from miles_core.events import Event

SPREAD = 20_000
"""Events measured at most, evenly spaced: a deep walk of 600,000 took seconds."""
POINTER_BYTES = 8
"""The history's list holds a pointer to each event."""


def _deep(value: object, seen: set[int]) -> int:
    if id(value) in seen:
        return 0
    seen.add(id(value))
    size = sys.getsizeof(value)
    if isinstance(value, tuple | list | frozenset | set):
        size += sum(_deep(item, seen) for item in value)
    elif isinstance(value, dict):
        size += sum(_deep(k, seen) + _deep(v, seen) for k, v in value.items())
    return size


@functools.cache
def _fields(cls: type[Event]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def bytes_per_event(events: Sequence[Event]) -> float:
    """The mean bytes an event of ``events`` holds (0.0 for none)."""
    if not events:
        return 0.0
    stride = max(1, len(events) // SPREAD)
    taken = events[::stride]
    seen: set[int] = set()
    total = 0
    for event in taken:
        total += POINTER_BYTES + sys.getsizeof(event)
        seen.add(id(event))
        for name in _fields(type(event)):
            total += _deep(getattr(event, name), seen)
    return total / len(taken)
