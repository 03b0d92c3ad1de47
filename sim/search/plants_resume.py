"""Planted bugs of a killed job's resume (sim/search/plants.py's table holds them): each is caught
by
the resume oracle on its own, naming the prompt or the save.

- resume_without_data_state: the resume restores the ledger (and the step) but not what the
  save holds of the data: the cursor starts at prompt 0 again and the pending prompts are
  forgotten, as a world that saved the weights and the ledger only would; prompts trained
  before the save come again (trained twice across the kill);
- resume_drops_pending: the cursor is restored, the save's queued and recycled groups are
  not (miles' own resume: ``RolloutDataSource.load`` restores the cursor alone), so the
  prompts they held are never trained: lost across the kill;
- resume_from_torn_save: the newest save is read whether or not it committed, as a loader
  that lists checkpoint directories instead of reading the tracker would.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from miles_core import saves
from miles_core.loop.producer import Producer
from miles_core.saves import Resume, StoredSave


def resume_without_data_state(mp: Any) -> None:
    def forgets(self: Producer, cursor: int, pending: tuple[int, ...]) -> None:
        del self, cursor, pending  # the data set starts over

    mp.setattr(Producer, "restore", forgets)


def resume_drops_pending(mp: Any) -> None:
    restore = Producer.restore

    def cursor_only(self: Producer, cursor: int, pending: tuple[int, ...]) -> None:
        del pending
        restore(self, cursor, ())

    mp.setattr(Producer, "restore", cursor_only)


def resume_from_torn_save(mp: Any) -> None:
    def newest(listed: Iterable[StoredSave]) -> Resume:
        found = sorted(listed, key=lambda s: s.state.step)
        return Resume(found[-1].state if found else None)

    mp.setattr(saves, "choose_save", newest)


RESUME_PLANTS = {
    "resume_without_data_state": (resume_without_data_state, "resume"),
    "resume_drops_pending": (resume_drops_pending, "resume"),
    "resume_from_torn_save": (resume_from_torn_save, "resume"),
}
"""Plant name -> (the plant, the oracle that must catch it)."""
