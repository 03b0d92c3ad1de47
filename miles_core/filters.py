"""Dynamic sampling filters (--dynamic-sampling-filter-path): miles' built-ins, or any function.

A filter judges a finished group; a group it rejects is dropped with its
reason, never recycled (regenerating it would be rejected again). miles' two
built-ins (miles/rollout/filter_hub/dynamic_sampling_filters.py) are here, by
miles' dotted path or the function's own name. Any other path is loaded as
miles' ``load_function`` (miles/utils/misc.py) loads it, ``module.function``
through importlib, and called as miles' ``call_dynamic_filter``
(miles/rollout/filter_hub/base_types.py) calls it: ``fn(args, group)``, its answer a
FilterOutput (miles' DynamicFilterOutput: keep, reason) or, as miles' legacy
filters return, a plain truth value. Here ``group`` is this project's Group
(``group.samples()``, ``group.items``). A path that does not import, or names no
synchronous callable, is refused when the flags are checked, before a run starts.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from miles_core.buffer import DynamicFilter, FilterOutput, Group, SampleStatus
from miles_core.errors import ConfigError

MILES_MODULE = "miles.rollout.filter_hub.dynamic_sampling_filters"
FIELD = "dynamic_sampling_filter"
"""The LoopConfig field (--dynamic-sampling-filter-path on a command line) errors name."""


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


def dynamic_filter(name: str | None, args: object = None) -> DynamicFilter | None:
    """The filter a --dynamic-sampling-filter-path names (None: no filter).

    A built-in by name, else the ``module.function`` it names, which is called with
    ``args`` first as miles passes its parsed flags (callers pass their LoopConfig or None).
    """
    if name is None:
        return None
    short = name.removeprefix(MILES_MODULE + ".")
    if short in FILTERS:
        return FILTERS[short]
    return ImportedFilter(name, load_filter(name), args)


@dataclass(frozen=True)
class ImportedFilter:
    """A filter loaded from a dotted path, called as miles' ``call_dynamic_filter`` calls one."""

    path: str
    fn: Callable[..., object] = field(repr=False)
    args: object = field(default=None, repr=False)

    def __call__(self, group: Group) -> FilterOutput:
        return as_filter_output(self.fn(self.args, group))


def as_filter_output(output: object) -> FilterOutput:
    """What a filter returned as a FilterOutput: miles wraps anything that is not a
    DynamicFilterOutput as ``DynamicFilterOutput(keep=output)`` (a legacy bool), and keeps
    by its truth; an object with ``keep`` (and ``reason``) is read as one."""
    if isinstance(output, FilterOutput):
        return output
    if hasattr(output, "keep"):
        reason = getattr(output, "reason", None)
        return FilterOutput(bool(output.keep), None if reason is None else str(reason))
    return FilterOutput(bool(output))


def load_filter(path: str) -> Callable[..., object]:
    """The function at ``module.function``, as miles' ``load_function`` imports it, refused
    with a ConfigError naming the flag when it does not import or is not a plain callable."""
    builtins = [*FILTERS, *(f"{MILES_MODULE}.{n}" for n in FILTERS)]
    fix = f"pass one of miles' built-in filters {builtins} or an importable module.function"
    module_path, _, attr = path.rpartition(".")
    if not module_path or not attr:
        raise ConfigError(FIELD, f"unknown filter {path!r}", fix)
    try:
        module = importlib.import_module(module_path)
    except Exception as error:  # any failure to import: the run must not start
        problem = f"cannot import {module_path!r} for {path!r} ({type(error).__name__}: {error})"
        raise ConfigError(FIELD, problem, fix) from None
    if not hasattr(module, attr):
        raise ConfigError(FIELD, f"module {module_path!r} has no {attr!r}", fix)
    fn = getattr(module, attr)
    if not callable(fn):
        problem = f"{path!r} is not callable (it is a {type(fn).__name__})"
        raise ConfigError(FIELD, problem, f"name a function fn(args, group); {fix}")
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(
            FIELD,
            f"{path!r} is an async function, but the filter is called synchronously on each "
            "put (miles' call_dynamic_filter does not await it either)",
            "make it a plain def fn(args, group)",
        )
    return fn
