"""The swarm's field bugs: in a share of its seeds, one fault of a kind whose row in
miles_core/fault_kinds.py names an oracle (``caught_by``), drawn with what the kind needs,
from a stream of its own (the rest of a seed's drawing is the same either way, and a seed
that draws none runs exactly as before).

The point: the oracles catch real bugs on their own, under whatever else the seed drew.
The scenario says which oracle must fail (``expect.caught_by``, from the row; the run is
ok when that one failed and every other passed), or that the fault is survived:

- lying_engine (tokenspeed #1373): an engine no other fault strikes answers its weight
  updates with success and loads nothing; published_weights must catch it (a cell killed
  after a bucket goes, with its start: the aborted window would replace the liar unseen).
- delta_skipped, delta_applied_twice: under disk-delta (``--update-weight-transfer-mode
  disk-delta``, the encoding drawn), an engine's next pull applies nothing, or its delta
  twice: published_weights must catch both, but overwrite applied twice, which is
  idempotent and must pass (miles/utils/disk_delta: xor is an involution, overwrite not).
- delta_torn: a version's delta file truncated; every engine's checksum refuses it and the
  update's retry writes it afresh (survived, with fault tolerance to replace the engine
  the abort names).
- raise_holding_lock: under today's miles, cells of two ranks, broadcast: a rank raises
  holding the weight-update ticket lock (miles/utils/distributed_lock.py, 4d412b5a). Its
  row's oracle is liveness, for liveness mode's stall, which the swarm never draws with
  it; here a collective timeout of seconds fails the cell as the member that took no part
  and the update moves to another cell (scenarios/files/field_bugs/lock_held_fails_over.toml):
  survived.

Only under today's miles (the simulator reads engines' weights under today only), and
never with liveness mode, a job's kill or a driver's restart (the caller's skip), a LoRA
adapter (disk-delta refuses one), nor where another fault already strikes what it needs:
the engine it picks, the updater cell, an update's bucket.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from miles_core.disk_delta import DeltaEncoding
from miles_core.fault_kinds import BY_KIND, TAKES_A_CELL_DOWN
from miles_core.kinds import FaultKind, FaultPoint
from miles_core.loop import LoopConfig
from miles_core.oracle_names import CATCHERS
from miles_core.scenario import Expect, WorldShape, derive_seed
from miles_core.scenario.faults import AnyFault, make_fault, target_engine
from miles_core.transfer import TransferMode
from sim.search.shrinker import kept

FIELD_BUG_SHARE = 0.15
"""The share of the swarm's seeds that draw a field bug (where one fits)."""
LOCK_COLLECTIVE_TIMEOUT = 5.0
"""--update-weight-collective-timeout of a seed with raise_holding_lock (seconds, at the
swarm's scale: miles' 30 min would outlast the progress window)."""
MILES_COLLECTIVE_TIMEOUT = LoopConfig(steps=1).update_weight_collective_timeout
"""miles' default; another was drawn for an engine hung mid-broadcast."""
DELTA_KINDS = (FaultKind.DELTA_SKIPPED, FaultKind.DELTA_APPLIED_TWICE, FaultKind.DELTA_TORN)
KINDS = (FaultKind.LYING_ENGINE, *DELTA_KINDS, FaultKind.RAISE_HOLDING_LOCK)


@dataclasses.dataclass(frozen=True)
class FieldBug:
    """What a seed's field bug changes: the loop, the faults, the expectation, and the
    seconds the progress window needs more (none drawn: the inputs unchanged)."""

    loop: LoopConfig
    faults: list[AnyFault]
    expect: Expect = dataclasses.field(default_factory=Expect)
    seconds: float = 0.0


def field_bug(
    seed: int,
    loop: LoopConfig,
    world: WorldShape,
    steps: int,
    faults: list[AnyFault],
) -> FieldBug:
    """One field bug in a share of the seeds where one fits, else the inputs unchanged."""
    stream = random.Random(derive_seed(seed, "swarm.field_bugs"))
    if stream.random() >= FIELD_BUG_SHARE or not loop.today:
        return FieldBug(loop, faults)
    engines = _unstruck_engines(world, faults)
    fits = [k for k in KINDS if _fits(k, loop, world, faults, engines)]
    if not fits:
        return FieldBug(loop, faults)
    kind = stream.choice(KINDS)  # each kind as often where it fits, else one that fits
    kind = kind if kind in fits else stream.choice(fits)
    step = stream.randint(1, max(1, min(int(0.6 * steps), steps - 4)))
    at = {"point": "step_begin", "step": step}
    seconds = 0.0
    if kind is FaultKind.RAISE_HOLDING_LOCK:
        loop = dataclasses.replace(loop, update_weight_collective_timeout=LOCK_COLLECTIVE_TIMEOUT)
        faults = _without_cell_faults(faults) or []
        drawn = [make_fault(kind.value, cell=0, rank=stream.randrange(world.gpus_per_cell), **at)]
        if not loop.mini_ft_controller_on:  # else the controller brings the cell back
            stopped = {"event": "CellStateChanged", "cell": 0, "new": "stopped"}
            drawn.append(make_fault("start_cell", cell=0, after=stopped))
        seconds = 2 * LOCK_COLLECTIVE_TIMEOUT
    else:
        if kind in DELTA_KINDS:
            encoding = stream.choice(list(DeltaEncoding))
            if kind is FaultKind.DELTA_APPLIED_TWICE and loop.use_fault_tolerance:
                encoding = DeltaEncoding.OVERWRITE  # xor's second failure: see _caught_by
            faults = _for_disk(faults) or []
            loop = dataclasses.replace(
                loop,
                transfer_mode=TransferMode.DISK_DELTA,
                update_weight_delta_encoding=encoding,
            )
        if kind is FaultKind.LYING_ENGINE:
            faults = _without_window_aborts(faults) or []
        engines = _unstruck_engines(world, faults)  # a fault gone may free one
        keys = {} if kind is FaultKind.DELTA_TORN else {"engine": stream.choice(engines)}
        drawn = [make_fault(kind.value, **keys, **at)]
    return FieldBug(loop, [*faults, *drawn], Expect(caught_by=_caught_by(kind, loop)), seconds)


def _caught_by(kind: FaultKind, loop: LoopConfig) -> str | None:
    """The oracle its row names, where that is an oracle and the draw leaves the fault
    uncaught by anything else: not raise_holding_lock's liveness (its stall is failed over
    here), not overwrite applied twice (harmless), not delta_torn's checksum (the engine
    refuses the file: survived). xor applied twice is drawn without fault tolerance only:
    with it, the engine whose checkpoint the fault reverted is replaced, and its new process
    pulls onto the same local checkpoint, refused again until the update's retries run out
    (RetriesExhaustedError, seed 661): end_state would fail too, by construction."""
    if kind is FaultKind.RAISE_HOLDING_LOCK:
        return None
    overwrite = loop.update_weight_delta_encoding is DeltaEncoding.OVERWRITE
    if kind is FaultKind.DELTA_APPLIED_TWICE and overwrite:
        return None
    caught = BY_KIND[kind].caught_by
    return caught if caught in CATCHERS else None


def _unstruck_engines(world: WorldShape, faults: list[AnyFault]) -> list[str]:
    """The engines no fault drawn so far strikes."""
    struck = {target_engine(f) for f in faults}
    return [e for e in world.engine_ids if e not in struck]


def _fits(
    kind: FaultKind,
    loop: LoopConfig,
    world: WorldShape,
    faults: list[AnyFault],
    engines: list[str],
) -> bool:
    return FITS[kind](loop, world, faults, engines)


def _lying(loop: LoopConfig, world: WorldShape, faults: list[AnyFault], engines: list[str]) -> bool:
    """Not with a LoRA adapter: the simulator reads no adapter's content (sim/world/
    transport.py ``_loaded``), so published_weights has nothing to compare (seeds 136, 172,
    198, 549, 690, 694, 872 and 905 drew one, unseen: a blind spot, not a catch); and the
    seed's window aborts can go (``_without_window_aborts``)."""
    return (
        bool(engines) and loop.lora_adapter is None and _without_window_aborts(faults) is not None
    )


def _without_window_aborts(faults: list[AnyFault]) -> list[AnyFault] | None:
    """The faults but a trainer cell taken down after an update's bucket, and its start
    (the swarm's motif: armed after step s - 1, started as step s + 2 begins). The window it
    aborts stops every participant (today's ``end_update_weights``), and the lying process,
    replaced before any check read it, lied to no one (seed 2807: fault_witness found it had
    no effect). None where another fault waits on one of them."""
    aborts = [
        f for f in faults if f.kind in TAKES_A_CELL_DOWN and f.point is FaultPoint.AFTER_BUCKET
    ]
    starts = {(f.cell, f.when.after_step + 3) for f in aborts}  # type: ignore[attr-defined]

    def gone(f: AnyFault) -> bool:
        step = getattr(f.when, "step", None)
        paired = f.kind is FaultKind.START_CELL and (f.cell, step) in starts  # type: ignore[attr-defined]
        return f in aborts or paired

    left = kept(faults, [i for i, f in enumerate(faults) if not gone(f)])
    return None if left is None else list(left)


def _delta(loop: LoopConfig, world: WorldShape, faults: list[AnyFault], engines: list[str]) -> bool:
    """disk-delta takes no LoRA adapter; the seed's faults drawn for the broadcast's wire go
    (``_for_disk``), and a hung engine's collective timeout was drawn for it too."""
    hung = loop.update_weight_collective_timeout != MILES_COLLECTIVE_TIMEOUT
    return (
        bool(engines) and loop.lora_adapter is None and not hung and _for_disk(faults) is not None
    )


def _for_disk(faults: list[AnyFault]) -> list[AnyFault] | None:
    """The faults but a slow link (no link carries a pull from disk: seeds 15 and 50 drew
    one with no effect) and an engine restarted after an update's bucket; None where a
    fault waits on one of them, or a cell dies after a bucket (its start is drawn with it)."""
    if any(
        f.kind is not FaultKind.RESTART_ENGINE and f.point is FaultPoint.AFTER_BUCKET
        for f in faults
    ):
        return None
    wire = [f.kind is FaultKind.SLOW_LINK or f.point is FaultPoint.AFTER_BUCKET for f in faults]
    left = kept(faults, [i for i, f in enumerate(faults) if not wire[i]])
    return None if left is None else list(left)


def _torn(loop: LoopConfig, world: WorldShape, faults: list[AnyFault], engines: list[str]) -> bool:
    """The refusing engine is taken out and replaced: fault tolerance's."""
    return _delta(loop, world, faults, engines or ["any"]) and loop.use_fault_tolerance


def _lock(loop: LoopConfig, world: WorldShape, faults: list[AnyFault], engines: list[str]) -> bool:
    """Cells of two ranks or more, broadcast, no collective timeout drawn for a hung engine,
    and the seed's cell faults can go (``_without_cell_faults``)."""
    hung = loop.update_weight_collective_timeout != MILES_COLLECTIVE_TIMEOUT
    broadcast = loop.transfer_mode is TransferMode.BROADCAST
    shaped = world.gpus_per_cell > 1 and world.num_cells > 1 and broadcast and not hung
    return shaped and _without_cell_faults(faults) is not None


def _without_cell_faults(faults: list[AnyFault]) -> list[AnyFault] | None:
    """The faults but those on a cell (a death, a lost heartbeat, a start): the lock's cell
    is cell 0, the updater while it lives, and a second cell down could be a total loss.
    None where another fault waits on one of them."""
    cellish = TAKES_A_CELL_DOWN | {FaultKind.START_CELL}
    left = kept(faults, [i for i, f in enumerate(faults) if f.kind not in cellish])
    return None if left is None else list(left)


FITS: dict[FaultKind, Callable[[LoopConfig, WorldShape, list[AnyFault], list[str]], bool]] = {
    FaultKind.LYING_ENGINE: _lying,
    FaultKind.DELTA_SKIPPED: _delta,
    FaultKind.DELTA_APPLIED_TWICE: _delta,
    FaultKind.DELTA_TORN: _torn,
    FaultKind.RAISE_HOLDING_LOCK: _lock,
}
"""Whether the kind fits the seed's drawing so far."""


__all__ = ["FIELD_BUG_SHARE", "KINDS", "FieldBug", "field_bug"]
