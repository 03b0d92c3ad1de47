"""The decisions a run made, read from its event history, so two worlds can be compared.

The simulator and the real backend run the same orchestration, so for the same
scenario they must make the same decisions: which attempts retried or
committed and why, which cells failed, shrank out of the quorum and were
healed, which versions were published by which cell, how the run ended; and
they must observe the same world: which new engine processes the world
reported, and where each engine ended (serving or down). ``Decisions`` holds
exactly that, and nothing that depends on timing.

What does depend on timing is kept apart in ``Rollout``: how many groups were
recycled or dropped and why, and how many updates an engine's death aborted.
Which groups are in flight when an update pauses the engines, and whether an
engine dies before or during an update, depend on generation latencies, which
the simulator draws from its own model; these are reported side by side, not
required to match. An update aborted by a *cell* failure is a decision (the
fault strikes at a named point of the update) and is compared. So is the staleness gate:
whether it armed, and that under it no group was refused as stale (its guarantee, which
holds whatever the timing); how long it held the producer is timing, and reported. So is the
engines' final state, but not the path to it: a real restart takes seconds, in
which requests to the old process fail and take the engine down before the
new process is reported; the simulator's restart is instant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from miles_core.engines import EngineState
from miles_core.events import (
    AttemptEnded,
    CellStateChanged,
    EngineStarted,
    EngineStateChanged,
    Event,
    GateArmed,
    GateReleased,
    GroupDropped,
    GroupRecycled,
    HealBegan,
    HealEnded,
    QuorumChanged,
    RunEnded,
    RunStarted,
    UpdateAborted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.kinds import AbortCause


@dataclass(frozen=True)
class Decisions:
    attempts: tuple[tuple[int, int, str, tuple[int, ...], tuple[int, ...]], ...]
    """(step, attempt, decision, discarded cells, errored cells) per attempt."""
    cells: tuple[tuple[int, str, str], ...]
    """(cell, old state, new state) per transition, in order."""
    quorums: tuple[tuple[int, ...], ...]
    heals: tuple[tuple[int, int, bool], ...]
    """(source cell, destination cell, succeeded)."""
    versions: tuple[tuple[int, int], ...]
    """(version, updater cell) per published version."""
    aborted_updates: tuple[tuple[int, int], ...]
    """(version, updater cell) of each publishing update a cell failure aborted."""
    engines: tuple[tuple[str, tuple[int, ...], str], ...]
    """(engine, new processes the world reported, its state at the end) per engine."""
    status: str
    gate: tuple[bool, int] = (False, 0)
    """(--staleness-policy gate_submission armed, groups refused as stale after it armed)."""

    def differences(self, other: Decisions) -> list[str]:
        """The fields where two runs decided differently, each with both values."""
        return [
            f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
            for name in self.__dataclass_fields__
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass(frozen=True)
class Rollout:
    recycled: tuple[tuple[str, int], ...]
    """(reason, groups) recycled, sorted by reason."""
    dropped: tuple[tuple[str, int], ...]
    updates_aborted_by_engines: int = 0
    gate_held: tuple[int, float] = (0, 0.0)
    """(groups that waited at the staleness gate, seconds it held the producer)."""


def decisions(history: Iterable[Event]) -> Decisions:
    attempts, cells, quorums, heals, versions, aborted = [], [], [], [], [], []
    started: dict[str, list[int]] = {}
    final: dict[str, str] = {}
    updaters: dict[int, tuple[int, bool]] = {}
    heal_sources: dict[int, int] = {}
    status = "running"
    armed, stale_under_gate = False, 0
    for e in history:
        if isinstance(e, GateArmed):
            armed = True
        elif armed and isinstance(e, GroupDropped | GroupRecycled) and e.reason == "stale":
            stale_under_gate += 1
        if isinstance(e, AttemptEnded):
            attempts.append((e.step, e.attempt, e.decision.value, e.discarded, e.errored))
        elif isinstance(e, CellStateChanged):
            cells.append((e.cell, e.old.value, e.new.value))
        elif isinstance(e, QuorumChanged):
            quorums.append(e.members)
        elif isinstance(e, HealBegan):
            heal_sources[e.dst_cell] = e.src_cell
        elif isinstance(e, HealEnded):
            heals.append((heal_sources.get(e.dst_cell, -1), e.dst_cell, e.ok))
        elif isinstance(e, UpdateBegan):
            updaters[e.update_id] = (e.updater, e.publishes)
        elif isinstance(e, VersionPublished):
            versions.append((e.version, e.updater))
        elif isinstance(e, UpdateAborted):
            updater, publishes = updaters.get(e.update_id, (-1, True))
            if publishes and e.cause is AbortCause.CELL:
                aborted.append((e.version, updater))
        elif isinstance(e, RunStarted):
            for engine in e.engines:
                started.setdefault(engine, [])
                final.setdefault(engine, EngineState.SERVING.value)
        elif isinstance(e, EngineStarted):
            started.setdefault(e.engine, []).append(e.incarnation)
        elif isinstance(e, EngineStateChanged):
            final[e.engine] = e.new.value
        elif isinstance(e, RunEnded):
            status = str(e.status)
    engines = tuple(
        (engine, tuple(started.get(engine, ())), final.get(engine, EngineState.SERVING.value))
        for engine in sorted(set(started) | set(final))
    )
    return Decisions(
        tuple(attempts),
        tuple(cells),
        tuple(quorums),
        tuple(heals),
        tuple(versions),
        tuple(aborted),
        engines,
        status,
        (armed, stale_under_gate),
    )


def rollout(history: Iterable[Event]) -> Rollout:
    recycled: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    by_engines, held_groups, held = 0, 0, 0.0
    for e in history:
        if isinstance(e, GateReleased):
            held_groups, held = held_groups + e.groups, held + e.t - e.held_since
        elif isinstance(e, GroupRecycled):
            recycled[e.reason] += 1
        elif isinstance(e, GroupDropped):
            dropped[e.reason] += 1
        elif isinstance(e, UpdateAborted) and e.cause is AbortCause.ENGINE:
            by_engines += 1
    return Rollout(
        tuple(sorted(recycled.items())),
        tuple(sorted(dropped.items())),
        by_engines,
        (held_groups, round(held, 3)),
    )
