"""Where the published configuration lands among a plan's points: its rank by tokens trained
per second, whether it is on the front, how far it is from the best point, and the best
split at its own mode and bound (a search that only offers the published split picks it
trivially; this says whether the model would pick it among the others).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from miles_core.errors import ConfigError
from sim.timing.plan_file import Plan, Point
from sim.timing.plan_published import is_published
from sim.timing.plan_split import split_key, split_label
from sim.timing.planner import PointResult


def point_split_label(point: Point) -> str:
    """trainer:rollout GPUs of the point (or ``colocated N``; ``-`` for an invalid point)."""
    if point.scenario is None:
        return "-"
    w = point.scenario.world
    return split_label(
        w.num_engines, w.gpus_per_engine, w.num_cells, w.gpus_per_cell, point.settings["mode"]
    )


def point_label(point: Point, varying: Sequence[str] = ()) -> str:
    """The split, the mode, the bound, and any other searched setting that varies."""
    s = point.settings
    parts = [point_split_label(point), str(s["mode"])]
    if s["mode"] != "sync":
        parts.append(f"bound {s['max_weight_staleness']}")
    skip = {*SKIPPED_IN_LABEL, "mode", "max_weight_staleness"}
    parts += [f"{k}={s[k]}" for k in varying if k not in skip]
    return " ".join(parts)


SKIPPED_IN_LABEL = ("rollout_share", "trainer_gpus")
"""The split keys: the label shows the split itself."""


def varying_keys(plan: Plan) -> list[str]:
    """The searched settings that take more than one value."""
    return sorted(k for k, v in plan.tables["search"].items() if len(v) > 1)


def published_point(plan: Plan, pts: Sequence[Point]) -> Point | None:
    """The one valid point the plan's [published] names (None: the plan names none)."""
    published = plan.tables.get("published", {})
    if not published:
        return None
    key = split_key(plan.tables["search"])
    found = [p for p in pts if p.scenario is not None and is_published(p.settings, published, key)]
    if len(found) != 1:
        names = sorted(set(varying_keys(plan)) - set(published))
        problem = f"names {len(found)} valid points"
        raise ConfigError("[published]", problem, f"name exactly one: give also {names}")
    return found[0]


@dataclass(frozen=True)
class Landing:
    """The published point among the points that passed every oracle."""

    published: int
    label: str
    ok: bool
    tokens_per_second: float
    rank: int | None
    """1: the most tokens per second; None: its run failed an oracle."""
    of: int
    on_front: bool
    best: int
    best_label: str
    best_tokens_per_second: float
    split_rank: int | None
    """Its rank among the points that differ from it only in the split."""
    split_of: int
    best_split: str
    """The best of those points' split (trainer:rollout)."""

    @property
    def gap(self) -> float:
        """Its tokens per second over the best point's, less one (0: it is the best)."""
        return self.tokens_per_second / self.best_tokens_per_second - 1


def _rank(mine: PointResult, ranked: Sequence[PointResult]) -> int | None:
    return next((i + 1 for i, r in enumerate(ranked) if r is mine), None)


def landing(plan: Plan, results: Sequence[PointResult]) -> Landing | None:
    """Where the published point lands (None: the plan names none, or nothing passed)."""
    pub = published_point(plan, [r.point for r in results])
    ok = sorted((r for r in results if r.ok), key=lambda r: -r.throughput)
    if pub is None or not ok:
        return None
    mine = next(r for r in results if r.point is pub)
    key = split_key(plan.tables["search"])
    siblings = [r for r in ok if _same_but(r.point.settings, pub.settings, key)]
    varying = varying_keys(plan)
    return Landing(
        published=pub.index,
        label=point_label(pub, varying),
        ok=mine.ok,
        tokens_per_second=mine.throughput if mine.runs else 0.0,
        rank=_rank(mine, ok),
        of=len(ok),
        on_front=mine.on_front,
        best=ok[0].point.index,
        best_label=point_label(ok[0].point, varying),
        best_tokens_per_second=ok[0].throughput,
        split_rank=_rank(mine, siblings),
        split_of=len(siblings),
        best_split=point_split_label(siblings[0].point) if siblings else "-",
    )


def _same_but(settings: Mapping[str, Any], other: Mapping[str, Any], key: str) -> bool:
    return all(v == other.get(k) for k, v in settings.items() if k != key)


def landing_lines(land: Landing) -> list[str]:
    """The landing as the command prints it."""
    where = (
        f"rank {land.rank} of {land.of} by tokens/s, {'on' if land.on_front else 'off'} the front"
        if land.ok
        else "its run failed an oracle: off the front"
    )
    best = (
        "it is the best point"
        if land.best == land.published
        else f"{-land.gap:.1%} below the best point, {land.best_label} "
        f"({land.best_tokens_per_second:.1f} tokens/s, point {land.best})"
    )
    return [
        f"published: {land.label} (point {land.published}, "
        f"{land.tokens_per_second:.1f} tokens/s): {where}; {best}",
        f"  at its own settings, split searched: best split {land.best_split}, the published "
        f"one ranks {land.split_rank} of {land.split_of}",
    ]


__all__ = [
    "Landing",
    "landing",
    "landing_lines",
    "point_label",
    "point_split_label",
    "published_point",
    "varying_keys",
]
