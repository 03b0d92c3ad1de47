"""What a plan says its source published: the configuration it ran (``[published]``), and
which of the plan's inputs no source gives (``[sensitivity] assumed``), so the planner can
say where the published choice lands and which assumption moves the answer.

    [published]                # the configuration the source ran (any searched key)
    trainer_gpus = 64
    mode = "fully_async"
    max_weight_staleness = 1

    [sensitivity]              # python -m sim plan FILE --sensitivity
    assumed = ["workload.response_tokens_mean", "timing.link_bytes_per_second"]
    factors = [0.5, 1.5]       # each assumed input is multiplied by each (default 0.5, 1.5)

Every input not listed under ``assumed`` is taken as published (or fitted to published
rows) and is not moved. Kept apart from sim/timing/plan_file.py (which imports it) so it
reads plain tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from miles_core.errors import ConfigError

FACTORS = (0.5, 1.5)
"""The default moves of an assumed input: half and one and a half of it."""
MOVABLE = ("model", "workload", "timing", "faults")
"""The sections whose figures an assumed input may name."""
COUNTS = {"gpus_per_cell", "gpus_per_engine", "rollout_batch_size", "n_samples_per_prompt"}
"""Whole numbers the world is built of: halving them is another cluster, not an input."""
UNSPLIT = ("max_weight_staleness",)
"""Settings a sync point ignores (it trains on the weights that generated its batch)."""


def check_published(
    published: Mapping[str, Any], search: Mapping[str, Sequence[Any]], split: str
) -> None:
    """Each published key names a searched setting and one of its searched values."""
    for key, value in published.items():
        if key not in search:
            raise ConfigError(
                f"[published].{key}", f"{key} is not searched", f"use one of {sorted(search)}"
            )
        if published.get("mode") == "sync" and key in (split, *UNSPLIT):
            continue  # a sync point runs once, whatever the split and the bound
        if value not in search[key]:
            raise ConfigError(
                f"[published].{key}",
                f"{value!r} is not among the searched {list(search[key])}",
                f"search it: add it to [search].{key}",
            )


def is_published(settings: Mapping[str, Any], published: Mapping[str, Any], split: str) -> bool:
    """Whether a point's settings are the published configuration (a sync point: whatever
    its split and bound)."""
    if not published:
        return False
    ignored = {split, *UNSPLIT} if settings.get("mode") == "sync" else set()
    return all(settings.get(k) == v for k, v in published.items() if k not in ignored)


def check_sensitivity(
    tables: Mapping[str, Mapping[str, Any]],
) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """(assumed inputs as ``section.key``, factors), each checked against the plan."""
    table = tables.get("sensitivity", {})
    assumed = table.get("assumed", [])
    if not isinstance(assumed, list):
        raise ConfigError("[sensitivity].assumed", f"got {assumed!r}", 'pass ["section.key", ...]')
    for name in assumed:
        _check_input(tables, name)
    if len(set(assumed)) != len(assumed):
        raise ConfigError("[sensitivity].assumed", f"got {assumed!r}", "name each input once")
    factors = table.get("factors", list(FACTORS))
    good = isinstance(factors, list) and factors
    for f in factors if good else [None]:
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f != 1:
            raise ConfigError(
                "[sensitivity].factors", f"got {factors!r}", "pass numbers > 0, other than 1"
            )
    return tuple(assumed), tuple(float(f) for f in factors)


def _check_input(tables: Mapping[str, Mapping[str, Any]], name: Any) -> None:
    """``section.key`` of a figure the plan gives (a number > 0, not a count)."""
    field = "[sensitivity].assumed"
    section, _, key = name.partition(".") if isinstance(name, str) else ("", "", "")
    if section not in MOVABLE or not key:
        raise ConfigError(field, f"got {name!r}", f"name section.key, a section of {MOVABLE}")
    if key in COUNTS:
        raise ConfigError(field, f"{name} is a count of the world", "name a figure to move")
    if key not in tables.get(section, {}):
        raise ConfigError(
            field, f"{name} is not a figure this plan gives", f"give [{section}].{key} a value"
        )
    value = tables[section][key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(field, f"{name} is {value!r}", "name a figure > 0 to move")


__all__ = ["FACTORS", "check_published", "check_sensitivity", "is_published"]
