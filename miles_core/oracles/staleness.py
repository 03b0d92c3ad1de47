"""bounded_staleness: every trained group has 0 <= staleness <= bound.

staleness = the version the consumer drained the group at - the oldest
version any of its samples' tokens was generated under (a request an update
retracted or froze spans several; miles' group_oldest_weight_version) (recomputed here from the
samples, and compared with what the buffer reported). Before the first update
there is no current version and the filter is off: nothing is judged.

Under --staleness-policy gate_submission (a GateArmed event: AReaL's gate,
miles_core.staleness_gate) the bound is kept by not submitting, so a group that
reaches the buffer too old to train means the gate admitted one it should have held:
no group may be dropped or recycled as stale after the gate armed.
"""

from __future__ import annotations

from miles_core.buffer import Reason
from miles_core.event_index import Indexed, select
from miles_core.events import (
    GateArmed,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    GroupTrained,
    History,
    SampleGenerated,
)
from miles_core.oracles.base import Violation, run_started, version_number

NAME = "bounded_staleness"


def _oldest(sample: SampleGenerated) -> int:
    """The oldest version a sample's tokens came from (miles' oldest_weight_version)."""
    versions = sample.versions
    if len(versions) == 1:  # one span (most samples)
        return version_number(versions[0])
    if not versions:  # no spans reported: the reported version
        return version_number(sample.version)
    return min(map(version_number, versions))


def bounded_staleness(history: History, bound: int | None = None) -> Violation | None:
    """Each trained group: 0 <= current version at consumption - oldest sample version <= bound.

    The bound defaults to RunStarted.max_weight_staleness; staleness is recomputed
    from the group's SampleGenerated events and must match what the buffer reported.
    """
    if bound is None:
        started = run_started(history)
        bound = started[1].max_weight_staleness if started else None  # type: ignore[union-attr]
    oldest: dict[int, Indexed] = {}
    oldest_version: dict[int, int] = {}  # _oldest of each group's oldest sample, kept
    got: dict[int, Indexed] = {}
    for seq, e in select(history, SampleGenerated, GroupGot, GroupTrained):
        if isinstance(e, SampleGenerated) and not e.aborted:
            version, prev = _oldest(e), oldest_version.get(e.group_id)
            if prev is None or version < prev:
                oldest[e.group_id], oldest_version[e.group_id] = (seq, e), version
        elif isinstance(e, GroupGot):
            got[e.group_id] = (seq, e)
        elif isinstance(e, GroupTrained):
            consumed = got.get(e.group_id)
            if consumed is None:
                return Violation(
                    NAME,
                    f"group {e.group_id} was trained but never got from the buffer",
                    ((seq, e),),
                )
            current = consumed[1].current_version
            if current is None:
                continue  # before the first update the filter is off
            sample = oldest.get(e.group_id)
            if sample is None:
                return Violation(
                    NAME,
                    f"group {e.group_id} was trained but has no generated sample",
                    (consumed, (seq, e)),
                )
            age = current - _oldest(sample[1])  # type: ignore[arg-type]
            evidence = (sample, consumed, (seq, e))
            if consumed[1].staleness is not None and consumed[1].staleness != age:
                return Violation(
                    NAME,
                    f"group {e.group_id}: the buffer reported staleness {consumed[1].staleness} "
                    f"but its samples give {current} - {_oldest(sample[1])} = {age}",  # type: ignore[arg-type]
                    evidence,
                )
            if age < 0:
                return Violation(
                    NAME,
                    f"group {e.group_id} trained with negative staleness {age}: a sample of "
                    f"version {_oldest(sample[1])} consumed at version {current}",  # type: ignore[arg-type]
                    evidence,
                )
            if bound is not None and age > bound:
                return Violation(
                    NAME,
                    f"group {e.group_id} trained with staleness {age} > bound {bound}",
                    evidence,
                )
    return _gate_let_nothing_stale_through(history)


def _gate_let_nothing_stale_through(history: History) -> Violation | None:
    """Under gate_submission, no group was refused as stale after the gate armed."""
    armed: tuple[int, GateArmed] | None = None
    for seq, e in select(history, GateArmed, GroupDropped, GroupRecycled):
        if isinstance(e, GateArmed):
            armed = armed or (seq, e)
        elif (
            armed is not None
            and isinstance(e, GroupDropped | GroupRecycled)
            and e.reason.split(":")[0] == Reason.STALE
        ):
            fate = "dropped" if isinstance(e, GroupDropped) else "recycled"
            return Violation(
                NAME,
                f"group {e.group_id} was {fate} as stale under --staleness-policy "
                f"gate_submission: the gate (bound {armed[1].max_staleness}) admitted a "
                "group it should have held",
                (armed, (seq, e)),
            )
    return None
