"""The trainer:rollout split of a plan's points: a share of the GPUs (``[search]
rollout_share``) or a search over every split the cluster allows (``[search] trainer_gpus``).

    [search]
    trainer_gpus = {step = 16}              # 16, 32, ... up to the GPUs less one step
    trainer_gpus = {from = 32, to = 96, step = 8}
    trainer_gpus = [48, 64, 80]             # or the counts themselves

A count of trainer GPUs is a split when it is whole cells (``gpus_per_cell``) and the GPUs
it leaves are whole engines (``gpus_per_engine``); every other count in the steps is still
a point, not run, whose line says why (a split the search skips is listed, not dropped). A
step that gives no split at all is refused before anything runs. The published split
(``[published] trainer_gpus``) comes first: the sync point, which runs once whatever the
split, runs there, and a reader of a plan's first point per mode (``sim predict --anchors``)
runs the published configuration.

Kept apart from sim/timing/plan_file.py (which imports it) so it reads plain tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from miles_core.errors import ConfigError

SPLIT_KEYS = ("rollout_share", "trainer_gpus")
"""The two ways a plan names its split; a plan uses one."""
RANGE_KEYS = {"from", "to", "step"}


def split_key(search: Mapping[str, Any]) -> str:
    """The one split key the plan's [search] gives."""
    given = [k for k in SPLIT_KEYS if k in search]
    if len(given) != 1:
        problem = "gives both" if given else "gives neither"
        raise ConfigError(
            "[search]",
            f"{problem} of rollout_share and trainer_gpus",
            "give one: a list of shares, or trainer_gpus = {step = N} for every split",
        )
    return given[0]


def _whole(value: Any, field: str, least: int, most: int) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and least <= value <= most
    if not ok:
        raise ConfigError(field, f"got {value!r}", f"pass a whole number from {least} to {most}")
    return int(value)


def _counts(value: Any, gpus: int) -> list[int]:
    """The trainer counts the plan writes: a list, or a table of a step (and its ends)."""
    field = "[search].trainer_gpus"
    if isinstance(value, list) and value:
        return [_whole(v, field, 1, gpus - 1) for v in value]
    if not isinstance(value, dict):
        raise ConfigError(field, f"got {value!r}", "pass a list of counts or {step = N}")
    extra = sorted(set(value) - RANGE_KEYS)
    if extra or "step" not in value:
        raise ConfigError(field, f"got keys {sorted(value)}", "give step (and from, to if need be)")
    step = _whole(value["step"], f"{field}.step", 1, gpus - 1)
    low = _whole(value.get("from", step), f"{field}.from", 1, gpus - 1)
    high = _whole(value.get("to", gpus - 1), f"{field}.to", low, gpus - 1)
    return list(range(low, high + 1, step))


def split_of(gpus: int, per_cell: int, per_engine: int, trainer: int) -> tuple[int, int]:
    """(engines, cells) of ``trainer`` trainer GPUs and the rest generating, or why not."""
    field, rollout = "[search].trainer_gpus", gpus - trainer
    if trainer % per_cell:
        problem = f"{trainer} trainer GPUs are not whole cells of {per_cell}"
    elif rollout % per_engine:
        problem = f"the {rollout} GPUs {trainer} leave are not whole engines of {per_engine}"
    else:
        return rollout // per_engine, trainer // per_cell
    raise ConfigError(field, problem, "the search skips this split")


def expand_trainer_gpus(tables: Mapping[str, Mapping[str, Any]]) -> list[int]:
    """Every count the plan's trainer_gpus gives, the published one first; refused when none
    is a split the cluster allows."""
    gpus = int(tables["cluster"]["gpus"])
    model = tables["model"]
    per_cell, per_engine = int(model["gpus_per_cell"]), int(model["gpus_per_engine"])
    counts = list(dict.fromkeys(_counts(tables["search"]["trainer_gpus"], gpus)))
    reasons = []
    for trainer in counts:
        try:
            split_of(gpus, per_cell, per_engine, trainer)
        except ConfigError as error:
            reasons.append(error.problem)
    if len(reasons) == len(counts):
        raise ConfigError(
            "[search].trainer_gpus",
            f"no count is a split of {gpus} GPUs ({'; '.join(reasons[:3])})",
            f"use counts (or a step) that are whole cells of {per_cell} and leave whole "
            f"engines of {per_engine}",
        )
    published = tables.get("published", {}).get("trainer_gpus")
    if published in counts:
        try:
            split_of(gpus, per_cell, per_engine, published)
        except ConfigError as error:
            raise ConfigError(
                "[published].trainer_gpus", error.problem, "name a split the search runs"
            ) from None
        counts.remove(published)
        counts.insert(0, published)
    return counts


def first_split(tables: Mapping[str, Mapping[str, Any]], key: str) -> Any:
    """The split the sync point runs at: the first listed share, or the first count that is
    a split."""
    values = tables["search"][key]
    if key == "rollout_share":
        return values[0]
    gpus = int(tables["cluster"]["gpus"])
    per_cell, per_engine = (int(tables["model"][k]) for k in ("gpus_per_cell", "gpus_per_engine"))
    for trainer in values:
        try:
            split_of(gpus, per_cell, per_engine, trainer)
            return trainer
        except ConfigError:
            continue
    raise AssertionError("expand_trainer_gpus refuses a search without a split")


def point_split(
    tables: Mapping[str, Mapping[str, Any]], settings: Mapping[str, Any]
) -> tuple[int, int]:
    """(engines, cells) of the point: its split, or (sync, colocated) every GPU as both."""
    gpus = int(tables["cluster"]["gpus"])
    model = tables["model"]
    per_cell, per_engine = int(model["gpus_per_cell"]), int(model["gpus_per_engine"])
    key = split_key(tables["search"])
    value = settings[key]
    if key == "rollout_share" and (
        isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1
    ):
        raise ConfigError("[search].rollout_share", f"got {value!r}", "pass fractions in (0, 1)")
    if settings["mode"] == "sync":  # colocated: every GPU generates, then every GPU trains
        first = first_split(tables, key)
        if value != first:
            raise ConfigError(
                f"[search].{key}",
                f"sync runs colocated on all {gpus} GPUs: the split does not apply",
                f"the point with {key} = {first} runs it",
            )
        return gpus // per_engine, gpus // per_cell
    if key == "trainer_gpus":
        return split_of(gpus, per_cell, per_engine, value)
    engines = int(value * gpus) // per_engine
    cells = (gpus - engines * per_engine) // per_cell
    if engines < 1 or cells < 1:
        raise ConfigError(
            "[search].rollout_share",
            f"{value} of {gpus} GPUs leaves {engines} engine(s) of {per_engine} and {cells} "
            f"cell(s) of {per_cell}",
            "pick a share that leaves room for both",
        )
    return engines, cells


def split_label(engines: int, per_engine: int, cells: int, per_cell: int, mode: str) -> str:
    """trainer:rollout GPUs, as verl writes its splits (sync: colocated on all of them)."""
    if mode == "sync":
        return f"colocated {max(engines * per_engine, cells * per_cell)}"
    return f"{cells * per_cell}:{engines * per_engine}"


__all__ = [
    "SPLIT_KEYS",
    "expand_trainer_gpus",
    "first_split",
    "point_split",
    "split_key",
    "split_label",
    "split_of",
]
