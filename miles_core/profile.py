"""Which miles the control plane follows: ``[miles] profile`` (``--miles-profile``).

miles' rollout side was rebuilt after the snapshot this testbed first followed
(radixark/miles at 31f1ca9, 2026-08-21). Both are kept, so a user on either can ask
what a fault costs them, and so every run recorded before the rebuild replays to the
same history hash:

- ``aug2026``: miles at 31f1ca9. A restarted engine is synced at once
  (``recover_updatable_engines``) and serves; an update's control call that gets no
  answer within the health check's timeout replaces that engine; nothing bounds a
  trainer cell's update.
- ``today`` (the default): the newest consistent set of miles' files readable, the
  cell-isolation line (docs/miles.md says which commit of each module): a rollout
  cell's life is uninitialized -> initializing -> pending weights -> serving (or
  errored, or disposed) (``miles/ray/rollout/cell_state.py``, ``server_cell.py`` at
  b8afde1e); a replacement joins the router only when the next full update marks its
  weights ready (``ServerCell.mark_weights_ready``); an update window starts only when
  every cell is pending weights or serving (``InferenceController._ensure_cells_ready``);
  each control call of an update has ``--update-weight-engine-request-timeout`` and
  gives up only that cell (``rollout_cell_updater.py`` at 3eacefd0).

What each profile changes is decided where the behaviour lives (each site names it);
this module only names the profiles.
"""

from __future__ import annotations

from enum import StrEnum


class MilesProfile(StrEnum):
    AUG2026 = "aug2026"
    """radixark/miles at 31f1ca9 (2026-08-21): the behaviour every run recorded in
    scenarios/history_hashes.txt was made under."""
    TODAY = "today"
    """The cell-isolation line of miles' rollout side (server_cell / cell_state /
    inference_controller at b8afde1e, updater 2209c9c0 -> 6d0ea001, rollout_cell_updater
    3eacefd0, configs 3c07fcdd)."""


DEFAULT_MILES_PROFILE = MilesProfile.TODAY

MILES_COMMITS: dict[MilesProfile, str] = {
    MilesProfile.AUG2026: "radixark/miles@31f1ca9",
    MilesProfile.TODAY: "radixark/miles cell-isolation line (b8afde1e, 6d0ea001, 3eacefd0)",
}
"""What each profile follows, as a run's summary names it."""
