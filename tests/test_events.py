"""The event history: order, canonical form, hash."""

from __future__ import annotations

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    FaultInjected,
    FaultKind,
    History,
    RunEnded,
    RunStatus,
    VersionPublished,
    event_from_dict,
)


def _history() -> History:
    return History(
        [
            FaultInjected(t=0.0, fault=FaultKind.KILL_CELL, cell=1, detail="before allreduce"),
            VersionPublished(t=1.5, update_id=0, version=1, updater=0),
            RunEnded(t=2.0, status=RunStatus.COMPLETED, reason="done", outstanding_prompts=(3, 4)),
        ]
    )


def test_time_never_goes_backwards() -> None:
    history = _history()
    with pytest.raises(ConfigError, match=r"event.t: VersionPublished at t=1.0 is earlier"):
        history.append(VersionPublished(t=1.0, update_id=1, version=2, updater=0))
    assert len(history) == 3


def test_round_trip_through_dicts_keeps_types_and_hash() -> None:
    history = _history()
    again = History.from_dicts(history.to_dicts())
    assert list(again) == list(history)
    assert again[0].fault is FaultKind.KILL_CELL
    assert again[2].outstanding_prompts == (3, 4)
    assert again.hash() == history.hash()


def test_hash_changes_with_any_field() -> None:
    base = _history().hash()
    changed = _history().to_dicts()
    changed[1]["version"] = 2
    assert History.from_dicts(changed).hash() != base
    assert len(base) == 64


def test_unknown_or_incomplete_events_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown event type 'Nope'"):
        event_from_dict({"type": "Nope", "t": 0})
    with pytest.raises(ConfigError, match=r"VersionPublished.updater: is missing"):
        event_from_dict({"type": "VersionPublished", "t": 0, "update_id": 0, "version": 1})
    with pytest.raises(ConfigError, match="append Event instances"):
        History().append({"type": "RunEnded"})  # type: ignore[arg-type]
