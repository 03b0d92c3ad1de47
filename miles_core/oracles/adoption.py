"""A driver hot restart (restart_driver) judged across the join: part of the ``resume`` oracle.

A hot restart keeps every process, so what the per-segment oracles cannot see across the
join is judged here, on the joined history (miles_core.segments):

- the adopted version: the new driver goes on from the last version published before the
  driver died (the trainer held its state at that publish: miles_core.loop.adopt). An older
  one would publish a version again (the engines may already serve it), and the committed
  timeline, cut at the adopted version's publish, would hide that repeat;
- the versions served: an engine process that outlived the driver never serves a lower
  version after a higher one, before and after the join (monotonic_versions judges each
  segment alone).

Without a DriverAdopted it passes.
"""

from __future__ import annotations

from miles_core.event_index import Indexed, select
from miles_core.events import (
    DriverAdopted,
    History,
    JobKilled,
    SampleGenerated,
    VersionPublished,
)
from miles_core.kinds import SampleOutcome
from miles_core.oracles.base import Violation

NAME = "resume"


def adopted(history: History) -> Violation | None:
    """The hot restarts' adopted versions, and the versions served across them."""
    if not select(history, DriverAdopted):
        return None
    return _adopted_versions(history) or _served_across(history)


def _adopted_versions(history: History) -> Violation | None:
    last: Indexed | None = None
    for seq, e in select(history, VersionPublished, DriverAdopted):
        if isinstance(e, VersionPublished):
            last = (seq, e)
            continue
        assert isinstance(e, DriverAdopted)
        had = None if last is None else last[1].version  # type: ignore[attr-defined]
        if e.version != had:
            what = (
                f"the new driver adopted version {e.version}, but the last version published "
                f"before the driver died was {had}: it would publish a version again, or "
                "serve one older than the engines hold"
            )
            return Violation(NAME, what, tuple(p for p in (last, (seq, e)) if p is not None))
    return None


def _served_across(history: History) -> Violation | None:
    """Per engine process, the versions its completed samples report never go down, within
    one job's processes (a JobKilled that is not a driver's own starts new ones)."""
    highest: dict[tuple[str, int], Indexed] = {}
    for seq, e in select(history, SampleGenerated, JobKilled):
        if isinstance(e, JobKilled):
            if type(e) is JobKilled:  # the whole job died: new processes from here
                highest.clear()
            continue
        assert isinstance(e, SampleGenerated)
        if e.outcome is not SampleOutcome.COMPLETED or e.version is None:
            continue
        key = (e.engine, e.incarnation)
        top = highest.get(key)
        if top is not None and e.version < top[1].version:  # type: ignore[attr-defined]
            what = (
                f"{e.engine} (process {e.incarnation}) served version {e.version} after "
                f"version {top[1].version} across a driver restart"  # type: ignore[attr-defined]
            )
            return Violation(NAME, what, (top, (seq, e)))
        if top is None or e.version > top[1].version:  # type: ignore[attr-defined]
            highest[key] = (seq, e)
    return None


__all__ = ["adopted"]
