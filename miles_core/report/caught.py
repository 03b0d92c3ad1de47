"""A run's verdicts held to its scenario's ``expect.caught_by``: the oracle that must catch
its fault (a field bug of the engines' that no control plane gets past: an engine that
lies about its weights, a delta skipped).

Such a run is ok when that oracle failed and every other passed: end_state and
fault_witness judge it as any run (the fault struck, the run ended as expected), and a
consequence of the fault that another oracle would also flag is a failure too (the
swarm draws a caught fault only where none follows by construction: its oracle alone
must see it, sim/search/swarm_field_bugs.py). A run where that oracle passed missed the
fault: the miss is its failure, named after the oracle.
"""

from __future__ import annotations

from miles_core.oracles.base import Violation


def missed(caught_by: str) -> Violation:
    """The verdict of a run whose ``caught_by`` oracle passed."""
    return Violation(
        caught_by,
        f"passed, but the scenario expects it to catch its fault (expect.caught_by = "
        f"{caught_by!r}): the fault went unseen",
    )


def judged(
    verdicts: dict[str, Violation | None], caught_by: str | None
) -> dict[str, Violation | None]:
    """Each oracle's verdict against the expectation (None: as expected): the ``caught_by``
    oracle's violation is what the scenario asks for, its pass a miss; the others as
    judged. Without ``caught_by``: the verdicts themselves."""
    if caught_by is None or caught_by not in verdicts:
        return verdicts
    caught = verdicts[caught_by] is not None
    return verdicts | {caught_by: None if caught else missed(caught_by)}


def caught(verdicts: dict[str, Violation | None], caught_by: str | None) -> tuple[str, ...]:
    """The oracle that caught the fault as the scenario expects (empty: none was asked,
    or it missed)."""
    if caught_by is None or verdicts.get(caught_by) is None:
        return ()
    return (caught_by,)


__all__ = ["caught", "judged", "missed"]
