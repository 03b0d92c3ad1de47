"""Every figure ``python -m sim predict --anchors`` sets beside a published one, labelled
(sim/timing/basis.py) from the labels each table declares beside its rows: the update rows
(anchors.py), verl's and AReaL's async-vs-sync runs and verl's colocated generation phases
(speedup_anchors.py), AReaL's throughput by staleness, verl's trainer law left out by size,
and miles' recovery windows (recovery_anchors.py). The headline is counted from this list
and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from sim.timing.anchors import ANCHORS, basis_of
from sim.timing.basis import Basis, Compared
from sim.timing.recovery_anchors import RecoveryRow
from sim.timing.speedup_anchors import (
    AREAL,
    AREAL_DERIVED_ETA,
    COMPARISONS,
    SYNC_GENERATION,
    SpeedupPrediction,
    StalenessPrediction,
    staleness_basis,
)


class Prediction(Protocol):
    """An update row's prediction (anchor_report.Prediction, which prints from this list)."""

    row: str
    ratio: float
    held_out: float | None


AREAL_ASYNC = next(f"{c.row}: async step" for c in COMPARISONS if c.source == AREAL)


def update_rows(predictions: Sequence[Prediction]) -> list[Compared]:
    """A fitted row counts by its held-out ratio; the ratio of the fit that saw it is the
    same figure, listed beside it (not counted)."""
    by_row = {a.row: a for a in ANCHORS}
    out = []
    for p in predictions:
        basis, why = basis_of(by_row[p.row])
        ratio = p.held_out if p.held_out is not None else p.ratio
        out.append(Compared(p.row, "update", ratio, basis, why))
        if p.held_out is not None:
            fit = "the full fit, this row in it"
            out.append(Compared(p.row, "update", p.ratio, Basis.FITTED, fit, derived_from=p.row))
    return out


def _weaker(a: Basis, b: Basis) -> Basis:
    order = list(Basis)
    return max(a, b, key=order.index)


def async_rows(speedups: Sequence[SpeedupPrediction]) -> list[Compared]:
    """Each mode's step is a figure, and the sync step's generation phase where it is
    published (a part of the step, but its own column: the one the decode law predicts);
    the speedup is the steps' quotient, counted with them."""
    declared = {c.row: c for c in COMPARISONS}
    out = []
    for s in speedups:
        c = declared[s.row]
        ratios = s.ratios
        sync, fast = f"{s.row}: sync step", f"{s.row}: async step"
        out.append(Compared(sync, "async vs sync", ratios["sync step"], *c.sync_basis))
        if s.sync_generation is not None and s.published_sync_generation:
            ratio = s.sync_generation / s.published_sync_generation
            gen = f"{s.row}: sync generation"
            out.append(Compared(gen, "async vs sync", ratio, *SYNC_GENERATION))
        out.append(Compared(fast, "async vs sync", ratios["async step"], *c.async_basis))
        weaker = _weaker(c.sync_basis[0], c.async_basis[0])
        out.append(
            Compared(
                f"{s.row}: speedup",
                "async vs sync",
                ratios["speedup"],
                weaker,
                "the sync step over the async step",
                derived_from=f"{sync} and {fast}",
            )
        )
    return out


def staleness_rows(curve: Sequence[StalenessPrediction]) -> list[Compared]:
    out = []
    for r in curve:
        derived = AREAL_ASYNC if r.eta == AREAL_DERIVED_ETA else ""
        basis, why = staleness_basis(r.eta)
        figure = f"AReaL Fig. 5c throughput, eta {r.eta}"
        out.append(Compared(figure, "staleness", r.ratio, basis, why, derived))
    return out


def trainer_rows(held_out: Mapping[int, float]) -> list[Compared]:
    why = "the trainer law a + b / GPUs fitted on the other two sizes"
    return [
        Compared(f"verl 7B async update_actor, {g} GPUs", "trainer", r, Basis.HELD_OUT, why)
        for g, r in held_out.items()
    ]


def recovery_rows(rows: Sequence[RecoveryRow]) -> list[Compared]:
    return [Compared(r.row, "recovery", r.ratio, *r.basis) for r in rows]


def ledger(
    predictions: Sequence[Prediction],
    speedups: Sequence[SpeedupPrediction],
    curve: Sequence[StalenessPrediction],
    held_out: Mapping[int, float],
    recovery: Sequence[RecoveryRow],
) -> list[Compared]:
    """Every compared figure, in the command's order."""
    return [
        *update_rows(predictions),
        *async_rows(speedups),
        *staleness_rows(curve),
        *trainer_rows(held_out),
        *recovery_rows(recovery),
    ]


__all__ = ["ledger"]
