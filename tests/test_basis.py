"""Every compared timing figure is labelled by how it was obtained, and counted once
(sim/timing/basis.py, sim/timing/ledger.py; issue 51, item 1)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.timing.anchor_report import predict_all
from sim.timing.anchors import ANCHORS, Anchor, basis_of
from sim.timing.basis import Basis, Compared, tally, within
from sim.timing.ledger import AREAL_ASYNC, ledger
from sim.timing.recovery_anchors import predict_recovery
from sim.timing.run_fit import RunFigures, compare
from sim.timing.speedup_anchors import (
    AREAL_STALENESS,
    COMPARISONS,
    SpeedupPrediction,
    StalenessPrediction,
)


@pytest.mark.parametrize(
    ("ratio", "factor", "met"),
    [
        (0.8, 1.25, True),
        (1.25, 1.25, True),
        (0.79, 1.25, False),
        (0.75, 1.25, False),
        (1 / 1.5, 1.5, True),
        (0.66, 1.5, False),
        (1.51, 1.5, False),
        (0.0, 1.5, False),
    ],
)
def test_a_tolerance_meets_the_same_distance_either_way(ratio: float, factor: float, met: bool):
    assert within(ratio, factor) is met


@given(st.floats(0.01, 100), st.floats(1.0, 10))
def test_a_ratio_and_its_inverse_meet_a_tolerance_together(ratio: float, factor: float) -> None:
    assert within(ratio, factor) == within(1 / ratio, factor)


def test_the_real_run_check_misses_a_quarter_under_as_it_misses_a_quarter_over() -> None:
    """0.78 met the old check (|ratio - 1| <= 0.25) while 1.28 did not; 1/1.28 = 0.78."""
    rows = compare(RunFigures(10.0, 2.0, 5.0), RunFigures(7.8, 2.56, 4.1))
    assert [r["within"] for r in rows] == [False, False, True]


def test_a_derived_figure_counts_with_its_source_once() -> None:
    figures = [
        Compared("a step", "s", 1.1, Basis.PREDICTED, ""),
        Compared("a speedup", "s", 1.4, Basis.PREDICTED, "", derived_from="a step"),
        Compared("b", "s", 0.5, Basis.HELD_OUT, ""),
        Compared("c", "s", 1.3, Basis.HELD_OUT, ""),
    ]
    by = {t.basis: t for t in tally(figures)}
    assert (by[Basis.PREDICTED].figures, by[Basis.PREDICTED].high) == (1, 1.1)
    assert by[Basis.HELD_OUT].met == (0, 1) and by[Basis.HELD_OUT].low == 0.5
    assert [t.basis for t in tally(figures)][:2] == [Basis.HELD_OUT, Basis.PREDICTED]


def test_an_update_rows_label_follows_its_fit_and_what_it_restates() -> None:
    labels = {a.row: basis_of(a)[0] for a in ANCHORS}
    assert labels["miles Kimi-K2 1T 32+32 RDMA P2P"] is Basis.RESTATED  # its own 884 ms
    assert labels["Perplexity Kimi-K2 256 BF16 -> 128 FP8 GPUs, RDMA"] is Basis.PREDICTED
    assert labels["miles GLM-5 744B 16+16 NCCL"] is Basis.HELD_OUT
    extra = Anchor("x", "checkpoint-engine-glm-4.5-air-8xh800-p2p", 1.0, "s", fitted=False)
    assert basis_of(extra)[0] is Basis.PREDICTED


def _speedups() -> list[SpeedupPrediction]:
    """Each comparison at its published steps (the runs take minutes; the labels do not)."""
    return [
        SpeedupPrediction(
            c.row, c.plan, c.sync_step, c.async_step * 1.1, c.sync_step, c.async_step, c.source, ()
        )
        for c in COMPARISONS
    ]


def test_the_ledger_counts_each_published_figure_once_under_one_label() -> None:
    curve = [StalenessPrediction(eta, tps, tps * 0.9, ()) for eta, tps in AREAL_STALENESS]
    figures = ledger(predict_all(), _speedups(), curve, {32: 0.9, 64: 1.0}, predict_recovery())
    primary = [c for c in figures if not c.derived_from]
    assert len({c.figure for c in primary}) == len(primary)  # no figure counted twice
    names = {c.figure for c in primary}
    assert all(
        c.derived_from in names or " and " in c.derived_from for c in figures if c.derived_from
    )
    fitted_rows = [a for a in ANCHORS if a.fitted]
    in_fit = [c for c in figures if c.basis is Basis.FITTED and c.section == "update"]
    assert len(in_fit) == len(fitted_rows) and all(c.derived_from for c in in_fit)
    speedup = [c for c in figures if c.figure.endswith(": speedup")]
    assert len(speedup) == len(COMPARISONS) and all(c.derived_from for c in speedup)
    eta8 = next(c for c in figures if c.figure.endswith("eta 8"))
    assert eta8.derived_from == AREAL_ASYNC and AREAL_ASYNC in names
    recovery = {c.figure: c.basis for c in figures if c.section == "recovery"}
    assert recovery["miles: the heal waits suspended"] is Basis.RESTATED
    assert recovery["miles: a killed cell still shows Healthy"] is Basis.PREDICTED
    assert not any(math.isnan(c.ratio) for c in figures)
