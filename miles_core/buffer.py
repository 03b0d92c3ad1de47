"""The fully-async data buffer's decisions: what is queued, trained, recycled or dropped.

This is miles' ``fully_async_data_buffer.py`` without the asyncio: a FIFO of
prompt groups between the rollout producer and the trainer, and the verdicts
it reaches. Where each decision is made:

- ``put``: a group with a request an engine refused (an input longer than its
  context) is dropped under either handler: generated again, it would be
  refused again, and recycled first it would come back for ever (NeMo-RL
  #3938's one over-long prompt; miles' ``_post`` raises after its tries and the
  run fails). Then the abort filter (a group with any aborted sample goes to the
  unused handler: retry recycles its prompt, drop discards it), then the
  dynamic filter (a rejected group is dropped, never recycled: regenerating it
  would be rejected again), then capacity. A full buffer returns BLOCKED and
  does not take the group: the driver waits for a ``get`` and puts it again
  (backpressure), so nothing accepted is ever lost.
- ``get``: the staleness filter, because staleness depends on *when* the group
  is consumed. staleness = current version - oldest version of any sample or
  turn in the group. With no current version (before the first update) the
  filter is off and no staleness is recorded; a group beyond
  --max-weight-staleness goes to the unused handler and the next one is
  examined. A negative staleness (the consumer is behind a sample) is refused
  with VersionRegressionError before the group leaves the queue.

Capacity is floor(--async-data-buffer-capacity-factor x --rollout-batch-size).
Metric names are miles' (rollout/fully_async/...).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from miles_core.errors import ConfigError, VersionRegressionError, int_at_least
from miles_core.values import frozen_value
from miles_core.versions import INITIAL_WEIGHTS_VERSION, staleness

METRIC_PREFIX = "rollout/fully_async/"
DYNAMIC_FILTER_PREFIX = "rollout/dynamic_filter/drop_"


class SampleStatus(StrEnum):
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    REFUSED = "refused"
    """The engine refused the request (an input longer than its context): no tokens."""


class UnusedHandler(StrEnum):
    """--async-unused-samples-handler: what happens to aborted and stale groups."""

    RETRY = "retry"
    DROP = "drop"


DEFAULT_UNUSED_HANDLER = UnusedHandler.DROP
"""miles' default (miles/utils/arguments.py, --async-unused-samples-handler); the loop's
LoopConfig uses this same value."""


@frozen_value()
class Sample:
    """One response; ``weight_versions`` holds one entry per generate call (turn).

    None in ``weight_versions`` means the engine had never been updated (miles'
    "default"); staleness counts it as INITIAL_WEIGHTS_VERSION.
    """

    index: int
    weight_versions: tuple[int | None, ...] = ()
    status: SampleStatus = SampleStatus.COMPLETED
    reward: float | None = None
    kept_kv: bool = False
    """Later tokens attended to keys and values an older version computed (in_place)."""
    payload: Any = field(default=None, compare=False, repr=False)
    """What the trainer needs and the control plane never reads (token ids, logprobs):
    opaque here, carried from the engine's reply to the train step."""

    def __post_init__(self) -> None:
        for version in self.weight_versions:
            if version is not None and not int_at_least(version, 0):
                raise ConfigError(
                    f"sample {self.index}.weight_versions",
                    f"holds {version!r}",
                    "record the engine's weight_version: an integer >= 0 (0 or None for the "
                    "initial weights)",
                )


Item = Sample | tuple[Sample, ...]
"""A group item: a sample, or the samples of one multi-turn / multi-agent trajectory."""


@dataclass(frozen=True)
class Group:
    """The n samples generated for one prompt; ``group_id`` is unique per generation attempt."""

    group_id: int
    prompt_id: int
    items: tuple[Item, ...]

    def __post_init__(self) -> None:
        if not self.items:
            raise ConfigError(f"group {self.group_id}", "has no samples", "put groups of n samples")
        for sample in self.samples():
            unfinished = sample.status in (SampleStatus.ABORTED, SampleStatus.REFUSED)
            if not unfinished and not sample.weight_versions:
                raise ConfigError(
                    f"group {self.group_id} sample {sample.index}.weight_versions",
                    "is empty for a finished sample",
                    "record meta_info.weight_version of every generate call",
                )

    def samples(self) -> Iterator[Sample]:
        for item in self.items:
            if isinstance(item, Sample):
                yield item
            else:
                yield from item

    @property
    def refused(self) -> bool:
        """An engine refused one of its requests: generated again, it would be refused again."""
        return any(s.status is SampleStatus.REFUSED for s in self.samples())

    @property
    def aborted(self) -> bool:
        for item in self.items:  # not through samples(): the buffer asks on every put
            if isinstance(item, Sample):
                if item.status is SampleStatus.ABORTED:
                    return True
            elif any(s.status is SampleStatus.ABORTED for s in item):
                return True
        return False

    @cached_property
    def _version_range(self) -> tuple[int | None, int | None]:
        versions = [
            INITIAL_WEIGHTS_VERSION if v is None else v
            for s in self.samples()
            for v in s.weight_versions
        ]
        return min(versions, default=None), max(versions, default=None)

    @property
    def oldest_version(self) -> int | None:
        """The oldest weight version of any turn; None if no sample recorded one."""
        return self._version_range[0]

    @property
    def newest_version(self) -> int | None:
        return self._version_range[1]


@dataclass(frozen=True)
class FilterOutput:
    """What a dynamic filter says of a group (miles' DynamicFilterOutput)."""

    keep: bool
    reason: str | None = None


DynamicFilter = Callable[[Group], FilterOutput | bool]


class Fate(StrEnum):
    QUEUED = "queued"
    BLOCKED = "blocked"
    """The buffer is full: the group was not taken; put it again after a get."""
    TRAIN = "train"
    RECYCLE = "recycle"
    DROP = "drop"


class Reason(StrEnum):
    ABORTED = "aborted"
    STALE = "stale"
    DYNAMIC_FILTER = "dynamic_filter"
    REFUSED = "refused"


@dataclass(frozen=True)
class Verdict:
    """The buffer's decision about one group."""

    group: Group
    fate: Fate
    reason: Reason | None = None
    detail: str | None = None
    """The dynamic filter's reason, when it dropped the group."""
    staleness: int | None = None


@dataclass(frozen=True)
class BufferConfig:
    """The flags of miles that configure the buffer."""

    rollout_batch_size: int
    capacity_factor: float = 2.0
    """--async-data-buffer-capacity-factor (miles' default is 2.0)."""
    max_weight_staleness: int | None = None
    """--max-weight-staleness; None turns the staleness filter off."""
    unused_samples_handler: UnusedHandler = DEFAULT_UNUSED_HANDLER
    """--async-unused-samples-handler (miles' default is drop)."""
    n_samples_per_prompt: int | None = None
    """When set, every group must hold exactly this many items."""

    def __post_init__(self) -> None:
        if not int_at_least(self.rollout_batch_size, 1):
            raise ConfigError(
                "--rollout-batch-size", f"got {self.rollout_batch_size!r}", "pass an integer >= 1"
            )
        factor = self.capacity_factor
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not math.isfinite(factor)
            or factor <= 0
        ):
            raise ConfigError(
                "--async-data-buffer-capacity-factor", f"got {factor!r}", "pass a finite number > 0"
            )
        try:
            capacity = self.capacity
        except OverflowError:  # inf, or an integer beyond a float: no buffer holds it
            raise ConfigError(
                "--async-data-buffer-capacity-factor",
                f"floor({factor} x rollout_batch_size {self.rollout_batch_size}) is too large",
                "use a factor and a batch size whose product is a buffer one can hold",
            ) from None
        if capacity < 1:
            raise ConfigError(
                "--async-data-buffer-capacity-factor",
                f"floor({factor} x rollout_batch_size {self.rollout_batch_size}) = {self.capacity}",
                "raise the factor so that the capacity is at least 1",
            )
        bound = self.max_weight_staleness
        if bound is not None and not int_at_least(bound, 0):
            raise ConfigError(
                "--max-weight-staleness",
                f"got {bound!r}",
                "pass an integer >= 0, or leave it unset",
            )
        if not isinstance(self.unused_samples_handler, UnusedHandler):
            try:
                handler = UnusedHandler(self.unused_samples_handler)
            except ValueError:
                raise ConfigError(
                    "--async-unused-samples-handler",
                    f"got {self.unused_samples_handler!r}",
                    "choose 'retry' or 'drop'",
                ) from None
            object.__setattr__(self, "unused_samples_handler", handler)
        n = self.n_samples_per_prompt
        if n is not None and not int_at_least(n, 1):
            raise ConfigError("--n-samples-per-prompt", f"got {n!r}", "pass an integer >= 1")

    @property
    def capacity(self) -> int:
        return math.floor(self.capacity_factor * self.rollout_batch_size)


@dataclass
class _Window:
    """Counters reset by every metrics() call, as in miles."""

    aborted: int = 0
    stale: int = 0
    recycled: int = 0
    dropped: int = 0
    blocked: int = 0
    staleness: list[int] = field(default_factory=list)
    filter_drops: Counter[str] = field(default_factory=Counter)


class DataBuffer:
    """The queue between rollout and training, and every keep/recycle/drop verdict."""

    def __init__(self, config: BufferConfig, dynamic_filter: DynamicFilter | None = None) -> None:
        self.config = config
        self._filter = dynamic_filter
        self._queue: deque[Group] = deque()
        self._queued_ids: set[int] = set()
        self._newest: Counter[int] = Counter()
        """Queued groups by their newest sample version (the ones with a version): whether
        any is newer than the consumer's version is then one max over a few keys, not a
        walk of the queue on every get."""
        self._known_version: int | None = None
        self._window = _Window()

    @property
    def capacity(self) -> int:
        return self.config.capacity

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.capacity

    def queued(self) -> tuple[Group, ...]:
        return tuple(self._queue)

    def _unused(self, group: Group, reason: Reason, staleness_value: int | None = None) -> Verdict:
        if self.config.unused_samples_handler is UnusedHandler.RETRY:
            self._window.recycled += 1
            return Verdict(group, Fate.RECYCLE, reason, staleness=staleness_value)
        self._window.dropped += 1
        return Verdict(group, Fate.DROP, reason, staleness=staleness_value)

    def put(self, group: Group) -> Verdict:
        """Abort filter, dynamic filter, then capacity (BLOCKED means: not taken)."""
        n = self.config.n_samples_per_prompt
        if n is not None and len(group.items) != n:
            raise ConfigError(
                f"group {group.group_id}",
                f"has {len(group.items)} items but --n-samples-per-prompt is {n}",
                "put complete groups only",
            )
        if group.group_id in self._queued_ids:
            raise ConfigError(
                f"group {group.group_id}",
                "is already queued",
                "give every generation attempt its own group_id",
            )
        if group.refused:  # dropped under either handler: a retry would be refused again
            self._window.dropped += 1
            return Verdict(group, Fate.DROP, Reason.REFUSED)
        if group.aborted:
            self._window.aborted += 1
            return self._unused(group, Reason.ABORTED)
        if self._filter is not None:
            output = self._filter(group)
            if isinstance(output, bool):
                output = FilterOutput(keep=output)
            if not output.keep:
                if output.reason:
                    self._window.filter_drops[output.reason] += 1
                self._window.dropped += 1
                return Verdict(group, Fate.DROP, Reason.DYNAMIC_FILTER, detail=output.reason)
        if self.full:
            self._window.blocked += 1
            return Verdict(group, Fate.BLOCKED)
        self._queue.append(group)
        self._queued_ids.add(group.group_id)
        if (newest := group.newest_version) is not None:
            self._newest[newest] += 1
        return Verdict(group, Fate.QUEUED)

    def _check_forward(self, current_version: int | None) -> None:
        known = self._known_version
        if known is not None and (current_version is None or current_version < known):
            off = " (which would turn the staleness filter off)" if current_version is None else ""
            raise VersionRegressionError(
                f"the consumer's weight version went backwards: {known} -> "
                f"{current_version}{off}; pass the ledger's published version"
            )

    def get(self, current_version: int | None = None, **_context: object) -> tuple[Verdict, ...]:
        """Pop groups until one may be trained; stale ones go to the unused handler.

        Returns the verdicts in order: zero or more RECYCLE/DROP for stale
        groups, then at most one TRAIN (none when the queue ran empty). Context keys
        other than ``current_version`` are ignored, as miles' ``DefaultDataBuffer.get(
        current_version=None, **_)`` ignores them: a driver may pass more without breaking
        a buffer that does not read them.
        """
        self._check_forward(current_version)
        if current_version is not None:
            # Checked for every queued group before anything is popped: a refusal must not
            # lose the stale groups already popped ahead of the offending one.
            if max(self._newest, default=current_version) > current_version:
                for group in self._queue:  # the first offender, named
                    newest = group.newest_version
                    if newest is not None and newest > current_version:
                        raise VersionRegressionError(
                            f"group {group.group_id} holds a sample of weight version {newest} "
                            f"but the consumer's version is {current_version}: a version was "
                            "used before it was published; publish before resuming the engines"
                        )
            self._known_version = current_version
        bound = self.config.max_weight_staleness
        verdicts: list[Verdict] = []
        while self._queue:
            group = self._queue.popleft()
            self._queued_ids.discard(group.group_id)
            if (newest := group.newest_version) is not None:
                self._newest[newest] -= 1
                if not self._newest[newest]:
                    del self._newest[newest]
            age = staleness(current_version, group.oldest_version)
            if age is None:
                verdicts.append(Verdict(group, Fate.TRAIN))
                break
            self._window.staleness.append(age)
            if bound is None or age <= bound:
                verdicts.append(Verdict(group, Fate.TRAIN, staleness=age))
                break
            self._window.stale += 1
            verdicts.append(self._unused(group, Reason.STALE, age))
        return tuple(verdicts)

    def metrics(self, current_version: int | None = None) -> dict[str, float]:
        """Metrics under miles' names; the window counters reset on each call.

        avg/max staleness are absent (not 0) when nothing had a staleness, e.g.
        before the first weight update; staleness_filter_on says whether the
        filter could act at all. buffer_*_staleness measure the queue against
        ``current_version`` when given (the published version, which may be
        newer than the last get), else against the version of the last get.
        """
        if current_version is not None:
            self._check_forward(current_version)
            self._known_version = current_version
        window, self._window = self._window, _Window()
        p = METRIC_PREFIX
        result: dict[str, float] = {
            f"{p}queue_size": len(self._queue),
            f"{p}capacity": self.capacity,
            f"{p}aborted_groups_filtered": window.aborted,
            f"{p}stale_groups_filtered": window.stale,
            f"{p}recycled_groups": window.recycled,
            f"{p}dropped_groups": window.dropped,
            f"{p}blocked_puts": window.blocked,
            f"{p}staleness_filter_on": float(
                self.config.max_weight_staleness is not None and self._known_version is not None
            ),
        }
        for reason, count in sorted(window.filter_drops.items()):
            result[f"{DYNAMIC_FILTER_PREFIX}{reason}"] = count
        if window.staleness:
            result[f"{p}avg_staleness"] = sum(window.staleness) / len(window.staleness)
            result[f"{p}max_staleness"] = max(window.staleness)
        queued = [staleness(self._known_version, g.oldest_version) for g in self._queue]
        ages = [a for a in queued if a is not None]
        if ages:
            result[f"{p}buffer_avg_staleness"] = sum(ages) / len(ages)
            result[f"{p}buffer_max_staleness"] = max(ages)
        return result
