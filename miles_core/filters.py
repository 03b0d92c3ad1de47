"""miles' built-in dynamic sampling filters (--dynamic-sampling-filter-path), by name.

A filter judges a finished group; a group it rejects is dropped with its
reason, never recycled (regenerating it would be rejected again). The names are
miles' (miles/rollout/filter_hub/dynamic_sampling_filters.py), accepted as the
dotted path miles takes or as the function's own name.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from miles_core.buffer import DynamicFilter, FilterOutput, Group, SampleStatus
from miles_core.errors import ConfigError

MILES_MODULE = "miles.rollout.filter_hub.dynamic_sampling_filters"


def check_reward_nonzero_std(group: Group) -> FilterOutput:
    """Keep a group whose rewards differ (GRPO learns nothing from equal ones); miles uses the
    sample standard deviation, so a group of one is rejected too."""
    rewards = [s.reward or 0.0 for s in group.samples()]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > 1e-8
    return FilterOutput(keep, None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_no_aborted(group: Group) -> FilterOutput:
    """Reject a group with any aborted sample."""
    if any(s.status is SampleStatus.ABORTED for s in group.samples()):
        return FilterOutput(False, "group_has_aborted")
    return FilterOutput(True)


FILTERS: Mapping[str, DynamicFilter] = {
    "check_reward_nonzero_std": check_reward_nonzero_std,
    "check_no_aborted": check_no_aborted,
}


def dynamic_filter(name: str | None) -> DynamicFilter | None:
    """The filter a --dynamic-sampling-filter-path names (None: no filter)."""
    if name is None:
        return None
    short = name.removeprefix(MILES_MODULE + ".")
    if short not in FILTERS:
        choices = [*FILTERS, *(f"{MILES_MODULE}.{n}" for n in FILTERS)]
        raise ConfigError(
            "dynamic_sampling_filter",
            f"unknown filter {name!r}",
            f"use one of miles' built-in filters: {choices}",
        )
    return FILTERS[short]
