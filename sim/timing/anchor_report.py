"""``python -m sim predict --anchors`` and ``python -m sim calibrate --anchors``: every
published weight-update row against the simulator's prediction, and the fit behind it; and
the async-vs-sync rows of verl and AReaL, each plan file run in the simulator in both modes
(sim/timing/speedup_anchors.py).

    python -m sim predict --anchors [--json]
    python -m sim calibrate --anchors [--json]
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from miles_core.scenario import PRESETS
from miles_core.scenario.anchor_presets import SYSTEM_MODES
from sim.timing.anchors import (
    ANCHORS,
    FIT_GROUPS,
    MISS_FACTOR,
    UNPREDICTED,
    Anchor,
    basis_of,
    fit_group,
    group_of,
    refitted,
    system_of,
    update_terms,
)
from sim.timing.basis import Compared, headline, tally, within
from sim.timing.calibration import predict_update_seconds
from sim.timing.ledger import ledger
from sim.timing.recovery_anchors import (
    RECOVERY_UNPREDICTED,
    predict_recovery,
    print_loop_checks,
    print_recovery,
    print_unpredicted,
)
from sim.timing.recovery_loops import loop_checks
from sim.timing.speedup_anchors import (
    AREAL,
    COMPARISONS,
    SYNC_GENERATION,
    VERL,
    SpeedupPrediction,
    StalenessPrediction,
    areal_staleness,
    run_all,
    runs_needed,
    speedups,
    staleness_basis,
    train_held_out,
)

TERM_NAMES = {
    "fixed": "the fixed cost per update",
    "prepare": "the source's gather, conversion and re-shard",
    "wire": "the wire",
    "land": "the rollout side's load",
}


@dataclass(frozen=True)
class Prediction:
    row: str
    preset: str
    published: float
    predicted: float
    ratio: float
    held_out: float | None
    """Predicted by a fit without this row (None: the row is not fitted)."""
    terms: dict[str, float]
    meets: bool
    """Judged by the held-out ratio where the row is fitted (the one it is counted by)."""
    off: str
    """For a miss: the term that would have to change, and how much."""


def _off(terms: Mapping[str, float], predicted: float, published: float) -> str:
    """The largest term, and the factor that would make the prediction the published
    figure (the other terms as they are)."""
    name, seconds = max(terms.items(), key=lambda kv: kv[1])
    needed = seconds + published - predicted
    return (
        f"{TERM_NAMES[name]} ({seconds:.2f} s) would have to be {needed / seconds:.2f}x "
        f"for {published:.2f} s"
    )


def predict_anchor(anchor: Anchor) -> Prediction:
    preset, system = PRESETS[anchor.preset], system_of(anchor)
    mode = SYSTEM_MODES[system]
    predicted = predict_update_seconds(preset, anchor.bucket_bytes, mode)["seconds"]
    terms = update_terms(preset, system, anchor.bucket_bytes)
    held_out = None
    group = group_of(anchor)
    if anchor.fitted and group is not None:
        figures = fit_group(group, leave_out=anchor.row)
        other = refitted(preset, system, group, figures)
        held_out = predict_update_seconds(other, anchor.bucket_bytes, mode)["seconds"]
    ratio = predicted / anchor.published_seconds
    meets = _meets(ratio if held_out is None else held_out / anchor.published_seconds)
    off = "" if meets else _off(terms, predicted, anchor.published_seconds)
    return Prediction(
        anchor.row,
        anchor.preset,
        anchor.published_seconds,
        predicted,
        ratio,
        None if held_out is None else held_out / anchor.published_seconds,
        terms,
        meets,
        off,
    )


@functools.cache
def predict_all() -> tuple[Prediction, ...]:
    """Every row's prediction (3 s of replays and refits; the anchors are fixed, so once)."""
    return tuple(predict_anchor(a) for a in ANCHORS)


def print_predictions(predictions: Sequence[Prediction]) -> None:
    """The update rows: the ratio of the fit that saw the row ('fitted'), the ratio of the fit
    that left it out ('held out'), the row's label and the verdict on the ratio it counts by."""
    by_row = {a.row: a for a in ANCHORS}
    print(
        f"{'row':52s} {'published':>9s} {'predicted':>9s} {'fitted':>6s} {'held out':>8s} "
        f"{'label':11s} verdict"
    )
    for p in predictions:
        anchor = by_row[p.row]
        fitted = f"{p.ratio:.2f}" if p.held_out is not None else "-"
        held = "-" if p.held_out is None else f"{p.held_out:.2f}"
        verdict = "meets" if p.meets else f"MISS: {p.off}"
        note = f" ({anchor.note})" if anchor.note else ""
        print(
            f"{p.row:52s} {p.published:8.2f}s {p.predicted:8.2f}s {fitted:>6s} {held:>8s} "
            f"{basis_of(anchor)[0].value:11s} {verdict}{note}"
        )
    print(
        "'fitted': predicted by the fit that saw the row; 'held out': by the fit without it, "
        "the ratio a fitted row is judged and counted by. Replay one: python -m sim predict PRESET"
    )
    print(f"\nnot predicted ({len(UNPREDICTED)} rows):")
    for u in UNPREDICTED:
        print(f"  {u.row} ({u.published}; {u.source}): {u.why}")


def print_speedups(rows: list[SpeedupPrediction], held_out: Mapping[int, float]) -> None:
    """The async-vs-sync rows: each mode's steady step and the speedup, against the paper's."""
    print("\nasync vs sync (each row's plan file run in both modes; predicted/published):")
    print(f"{'row':38s} {'sync step':>16s} {'async step':>15s} {'speedup':>11s} {'ratio':>5s}")
    declared = {c.row: c for c in COMPARISONS}
    for p in rows:
        ratios = p.ratios
        verdict = "meets" if all(_meets(r) for r in ratios.values()) else "MISS"
        if p.failed:
            verdict = f"FAILED {', '.join(p.failed)}"
        print(
            f"{p.row:38s} {p.sync_step:6.1f}/{p.published_sync_step:6.1f} s "
            f"{p.async_step:6.1f}/{p.published_async_step:5.1f} s "
            f"{p.speedup:4.2f}/{p.published_speedup:4.2f}x {ratios['speedup']:5.2f}  {verdict}"
        )
        c = declared[p.row]
        for mode, (basis, why) in (("sync", c.sync_basis), ("async", c.async_basis)):
            print(f"{'':4s}{mode} step {basis.value}: {why}")
        if p.sync_generation is not None and p.published_sync_generation:
            ratio = p.sync_generation / p.published_sync_generation
            verdict = "meets" if _meets(ratio) else "MISS"
            print(
                f"{'':4s}sync generation {p.sync_generation:.1f}/{p.published_sync_generation:.1f}"
                f" s {ratio:.2f} {verdict} ({SYNC_GENERATION[0].value}: {SYNC_GENERATION[1]})"
            )
    print(f"sources: {VERL}; {AREAL}")
    trainer = ", ".join(f"{g} GPUs {r:.2f}" for g, r in held_out.items())
    print(f"verl's async trainer step, fitted without its row, over verl's: {trainer}")


def print_staleness(rows: list[StalenessPrediction]) -> None:
    print(f"\nthroughput vs staleness ({AREAL}, plans/areal-1.5b-128-h800.toml):")
    print(f"{'eta':>3s} {'published':>10s} {'predicted':>10s} {'ratio':>5s}")
    for r in rows:
        verdict = "meets" if _meets(r.ratio) else "MISS"
        if r.failed:
            verdict = f"FAILED {', '.join(r.failed)}"
        label = staleness_basis(r.eta)[0].value
        print(
            f"{r.eta:3d} {r.published_tokens_per_second / 1e3:8.1f} k "
            f"{r.tokens_per_second / 1e3:8.1f} k {r.ratio:5.2f}  {verdict} ({label})"
        )


def _meets(ratio: float) -> bool:
    return within(ratio, MISS_FACTOR)


def print_headline(compared: list[Compared]) -> None:
    print("\nevery figure above, counted once by how it was obtained (sim/timing/basis.py):")
    for line in headline(compared).splitlines():
        print(f"  {line}")


def predict_anchors_main(as_json: bool) -> int:
    predictions = predict_all()
    if not as_json:
        print_predictions(predictions)
        needed = len(runs_needed())
        print(f"\nrunning the async-vs-sync rows: {needed} simulations (a few minutes on 2 cores)")
    runs = run_all()
    compared, curve, held_out = speedups(runs), areal_staleness(runs), train_held_out()
    recovery, loops = predict_recovery(), loop_checks()
    figures = ledger(predictions, compared, curve, held_out, recovery)
    if as_json:
        out = {
            "figures": [{**asdict(c), "basis": c.basis.value} for c in figures],
            "headline": [{**asdict(t), "basis": t.basis.value} for t in tally(figures)],
            "rows": [asdict(p) for p in predictions],
            "speedups": [{**asdict(p), "speedup": p.speedup, "ratios": p.ratios} for p in compared],
            "staleness": [{**asdict(r), "ratio": r.ratio} for r in curve],
            "verl_trainer_held_out": held_out,
            "unpredicted": [asdict(u) for u in UNPREDICTED],
            "recovery": [{**asdict(r), "ratio": r.ratio, "meets": r.meets} for r in recovery],
            "recovery_loops": [{**asdict(c), "inside": c.inside} for c in loops],
            "recovery_unpredicted": [asdict(u) for u in RECOVERY_UNPREDICTED],
        }
        print(json.dumps(out, sort_keys=True))
        return 0
    print_speedups(compared, held_out)
    print_staleness(curve)
    print_recovery(recovery)
    print_loop_checks(loops)
    print_unpredicted()
    print_headline(figures)
    return 0


def fit_report() -> dict[str, Any]:
    """Each group's fitted figures, the rows it used and the ratios it leaves."""
    report: dict[str, Any] = {}
    for group, params in FIT_GROUPS.items():
        figures = fit_group(group)
        rows = [a.row for a in ANCHORS if a.fitted and group_of(a) == group]
        report[group] = {
            "figures": {
                p.name: {"field": p.field, "fitted": figures[p.name], "table": p.value()}
                for p in params
            },
            "rows": rows,
            "unknowns": len(params),
        }
    return report


def calibrate_anchors_main(as_json: bool) -> int:
    report = fit_report()
    if as_json:
        print(json.dumps(report, sort_keys=True))
        return 0
    for group, r in report.items():
        print(f"{group}: {len(r['rows'])} rows, {r['unknowns']} unknowns")
        for name, f in r["figures"].items():
            scale, unit = (1e9, "GB/s") if f["field"].endswith("per_second") else (1, "s")
            print(
                f"  {name:28s} {f['field']:26s} fitted {f['fitted'] / scale:8.4g} {unit:4s}"
                f" (table: {f['table'] / scale:.4g})"
            )
    print("the table: miles_core/scenario/anchor_presets.py SYSTEMS")
    print("the rows against it: python -m sim predict --anchors")
    return 0


__all__ = ["Prediction", "calibrate_anchors_main", "predict_all", "predict_anchors_main"]
