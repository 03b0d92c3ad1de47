"""``python -m sim predict --anchors`` and ``python -m sim calibrate --anchors``: every
published weight-update row against the simulator's prediction, and the fit behind it.

    python -m sim predict --anchors [--json]
    python -m sim calibrate --anchors [--json]
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from miles_core.scenario import PRESETS
from miles_core.scenario.anchor_presets import SYSTEM_MODES
from sim.anchors import (
    ANCHORS,
    FIT_GROUPS,
    MISS_FACTOR,
    UNPREDICTED,
    Anchor,
    fit_group,
    group_of,
    refitted,
    system_of,
    update_terms,
)
from sim.calibrate import predict_update_seconds

TERM_NAMES = {
    "fixed": "the fixed cost per update",
    "prepare": "the gather and conversion",
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
    meets = 1 / MISS_FACTOR <= ratio <= MISS_FACTOR
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


def predict_all() -> list[Prediction]:
    return [predict_anchor(a) for a in ANCHORS]


def print_predictions(predictions: list[Prediction]) -> None:
    print(
        f"{'row':52s} {'published':>9s} {'predicted':>9s} {'ratio':>6s} {'held out':>8s}  verdict"
    )
    for p in predictions:
        held = "-" if p.held_out is None else f"{p.held_out:.2f}"
        verdict = "meets" if p.meets else f"MISS: {p.off}"
        print(
            f"{p.row:52s} {p.published:8.2f}s {p.predicted:8.2f}s {p.ratio:6.2f} {held:>8s}"
            f"  {verdict}"
        )
    met = sum(p.meets for p in predictions)
    print(
        f"{met} of {len(predictions)} rows within {MISS_FACTOR}x; 'held out': the ratio when "
        "the row is left out of the fit. Replay one: python -m sim predict PRESET"
    )
    print(f"\nnot predicted ({len(UNPREDICTED)} rows):")
    for u in UNPREDICTED:
        print(f"  {u.row} ({u.published}; {u.source}): {u.why}")


def predict_anchors_main(as_json: bool) -> int:
    predictions = predict_all()
    if as_json:
        out = {
            "rows": [asdict(p) for p in predictions],
            "unpredicted": [asdict(u) for u in UNPREDICTED],
        }
        print(json.dumps(out, sort_keys=True))
        return 0
    print_predictions(predictions)
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
                f"  {name:28s} {f['field']:26s} fitted {f['fitted'] / scale:8.3f} {unit:4s}"
                f" (table: {f['table'] / scale:.3f})"
            )
    print("the table: miles_core/scenario/anchor_presets.py SYSTEMS")
    print("the rows against it: python -m sim predict --anchors")
    return 0


__all__ = ["Prediction", "calibrate_anchors_main", "predict_all", "predict_anchors_main"]
