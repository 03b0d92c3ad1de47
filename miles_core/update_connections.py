"""Each trainer cell's connection to the engines, kept across weight updates as miles keeps it.

miles makes the weight-update group (SGLang's /init_weights_update_group and the
trainer's side of it) in ``connect_rollout_engines`` and keeps it, with the engine
handles it was made for, from update to update. It makes it afresh only where
miles/backends/megatron_utils/actor.py ``update_weights`` says:

- ``has_new_engines``: the rollout manager's flag, set when a new engine process
  is created (server_group.py ``start_engines``) and cleared by the cell that
  connects next (``clear_updatable_has_new_engines``). One flag for the whole
  run: the cell that consumes it is the only one that learns of the new process;
- ``not is_rollout_engines_fresh()``: the cell never connected (its processes
  are new), or its connection was marked stale (``mark_engine_connection_stale``)
  because a refresh reconfigured the cells (``reconfigure_indep_dp``, miles
  #1444). Without that mark, a cell that becomes the updater again after another
  cell consumed the flag keeps a group naming an engine process that is gone.

Here also where the engines to update are not the ones connected (an engine
left rotation, or only a restarted one is synced): a collective needs every
member, so a group for other engines cannot carry the update; and after an
engine failed the cell's attempt (``member_failed``).

The flag is read once per update, before its attempts (miles' group.py
``update_weights`` fetches ``get_updatable_engines_and_lock`` once, then retries):
a cell that a failed attempt left connected does not clear it for the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum


class ConnectReason(StrEnum):
    """Why an update made its cell's group afresh (UpdateGroupConnected.reason)."""

    FIRST = "first"
    """The cell's processes never connected (new, or healed since)."""
    NEW_ENGINES = "new_engines"
    """A new engine process was created since some cell last connected."""
    STALE = "stale"
    """A refresh reconfigured the cells since this one connected (miles #1444)."""
    MEMBER_FAILED = "member_failed"
    """An engine failed the cell's last update attempt: its group lost a member."""
    OTHER_ENGINES = "other_engines"
    """The engines to update are not the ones the group was made for."""


class UpdateConnections:
    """The run's connection state: each cell's group, the stale marks, miles' flag."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[str, int]] = {}
        """Each cell's group: the engine processes it was made for (engine -> incarnation)."""
        self._stale: dict[int, ConnectReason] = {}
        """Cells whose group must be made afresh, and why (STALE or MEMBER_FAILED)."""
        self.has_new_engines = True
        """miles' flag: the engines are new when the run begins."""

    def engines_created(self) -> None:
        """A new engine process exists: whoever connects next must include it."""
        self.has_new_engines = True

    def cell_replaced(self, cell: int) -> None:
        """New processes for ``cell``: the group its old ones held is gone with them."""
        self._groups.pop(cell, None)
        self._stale.pop(cell, None)

    def reconfigured(self, cells: Iterable[int]) -> None:
        """A refresh reconfigured these cells (``mark_engine_connection_stale``)."""
        self._stale.update(dict.fromkeys(cells, ConnectReason.STALE))

    def member_failed(self, cell: int) -> None:
        """An engine failed ``cell``'s update: a group that lost a member is broken (an NCCL
        communicator with a dead rank never completes again), so the retry connects anew.
        miles has no such retry (the cell whose update raised is errored and the next cell
        updates); here the update retries on the same cell without that engine."""
        if cell in self._groups:
            self._stale.setdefault(cell, ConnectReason.MEMBER_FAILED)

    def reason_to_connect(
        self, cell: int, engines: Mapping[str, int], has_new_engines: bool
    ) -> ConnectReason | None:
        """Why ``cell`` must connect before it updates ``engines`` (None: keep its group).
        ``has_new_engines``: the flag as the update read it before its first attempt."""
        group = self._groups.get(cell)
        if group is None:
            return ConnectReason.FIRST
        if has_new_engines:
            return ConnectReason.NEW_ENGINES
        if cell in self._stale:
            return self._stale[cell]
        if group.keys() != engines.keys():
            return ConnectReason.OTHER_ENGINES
        return None

    def group(self, cell: int) -> dict[str, int]:
        """The processes ``cell``'s group was made for (a copy)."""
        return dict(self._groups[cell])

    def connected(self, cell: int, engines: Mapping[str, int]) -> None:
        """``cell`` made its group for ``engines``; the flag is consumed."""
        self._groups[cell] = dict(engines)
        self._stale.pop(cell, None)
        self.has_new_engines = False
