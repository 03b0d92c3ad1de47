"""The impairment timetable both worlds keep: what is slowed (or failing) by how much, until
when.

A fault that impairs a part for a while (a slow cell or link, a router that delays or
fails, a muted heartbeat, a cut link, a slow engine start: miles_core.scenario.schedule's
``impaired_part`` names the part) is an entry here; every world asks it the same
questions at its own clock (``now`` is passed in: the simulator's virtual seconds, the
Ray world's wall seconds since its start), so the two worlds cannot read one window two
ways. Liveness mode's heal ends every window at once.
"""

from __future__ import annotations

_NONE = (1.0, 0.0)
"""A part never impaired: factor 1, a window that ended at time 0."""


class Impairments:
    __slots__ = ("_windows",)

    def __init__(self, windows: dict[str, tuple[float, float]] | None = None) -> None:
        self._windows: dict[str, tuple[float, float]] = dict(windows or {})
        """Part -> (factor, until)."""

    def __bool__(self) -> bool:
        """Whether anything was ever impaired (a world may skip its slow path until then)."""
        return bool(self._windows)

    def copy(self) -> Impairments:
        """The same windows, for a restarted job's new processes (the network's troubles
        outlive a job's death)."""
        return Impairments(self._windows)

    def impair(self, what: str, factor: float, seconds: float, now: float) -> None:
        """Slow ``what`` by ``factor`` for ``seconds`` from ``now`` (the router's delay: add
        factor - 1 seconds; a failing part: any factor)."""
        self._windows[what] = (factor, now + seconds)

    def impaired(self, what: str, now: float) -> bool:
        return now < self._windows.get(what, _NONE)[1]

    def slowdown(self, what: str, now: float) -> float:
        """The factor ``what`` is slowed by now (1 when it is not impaired)."""
        factor, until = self._windows.get(what, _NONE)
        return factor if now < until else 1.0

    def left(self, what: str, now: float) -> float:
        """Seconds until ``what``'s window ends (0 when it is not impaired)."""
        return max(0.0, self._windows.get(what, _NONE)[1] - now)

    def end_all(self, now: float) -> None:
        """Every window ends now (liveness mode's heal)."""
        self._windows = {what: (1.0, now) for what in self._windows}
