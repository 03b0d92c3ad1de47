"""The fully-async data buffer: abort, dynamic and staleness filters, capacity, metrics."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from miles_core.buffer import (
    BufferConfig,
    DataBuffer,
    Fate,
    FilterOutput,
    Group,
    Reason,
    Sample,
    SampleStatus,
    UnusedHandler,
    Verdict,
)
from miles_core.errors import ConfigError, VersionRegressionError

P = "rollout/fully_async/"
DF = "rollout/dynamic_filter/drop_"

_ids = iter(range(10**9))


def group(*versions: int | None, n: int = 1, aborted: bool = False, gid: int | None = None):
    """A group of ``n`` single-turn samples; sample k is stamped with versions[k % len]."""
    gid = next(_ids) if gid is None else gid
    items = []
    for k in range(n):
        v = versions[k % len(versions)]
        status = SampleStatus.ABORTED if aborted and k == 0 else SampleStatus.COMPLETED
        items.append(Sample(index=k, weight_versions=(v,), status=status))
    return Group(group_id=gid, prompt_id=gid, items=tuple(items))


def buffer(**kwargs) -> DataBuffer:
    dynamic_filter = kwargs.pop("dynamic_filter", None)
    kwargs.setdefault("rollout_batch_size", 8)
    return DataBuffer(BufferConfig(**kwargs), dynamic_filter)


def fates(verdicts) -> list[Fate]:
    return [v.fate for v in verdicts]


# --- the staleness filter (the seed report's behaviours) ---------------------------------------


def test_stale_group_recycled():
    buf = buffer(max_weight_staleness=2, unused_samples_handler=UnusedHandler.RETRY)
    old, fresh = group(1), group(9)
    assert buf.put(old).fate is Fate.QUEUED
    assert buf.put(fresh).fate is Fate.QUEUED

    verdicts = buf.get(10)

    assert fates(verdicts) == [Fate.RECYCLE, Fate.TRAIN]
    assert verdicts[0].group is old
    assert verdicts[0].reason is Reason.STALE
    assert verdicts[0].staleness == 10 - 1
    assert verdicts[1].group is fresh
    assert verdicts[1].reason is None
    assert verdicts[1].staleness == 10 - 9
    assert len(buf) == 0
    m = buf.metrics()
    assert m[P + "stale_groups_filtered"] == 1
    assert m[P + "recycled_groups"] == 1
    assert m[P + "dropped_groups"] == 0


def test_stale_group_dropped_with_drop_handler():
    buf = buffer(max_weight_staleness=2, unused_samples_handler=UnusedHandler.DROP)
    old, fresh = group(1), group(8)
    buf.put(old)
    buf.put(fresh)

    verdicts = buf.get(10)

    assert fates(verdicts) == [Fate.DROP, Fate.TRAIN]
    assert verdicts[0].group is old and verdicts[0].reason is Reason.STALE
    assert verdicts[0].staleness == 9
    assert verdicts[1].group is fresh and verdicts[1].staleness == 2
    m = buf.metrics()
    assert m[P + "dropped_groups"] == 1
    assert m[P + "recycled_groups"] == 0


def test_staleness_at_the_bound_is_trained():
    buf = buffer(max_weight_staleness=3)
    g = group(4)
    buf.put(g)
    (verdict,) = buf.get(7)
    assert verdict.fate is Fate.TRAIN and verdict.staleness == 3


def test_bound_zero_trains_only_the_current_version():
    buf = buffer(max_weight_staleness=0, unused_samples_handler="retry")
    a, b = group(4), group(5)
    buf.put(a)
    buf.put(b)
    verdicts = buf.get(5)
    assert [(v.group, v.fate, v.staleness) for v in verdicts] == [
        (a, Fate.RECYCLE, 1),
        (b, Fate.TRAIN, 0),
    ]


def test_all_stale_returns_no_train_and_empties_the_queue():
    buf = buffer(max_weight_staleness=1)
    gs = [group(1), group(2), group(3)]
    for g in gs:
        buf.put(g)
    verdicts = buf.get(10)
    assert [v.group for v in verdicts] == gs
    assert fates(verdicts) == [Fate.DROP] * 3
    assert [v.staleness for v in verdicts] == [9, 8, 7]
    assert len(buf) == 0


def test_get_on_an_empty_buffer_returns_nothing():
    buf = buffer(max_weight_staleness=1)
    assert buf.get(None) == ()
    assert buf.get(3) == ()


def test_get_ignores_unknown_context_keys():
    """Ported from miles' tests/fast/rollout/test_fully_async_rollout.py::
    test_buffer_get_ignores_unknown_context_keys: ``get(**context)`` lets the driver add
    keys without breaking a buffer (miles' ``DefaultDataBuffer.get(current_version=None,
    **_)``). The key it knows is still used and checked."""
    buf = buffer(max_weight_staleness=2)
    first, second = group(1), group(1)
    buf.put(first)
    buf.put(second)
    (verdict,) = buf.get(current_version=1, some_future_key=2)
    assert verdict.group == first and verdict.staleness == 0
    with pytest.raises(VersionRegressionError, match=r"went backwards: 1 -> 0"):
        buf.get(current_version=0, some_future_key=2)
    with pytest.raises(VersionRegressionError, match=r"went backwards: 1 -> None"):
        buf.get(some_future_key=2)  # current_version defaults to None, as in miles
    assert buf.queued() == (second,)


def test_get_without_a_version_before_the_first_update_trains_unfiltered():
    """miles' tests call ``buffer.get()`` with no context (test_buffer_blocks_producer_when_full):
    no version, so no staleness, as ``get(None)``."""
    buf = buffer(max_weight_staleness=0)
    g = group(0)
    buf.put(g)
    assert buf.get() == (Verdict(g, Fate.TRAIN),)


def test_no_bound_trains_any_age_but_records_staleness():
    buf = buffer(max_weight_staleness=None)
    buf.put(group(1))
    (verdict,) = buf.get(100)
    assert verdict.fate is Fate.TRAIN and verdict.staleness == 99
    m = buf.metrics()
    assert m[P + "max_staleness"] == 99
    assert m[P + "staleness_filter_on"] == 0


def test_staleness_filter_off_before_the_first_weight_update():
    buf = buffer(max_weight_staleness=2, unused_samples_handler=UnusedHandler.DROP)
    # Generated from the initial weights (None), and one far "older" than the bound would allow.
    gs = [group(None), group(None, None, n=2), group(0)]
    for g in gs:
        buf.put(g)

    trained = []
    for _ in gs:
        (verdict,) = buf.get(None)
        assert verdict.fate is Fate.TRAIN
        assert verdict.staleness is None
        trained.append(verdict.group)

    assert trained == gs
    m = buf.metrics()
    assert P + "avg_staleness" not in m
    assert P + "max_staleness" not in m
    assert P + "buffer_avg_staleness" not in m
    assert m[P + "staleness_filter_on"] == 0
    assert m[P + "stale_groups_filtered"] == 0
    assert m[P + "dropped_groups"] == 0


def test_staleness_filter_turns_on_after_the_first_update():
    buf = buffer(max_weight_staleness=2)
    assert buf.metrics()[P + "staleness_filter_on"] == 0
    buf.get(1)
    assert buf.metrics()[P + "staleness_filter_on"] == 1


def test_none_version_counts_as_zero_after_the_first_update():
    buf = buffer(max_weight_staleness=2, unused_samples_handler=UnusedHandler.RETRY)
    initial_a, initial_b = group(None), group(None)
    buf.put(initial_a)
    (verdict,) = buf.get(2)
    assert verdict.fate is Fate.TRAIN and verdict.staleness == 2 - 0

    buf.put(initial_b)
    (verdict,) = buf.get(3)
    assert verdict.fate is Fate.RECYCLE and verdict.reason is Reason.STALE
    assert verdict.staleness == 3 - 0


def test_multi_turn_item_oldest_turn_decides_staleness():
    # one trajectory whose turns ran under versions 3, 6 and 7; a second item at 7
    trajectory = (
        Sample(index=0, weight_versions=(3, 6)),
        Sample(index=1, weight_versions=(7,)),
    )
    g = Group(group_id=1, prompt_id=1, items=(trajectory, Sample(index=2, weight_versions=(7,))))
    assert g.oldest_version == 3
    assert g.newest_version == 7
    assert len(list(g.samples())) == 3

    buf = buffer(max_weight_staleness=3, unused_samples_handler=UnusedHandler.DROP)
    buf.put(g)
    (verdict,) = buf.get(7)  # newest is only 0 old, but the oldest turn is 4 old
    assert verdict.fate is Fate.DROP and verdict.staleness == 7 - 3

    buf.put(Group(group_id=2, prompt_id=2, items=(trajectory,)))
    (verdict,) = buf.get(7)
    assert verdict.fate is Fate.DROP and verdict.staleness == 4

    fine = Group(group_id=3, prompt_id=3, items=((Sample(0, (4, 7)),),))
    buf.put(fine)
    (verdict,) = buf.get(7)
    assert verdict.fate is Fate.TRAIN and verdict.staleness == 3


def test_multi_turn_none_turn_counts_as_zero():
    g = Group(1, 1, ((Sample(0, (None, 5)), Sample(1, (6,))),))
    assert g.oldest_version == 0
    assert g.newest_version == 6
    buf = buffer(max_weight_staleness=10)
    buf.put(g)
    (verdict,) = buf.get(6)
    assert verdict.staleness == 6


# --- negative staleness and consumer regressions -----------------------------------------------


def test_negative_staleness_is_refused_and_the_group_stays_queued():
    buf = buffer(max_weight_staleness=2)
    ahead = group(5)
    buf.put(ahead)

    with pytest.raises(VersionRegressionError, match=r"weight version 5 .*consumer's version is 4"):
        buf.get(4)

    assert buf.queued() == (ahead,)
    (verdict,) = buf.get(5)
    assert verdict.group is ahead and verdict.fate is Fate.TRAIN and verdict.staleness == 0


def test_negative_staleness_of_a_later_turn_is_refused():
    # The oldest turn is fine (5 - 3 = 2) but a later turn used version 7 before it was published.
    g = Group(1, 1, ((Sample(0, (3, 7)),),))
    buf = buffer(max_weight_staleness=5)
    buf.put(g)
    with pytest.raises(VersionRegressionError, match=r"group 1 .*version 7 .*version is 5"):
        buf.get(5)
    assert buf.queued() == (g,)


def test_refusal_does_not_lose_stale_groups_queued_ahead():
    # A stale group ahead of the offending one must not be popped and lost by the refusal.
    buf = buffer(max_weight_staleness=2, unused_samples_handler=UnusedHandler.RETRY)
    stale, ahead = group(1), group(9)
    buf.put(stale)
    buf.put(ahead)

    with pytest.raises(VersionRegressionError, match=r"version 9 .*version is 8"):
        buf.get(8)

    assert buf.queued() == (stale, ahead)
    m = buf.metrics()
    assert m[P + "stale_groups_filtered"] == 0
    assert m[P + "recycled_groups"] == 0

    verdicts = buf.get(9)
    assert [(v.group, v.fate) for v in verdicts] == [(stale, Fate.RECYCLE), (ahead, Fate.TRAIN)]


def test_consumer_version_going_backwards_raises():
    buf = buffer(max_weight_staleness=2)
    buf.get(5)
    buf.get(5)  # equal is not backwards
    g = group(5)
    buf.put(g)
    with pytest.raises(VersionRegressionError, match=r"went backwards: 5 -> 4"):
        buf.get(4)
    assert buf.queued() == (g,)


def test_consumer_version_going_back_to_none_raises():
    buf = buffer(max_weight_staleness=2)
    buf.get(3)
    buf.put(group(0))
    with pytest.raises(VersionRegressionError, match=r"went backwards: 3 -> None"):
        buf.get(None)
    assert len(buf) == 1


# --- the abort filter ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("handler", "fate", "counter"),
    [
        (UnusedHandler.RETRY, Fate.RECYCLE, "recycled_groups"),
        (UnusedHandler.DROP, Fate.DROP, "dropped_groups"),
    ],
)
def test_aborted_group_goes_to_the_unused_handler_on_put(handler, fate, counter):
    buf = buffer(unused_samples_handler=handler)
    g = group(3, n=4, aborted=True)
    verdict = buf.put(g)
    assert verdict.fate is fate
    assert verdict.reason is Reason.ABORTED
    assert verdict.group is g
    assert len(buf) == 0
    m = buf.metrics()
    assert m[P + "aborted_groups_filtered"] == 1
    assert m[P + counter] == 1


def test_aborted_sample_may_have_no_weight_versions():
    aborted = Sample(index=0, status=SampleStatus.ABORTED)
    g = Group(1, 1, (aborted, Sample(1, (2,))))
    assert g.aborted
    buf = buffer(unused_samples_handler="retry")
    assert buf.put(g).fate is Fate.RECYCLE


def test_aborted_turn_inside_a_trajectory_aborts_the_group():
    trajectory = (Sample(0, (1,)), Sample(1, (2,), status=SampleStatus.ABORTED))
    g = Group(1, 1, (trajectory,))
    assert g.aborted
    assert buffer().put(g).fate is Fate.DROP


def test_truncated_sample_is_not_aborted():
    g = Group(1, 1, (Sample(0, (1,), status=SampleStatus.TRUNCATED),))
    assert not g.aborted
    assert buffer().put(g).fate is Fate.QUEUED


# --- the dynamic filter -------------------------------------------------------------------------


@pytest.mark.parametrize("handler", [UnusedHandler.RETRY, UnusedHandler.DROP])
def test_dynamic_filter_bool_rejection_is_dropped_even_with_retry(handler):
    seen = []

    def reject_all(g: Group) -> bool:
        seen.append(g)
        return False

    buf = buffer(unused_samples_handler=handler, dynamic_filter=reject_all)
    g = group(1)
    verdict = buf.put(g)
    assert verdict.fate is Fate.DROP
    assert verdict.reason is Reason.DYNAMIC_FILTER
    assert verdict.detail is None
    assert seen == [g]
    assert len(buf) == 0
    m = buf.metrics()
    assert m[P + "dropped_groups"] == 1
    assert m[P + "recycled_groups"] == 0
    assert not any(k.startswith(DF) for k in m)


def test_dynamic_filter_output_reasons_are_counted():
    def by_reward(g: Group) -> FilterOutput:
        rewards = {s.reward for s in g.samples()}
        if rewards == {0.0}:
            return FilterOutput(keep=False, reason="all_zero")
        if rewards == {1.0}:
            return FilterOutput(keep=False, reason="all_one")
        return FilterOutput(keep=True)

    def rewarded(gid: int, *rewards: float) -> Group:
        return Group(gid, gid, tuple(Sample(k, (1,), reward=r) for k, r in enumerate(rewards)))

    buf = buffer(unused_samples_handler=UnusedHandler.RETRY, dynamic_filter=by_reward)
    puts = [
        rewarded(1, 0.0, 0.0),
        rewarded(2, 1.0, 1.0),
        rewarded(3, 0.0, 1.0),
        rewarded(4, 0.0, 0.0),
        rewarded(5, 0.0, 0.0),
    ]
    verdicts = [buf.put(g) for g in puts]
    assert fates(verdicts) == [Fate.DROP, Fate.DROP, Fate.QUEUED, Fate.DROP, Fate.DROP]
    assert [v.detail for v in verdicts] == ["all_zero", "all_one", None, "all_zero", "all_zero"]
    assert all(v.reason is Reason.DYNAMIC_FILTER for v in verdicts if v.fate is Fate.DROP)
    assert buf.queued() == (puts[2],)

    m = buf.metrics()
    assert m[DF + "all_zero"] == 3
    assert m[DF + "all_one"] == 1
    assert m[P + "dropped_groups"] == 4
    assert m[P + "recycled_groups"] == 0
    # the window resets, so the reasons are gone from the next report
    assert not any(k.startswith(DF) for k in buf.metrics())


def test_abort_filter_runs_before_the_dynamic_filter():
    seen = []

    def reject(g: Group) -> bool:
        seen.append(g)
        return False

    buf = buffer(unused_samples_handler=UnusedHandler.RETRY, dynamic_filter=reject)
    verdict = buf.put(group(1, aborted=True))
    assert verdict.fate is Fate.RECYCLE and verdict.reason is Reason.ABORTED
    assert seen == []


def test_dynamic_filter_rejects_before_capacity_blocks():
    buf = buffer(
        rollout_batch_size=1, capacity_factor=1.0, dynamic_filter=lambda g: g.prompt_id != 0
    )
    assert buf.put(group(1, gid=7)).fate is Fate.QUEUED
    assert buf.put(group(1, gid=0)).fate is Fate.DROP
    assert buf.put(group(1, gid=8)).fate is Fate.BLOCKED


# --- capacity and backpressure ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factor", "batch", "expected"),
    [(1.5, 3, 4), (2.0, 4, 8), (2, 5, 10), (0.5, 3, 1), (1.0, 1, 1), (2.5, 3, 7), (0.75, 4, 3)],
)
def test_capacity_is_the_floor_of_factor_times_batch(factor, batch, expected):
    cfg = BufferConfig(rollout_batch_size=batch, capacity_factor=factor)
    assert cfg.capacity == expected
    buf = DataBuffer(cfg)
    assert buf.capacity == expected
    assert buf.metrics()[P + "capacity"] == expected
    verdicts = [buf.put(group(0)) for _ in range(expected + 2)]
    assert fates(verdicts) == [Fate.QUEUED] * expected + [Fate.BLOCKED] * 2
    assert len(buf) == expected


def test_default_capacity_factor_is_two():
    assert BufferConfig(rollout_batch_size=5).capacity == 10


def test_blocked_put_does_not_take_the_group_and_is_accepted_after_a_get():
    buf = buffer(rollout_batch_size=2, capacity_factor=1.0)
    a, b, c = group(None), group(None), group(None)
    assert buf.put(a).fate is Fate.QUEUED
    assert not buf.full
    assert buf.put(b).fate is Fate.QUEUED
    assert buf.full

    verdict = buf.put(c)
    assert verdict.fate is Fate.BLOCKED and verdict.group is c and verdict.reason is None
    assert buf.queued() == (a, b)
    assert buf.put(c).fate is Fate.BLOCKED  # still full

    (trained,) = buf.get(None)
    assert trained.group is a
    assert not buf.full
    assert buf.put(c).fate is Fate.QUEUED
    assert buf.queued() == (b, c)
    m = buf.metrics()
    assert m[P + "blocked_puts"] == 2
    assert m[P + "queue_size"] == 2


# --- metrics ------------------------------------------------------------------------------------


def test_metrics_values_and_window_reset():
    buf = buffer(rollout_batch_size=4, max_weight_staleness=3)  # capacity 8, drop handler
    versions_popped = {"a": 2, "b": 8}  # consumed at 10: ages 8 (stale) and 2 (trained)
    buf.put(group(versions_popped["a"]))
    buf.put(group(versions_popped["b"], 9, n=2))
    verdicts = buf.get(10)
    assert fates(verdicts) == [Fate.DROP, Fate.TRAIN]

    queued_versions = [9, 10, 6]
    for v in queued_versions:
        buf.put(group(v))
    buf.put(group(5, aborted=True))

    ages = [10 - v for v in versions_popped.values()]
    buffer_ages = [10 - v for v in queued_versions]
    m = buf.metrics()
    assert m[P + "queue_size"] == len(queued_versions)
    assert m[P + "capacity"] == 8
    assert m[P + "avg_staleness"] == pytest.approx(sum(ages) / len(ages))  # (8 + 2) / 2
    assert m[P + "max_staleness"] == max(ages)
    assert m[P + "stale_groups_filtered"] == 1
    assert m[P + "aborted_groups_filtered"] == 1
    assert m[P + "dropped_groups"] == 2  # the stale one and the aborted one
    assert m[P + "recycled_groups"] == 0
    assert m[P + "blocked_puts"] == 0
    assert m[P + "staleness_filter_on"] == 1
    assert m[P + "buffer_avg_staleness"] == pytest.approx(sum(buffer_ages) / len(buffer_ages))
    assert m[P + "buffer_max_staleness"] == max(buffer_ages)

    again = buf.metrics()
    assert again[P + "stale_groups_filtered"] == 0
    assert again[P + "aborted_groups_filtered"] == 0
    assert again[P + "dropped_groups"] == 0
    assert P + "avg_staleness" not in again
    assert P + "max_staleness" not in again
    # queue state is not part of the window
    assert again[P + "queue_size"] == len(queued_versions)
    assert again[P + "buffer_max_staleness"] == max(buffer_ages)


def test_metric_names_are_miles_names():
    buf = buffer(max_weight_staleness=1)
    buf.put(group(1))
    buf.put(group(3))
    buf.get(3)
    names = set(buf.metrics())
    expected = {
        P + name
        for name in (
            "queue_size",
            "capacity",
            "avg_staleness",
            "max_staleness",
            "stale_groups_filtered",
            "aborted_groups_filtered",
            "recycled_groups",
            "dropped_groups",
            "blocked_puts",
            "staleness_filter_on",
        )
    }
    assert names == expected  # queue now empty: no buffer_* staleness


# --- groups and configuration -------------------------------------------------------------------


def test_n_samples_per_prompt_mismatch_raises_and_is_not_taken():
    buf = buffer(n_samples_per_prompt=4)
    short = group(1, n=3, gid=42)
    with pytest.raises(ConfigError, match=r"group 42: has 3 items but --n-samples-per-prompt is 4"):
        buf.put(short)
    assert len(buf) == 0
    assert buf.put(group(1, n=4)).fate is Fate.QUEUED


def test_n_samples_counts_trajectories_not_turns():
    trajectory = (Sample(0, (1,)), Sample(1, (1,)), Sample(2, (1,)))
    g = Group(1, 1, (trajectory, trajectory))
    assert buffer(n_samples_per_prompt=2).put(g).fate is Fate.QUEUED


def test_finished_sample_with_empty_weight_versions_is_rejected():
    with pytest.raises(
        ConfigError,
        match=r"group 3 sample 1\.weight_versions: is empty .*meta_info\.weight_version",
    ):
        Group(3, 3, (Sample(0, (1,)), Sample(1, ())))
    with pytest.raises(ConfigError, match=r"sample 0\.weight_versions"):
        Group(4, 4, ((Sample(0, (), status=SampleStatus.TRUNCATED),),))


def test_empty_group_is_rejected():
    with pytest.raises(ConfigError, match=r"group 9: has no samples"):
        Group(9, 9, ())


@pytest.mark.parametrize("bound", [-1, -5, True, 1.5, "2"])
def test_bad_max_weight_staleness_raises(bound):
    with pytest.raises(ConfigError, match=r"^--max-weight-staleness: got .*integer >= 0") as info:
        BufferConfig(rollout_batch_size=4, max_weight_staleness=bound)
    assert info.value.field == "--max-weight-staleness"
    assert repr(bound) in str(info.value)


@pytest.mark.parametrize("factor", [0, 0.0, -1.0, math.nan, math.inf, True, "2"])
def test_bad_capacity_factor_raises(factor):
    with pytest.raises(
        ConfigError, match=r"^--async-data-buffer-capacity-factor: got .*finite number > 0"
    ):
        BufferConfig(rollout_batch_size=4, capacity_factor=factor)


def test_capacity_factor_giving_capacity_zero_raises():
    with pytest.raises(ConfigError) as info:
        BufferConfig(rollout_batch_size=4, capacity_factor=0.2)
    message = str(info.value)
    assert message.startswith("--async-data-buffer-capacity-factor")
    assert "floor(0.2 x rollout_batch_size 4) = 0" in message
    assert "capacity is at least 1" in message


def test_smallest_factor_giving_capacity_one_is_accepted():
    assert BufferConfig(rollout_batch_size=4, capacity_factor=0.25).capacity == 1


@pytest.mark.parametrize("batch", [0, -3, True, 2.0])
def test_bad_rollout_batch_size_raises(batch):
    with pytest.raises(ConfigError, match=r"^--rollout-batch-size: got .*integer >= 1"):
        BufferConfig(rollout_batch_size=batch)


@pytest.mark.parametrize("n", [0, -1, True])
def test_bad_n_samples_per_prompt_raises(n):
    with pytest.raises(ConfigError, match=r"^--n-samples-per-prompt: got .*integer >= 1"):
        BufferConfig(rollout_batch_size=4, n_samples_per_prompt=n)


@pytest.mark.parametrize("handler", ["recycle", "RETRY", "", 1])
def test_bad_unused_handler_raises(handler):
    with pytest.raises(
        ConfigError,
        match=r"^--async-unused-samples-handler: got "
        + re.escape(repr(handler))
        + r"; choose 'retry' or 'drop'",
    ):
        BufferConfig(rollout_batch_size=4, unused_samples_handler=handler)


@pytest.mark.parametrize(("text", "member"), [("retry", UnusedHandler.RETRY), ("drop", "drop")])
def test_handler_given_as_a_string_is_accepted(text, member):
    cfg = BufferConfig(rollout_batch_size=4, unused_samples_handler=text)
    assert cfg.unused_samples_handler is UnusedHandler(member)
    expected = Fate.RECYCLE if text == "retry" else Fate.DROP
    assert DataBuffer(cfg).put(group(1, aborted=True)).fate is expected


def test_default_handler_is_drop():
    assert BufferConfig(rollout_batch_size=1).unused_samples_handler is UnusedHandler.DROP


# --- property: conservation ---------------------------------------------------------------------

_FILTERS = {
    None: None,
    "bool_every_third": lambda g: g.group_id % 3 != 0,
    "output_by_parity": lambda g: FilterOutput(
        keep=g.prompt_id % 2 == 0, reason=None if g.prompt_id % 2 == 0 else "odd"
    ),
}

# A version is drawn as a lag behind the consumer's latest version (-1: one ahead of it, as
# when the producer already runs on weights the consumer has not consumed with yet); None is
# the initial weights.
_lags = st.one_of(st.none(), st.integers(-1, 5))
_item = st.one_of(
    st.tuples(st.lists(_lags, min_size=1, max_size=2), st.just(False)),  # single sample
    st.tuples(st.lists(_lags, min_size=2, max_size=3), st.just(True)),  # trajectory
)
_put = st.tuples(
    st.just("put"),
    st.lists(_item, min_size=1, max_size=3),
    st.sampled_from([False, False, False, True]),  # aborted
)
_get = st.tuples(st.just("get"), st.integers(0, 3), st.booleans())
_op = st.one_of(
    _put,
    _get,
    _put,
    _get,
    st.tuples(st.just("reput"), st.integers(0, 100)),
    st.tuples(st.just("metrics")),
)


def _build(gid: int, items_spec, aborted: bool) -> Group:
    items = []
    index = 0
    for versions, is_trajectory in items_spec:
        if is_trajectory:
            turns = []
            for v in versions:
                turns.append(Sample(index, (v,)))
                index += 1
            items.append(tuple(turns))
        else:
            items.append(Sample(index, tuple(versions)))
            index += 1
    if aborted:
        first = items[0]
        dead = Sample(10_000, (), status=SampleStatus.ABORTED)
        items[0] = (*first, dead) if isinstance(first, tuple) else (first, dead)
    return Group(gid, prompt_id=gid * 7 % 11, items=tuple(items))


def _oldest(items_spec) -> int:
    return min(0 if v is None else v for versions, _ in items_spec for v in versions)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    handler=st.sampled_from(list(UnusedHandler)),
    bound=st.one_of(st.none(), st.integers(0, 4)),
    batch=st.integers(1, 4),
    factor=st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5]),
    filter_name=st.sampled_from(list(_FILTERS)),
    ops=st.lists(_op, min_size=10, max_size=50),
)
def test_every_accepted_group_is_accounted_for_exactly_once(
    handler, bound, batch, factor, filter_name, ops
):
    capacity = math.floor(factor * batch)
    assume(capacity >= 1)
    keep = _FILTERS[filter_name]
    buf = DataBuffer(
        BufferConfig(
            rollout_batch_size=batch,
            capacity_factor=factor,
            max_weight_staleness=bound,
            unused_samples_handler=handler,
        ),
        keep,
    )
    unused_fate = Fate.RECYCLE if handler is UnusedHandler.RETRY else Fate.DROP

    spec: dict[int, tuple] = {}  # group_id -> items spec
    accepted: set[int] = set()  # group ids taken by a non-BLOCKED put
    outcomes: dict[int, list[Fate]] = {}  # terminal fates: TRAIN / RECYCLE / DROP
    blocked: list[Group] = []  # groups waiting to be put again
    model_queue: list[int] = []
    current: int | None = None
    max_generated = -1  # the largest int version generated so far
    window = {"aborted": 0, "stale": 0, "recycled": 0, "dropped": 0, "blocked": 0}
    filter_drops: dict[str, int] = {}

    def filter_says(g: Group) -> tuple[bool, str | None]:
        if keep is None:
            return True, None
        out = keep(g)
        return (out, None) if isinstance(out, bool) else (out.keep, out.reason)

    def do_put(g: Group) -> None:
        _, aborted = spec[g.group_id]
        verdict = buf.put(g)
        assert verdict.group is g
        kept, reason = filter_says(g)
        if aborted:
            assert verdict.fate is unused_fate and verdict.reason is Reason.ABORTED
            window["aborted"] += 1
            window["recycled" if unused_fate is Fate.RECYCLE else "dropped"] += 1
        elif not kept:
            assert verdict.fate is Fate.DROP and verdict.reason is Reason.DYNAMIC_FILTER
            assert verdict.detail == reason
            window["dropped"] += 1
            if reason:
                filter_drops[reason] = filter_drops.get(reason, 0) + 1
        elif len(model_queue) >= capacity:
            assert verdict.fate is Fate.BLOCKED
            window["blocked"] += 1
        else:
            assert verdict.fate is Fate.QUEUED
        if verdict.fate is Fate.BLOCKED:
            assert g not in buf.queued()
            if g not in blocked:
                blocked.append(g)
            return
        assert g.group_id not in accepted, "a group was taken twice"
        accepted.add(g.group_id)
        if g in blocked:
            blocked.remove(g)
        if verdict.fate is Fate.QUEUED:
            model_queue.append(g.group_id)
        else:
            outcomes.setdefault(g.group_id, []).append(verdict.fate)

    next_gid = 0
    for op in ops:
        if op[0] == "put":
            _, lag_spec, aborted = op
            base = current or 0
            items_spec = [
                ([None if lag is None else max(0, base - lag) for lag in lags], is_trajectory)
                for lags, is_trajectory in lag_spec
            ]
            g = _build(next_gid, items_spec, aborted)
            spec[next_gid] = (items_spec, aborted)
            next_gid += 1
            for versions, _ in items_spec:
                max_generated = max([max_generated, *(v for v in versions if v is not None)])
            do_put(g)
        elif op[0] == "reput":
            if blocked:
                do_put(blocked[op[1] % len(blocked)])
        elif op[0] == "get":
            _, bump, stay_unknown = op
            if current is None and max_generated < 0 and stay_unknown:
                version = None
            else:
                version = max(current or 0, max_generated) + bump
            verdicts = buf.get(version)
            current = version
            for i, verdict in enumerate(verdicts):
                gid = verdict.group.group_id
                assert gid == model_queue.pop(0), "the buffer is FIFO"
                outcomes.setdefault(gid, []).append(verdict.fate)
                if version is None:
                    assert verdict.fate is Fate.TRAIN and verdict.staleness is None
                    continue
                age = version - _oldest(spec[gid][0])
                assert verdict.staleness == age
                if verdict.fate is Fate.TRAIN:
                    assert i == len(verdicts) - 1
                    assert age >= 0
                    assert bound is None or age <= bound
                else:
                    assert verdict.fate is unused_fate and verdict.reason is Reason.STALE
                    assert bound is not None and age > bound
                    window["stale"] += 1
                    window["recycled" if unused_fate is Fate.RECYCLE else "dropped"] += 1
            if not verdicts or verdicts[-1].fate is not Fate.TRAIN:
                assert model_queue == []
        else:
            m = buf.metrics()
            assert m[P + "aborted_groups_filtered"] == window["aborted"]
            assert m[P + "stale_groups_filtered"] == window["stale"]
            assert m[P + "recycled_groups"] == window["recycled"]
            assert m[P + "dropped_groups"] == window["dropped"]
            assert m[P + "blocked_puts"] == window["blocked"]
            assert m[P + "queue_size"] == len(model_queue)
            assert {k[len(DF) :]: v for k, v in m.items() if k.startswith(DF)} == filter_drops
            window = dict.fromkeys(window, 0)
            filter_drops = {}
        assert len(buf) <= capacity
        assert [g.group_id for g in buf.queued()] == model_queue

    queued_ids = [g.group_id for g in buf.queued()]
    assert len(queued_ids) == len(set(queued_ids))
    for gid in accepted:
        assert len(outcomes.get(gid, [])) + queued_ids.count(gid) == 1, gid
        assert all(f in (Fate.TRAIN, Fate.RECYCLE, Fate.DROP) for f in outcomes.get(gid, []))
    for g in blocked:
        assert g.group_id not in accepted
        assert g.group_id not in outcomes
        assert g.group_id not in queued_ids
    assert set(outcomes) | set(queued_ids) <= accepted


@pytest.mark.parametrize("version", [-1, True, 1.5, "3"])
def test_sample_versions_must_be_integers(version):
    with pytest.raises(ConfigError, match=r"sample 2\.weight_versions: holds"):
        Sample(index=2, weight_versions=(1, version))


def test_a_group_already_queued_cannot_be_put_again():
    buf = buffer()
    g = group(1, gid=4242)
    buf.put(g)
    with pytest.raises(ConfigError, match="group 4242: is already queued"):
        buf.put(g)
    assert len(buf) == 1


def test_buffer_staleness_can_be_measured_against_the_published_version():
    buf = buffer()
    buf.put(group(2))
    buf.put(group(2))
    assert buf.get(2)[0].staleness == 0
    buf.put(group(4))  # generated after version 4 was published, after the last get
    stale_view = buf.metrics()
    assert stale_view[P + "buffer_avg_staleness"] == (0 + -2) / 2  # measured against 2
    published_view = buf.metrics(current_version=5)
    assert published_view[P + "buffer_avg_staleness"] == (3 + 1) / 2
    assert published_view[P + "buffer_max_staleness"] == 3
    with pytest.raises(VersionRegressionError, match="went backwards: 5 -> 3"):
        buf.metrics(current_version=3)
