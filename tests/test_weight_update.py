"""The weight-update plan: one step order for the full and LoRA paths, enforced step by step."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.errors import TransitionError
from miles_core.kinds import PauseMode
from miles_core.weight_update import (
    BeginUpdate,
    EndUpdate,
    FlushCache,
    PauseEngines,
    PublishVersion,
    ResumeEngines,
    SendBucket,
    StampEngines,
    UnloadAdapter,
    UpdateKind,
    WeightUpdate,
    plan_update_actions,
)

ENGINES = ("engine-0", "engine-1", "engine-2")


def index_of(steps, step_type) -> list[int]:
    return [i for i, s in enumerate(steps) if isinstance(s, step_type)]


def opening(engines=ENGINES, mode=PauseMode.RETRACT) -> list:
    """miles' _pause_and_prepare_engines: pause, flush unless in_place, begin the session."""
    flush = [] if mode is PauseMode.IN_PLACE else [FlushCache(engines)]
    return [PauseEngines(engines, mode), *flush, BeginUpdate(engines)]


# --- the plan -----------------------------------------------------------------------------------


def test_full_plan_order():
    steps = plan_update_actions(7, ENGINES, n_buckets=3)
    assert steps == (
        PauseEngines(ENGINES, PauseMode.RETRACT),
        FlushCache(ENGINES),
        BeginUpdate(ENGINES),
        SendBucket(0, 3, ENGINES),
        SendBucket(1, 3, ENGINES),
        SendBucket(2, 3, ENGINES),
        StampEngines(7, ENGINES),
        EndUpdate(ENGINES),
        PublishVersion(7),
        ResumeEngines(ENGINES),
    )


@pytest.mark.parametrize("mode", list(PauseMode))
def test_the_cache_is_flushed_unless_in_place(mode):
    """miles #1497: SGLang refuses to flush while in_place's frozen requests hold KV."""
    steps = plan_update_actions(2, ENGINES, 1, pause_mode=mode)
    assert steps[0] == PauseEngines(ENGINES, mode)
    flushes = index_of(steps, FlushCache)
    assert flushes == ([] if mode is PauseMode.IN_PLACE else [1])
    assert list(steps[: len(opening(mode=mode))]) == opening(mode=mode)


def test_pause_mode_may_be_given_as_its_flag_string():
    assert plan_update_actions(2, ENGINES, 1, pause_mode="in_place")[0].mode is PauseMode.IN_PLACE
    with pytest.raises(ValueError, match="pause"):
        plan_update_actions(2, ENGINES, 1, pause_mode="pause")


def test_full_is_the_default_kind():
    assert plan_update_actions(2, ENGINES, 1) == plan_update_actions(2, ENGINES, 1, UpdateKind.FULL)


def test_lora_plan_order():
    steps = plan_update_actions(7, ENGINES, n_buckets=2, kind=UpdateKind.LORA, adapter="policy")
    assert steps == (
        *opening(),
        UnloadAdapter(ENGINES, "policy"),
        SendBucket(0, 2, ENGINES),
        SendBucket(1, 2, ENGINES),
        StampEngines(7, ENGINES),
        EndUpdate(ENGINES),
        PublishVersion(7),
        ResumeEngines(ENGINES),
    )


def test_lora_path_stamps_the_engine_version():
    full = plan_update_actions(12, ENGINES, 4)
    lora = plan_update_actions(12, ENGINES, 4, UpdateKind.LORA, adapter="a")
    stamps = {}
    for name, steps in (("full", full), ("lora", lora)):
        found = [s for s in steps if isinstance(s, StampEngines)]
        assert len(found) == 1, name
        assert found[0].version == 12
        assert found[0].engines == ENGINES
        stamps[name] = found[0]
    assert stamps["full"] == stamps["lora"]


@pytest.mark.parametrize("n_buckets", [1, 2, 5])
@pytest.mark.parametrize(("kind", "adapter"), [(UpdateKind.FULL, None), (UpdateKind.LORA, "x")])
def test_stamp_comes_before_publish_and_publish_before_resume(n_buckets, kind, adapter):
    steps = plan_update_actions(3, ENGINES, n_buckets, kind, adapter)
    (pause,) = index_of(steps, PauseEngines)
    (stamp,) = index_of(steps, StampEngines)
    (publish,) = index_of(steps, PublishVersion)
    (resume,) = index_of(steps, ResumeEngines)
    buckets = index_of(steps, SendBucket)
    (begin,) = index_of(steps, BeginUpdate)
    (end,) = index_of(steps, EndUpdate)
    assert pause == 0
    assert resume == len(steps) - 1
    assert len(buckets) == n_buckets
    assert begin < min(buckets) and max(buckets) < stamp < end < publish < resume
    assert steps[publish].version == steps[stamp].version == 3


@settings(max_examples=200, deadline=None)
@given(
    version=st.integers(1, 10_000),
    engines=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4, unique=True),
    n_buckets=st.integers(1, 40),
    lora=st.booleans(),
    mode=st.sampled_from(PauseMode),
)
def test_plan_structure(version, engines, n_buckets, lora, mode):
    engines = tuple(engines)
    kind, adapter = (UpdateKind.LORA, "adapter") if lora else (UpdateKind.FULL, None)
    steps = plan_update_actions(version, engines, n_buckets, kind, adapter, pause_mode=mode)

    head = opening(engines, mode) + ([UnloadAdapter(engines, "adapter")] if lora else [])
    tail = [
        StampEngines(version, engines),
        EndUpdate(engines),
        PublishVersion(version),
        ResumeEngines(engines),
    ]
    assert len(steps) == len(head) + n_buckets + len(tail)
    assert list(steps[: len(head)]) == head
    assert list(steps[len(steps) - len(tail) :]) == tail
    middle = steps[len(head) : len(steps) - len(tail)]
    assert [s.bucket for s in middle] == list(range(n_buckets))
    assert all(s == SendBucket(s.bucket, n_buckets, engines) for s in middle)


@pytest.mark.parametrize("n_buckets", [0, -1])
def test_no_buckets_raises(n_buckets):
    with pytest.raises(TransitionError, match=rf"at least one bucket, got n_buckets={n_buckets}$"):
        plan_update_actions(1, ENGINES, n_buckets)
    with pytest.raises(TransitionError, match=rf"n_buckets={n_buckets}"):
        WeightUpdate(1, ENGINES, n_buckets)


def test_full_update_with_an_adapter_raises():
    with pytest.raises(
        TransitionError,
        match=re.escape(
            "adapter='policy' with kind=full: a LoRA update names its adapter, "
            "a full update names none"
        ),
    ):
        plan_update_actions(1, ENGINES, 1, UpdateKind.FULL, adapter="policy")


def test_lora_update_without_an_adapter_raises():
    with pytest.raises(TransitionError, match=r"adapter=None with kind=lora"):
        plan_update_actions(1, ENGINES, 1, UpdateKind.LORA)
    with pytest.raises(TransitionError, match=r"adapter=None with kind=lora"):
        WeightUpdate(1, ENGINES, 1, UpdateKind.LORA)


# --- WeightUpdate -------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "adapter"), [(UpdateKind.FULL, None), (UpdateKind.LORA, "x")])
def test_update_walks_its_plan_and_finishes(kind, adapter):
    update = WeightUpdate(9, ENGINES, 3, kind, adapter)
    assert update.version == 9
    assert update.kind is kind
    expected = plan_update_actions(9, ENGINES, 3, kind, adapter)
    assert update.actions == expected
    assert not update.finished
    assert update.completed_actions == ()

    for done, step in enumerate(expected):
        assert not update.finished
        assert update.next_action() == step
        update.complete(step)
        assert update.completed_actions == expected[: done + 1]

    assert update.finished
    assert update.next_action() is None


def test_complete_out_of_order_raises_naming_the_expected_action():
    update = WeightUpdate(4, ENGINES, 2)
    for action in opening():
        update.complete(action)
    skipped_ahead = SendBucket(1, 2, ENGINES)
    expected = SendBucket(0, 2, ENGINES)
    with pytest.raises(
        TransitionError,
        match=r"^weight update 4: action "
        + re.escape(repr(skipped_ahead))
        + r" completed but the plan expects "
        + re.escape(repr(expected))
        + r" next$",
    ):
        update.complete(skipped_ahead)
    assert update.completed_actions == tuple(opening())
    assert update.next_action() == expected


def test_publish_before_stamp_is_refused():
    update = WeightUpdate(5, ENGINES, 1)
    for action in [*opening(), SendBucket(0, 1, ENGINES)]:
        update.complete(action)
    with pytest.raises(TransitionError, match=re.escape(f"expects {StampEngines(5, ENGINES)!r}")):
        update.complete(PublishVersion(5))
    update.complete(StampEngines(5, ENGINES))
    with pytest.raises(TransitionError, match=re.escape(f"expects {EndUpdate(ENGINES)!r}")):
        update.complete(PublishVersion(5))  # publishing with the session still open
    update.complete(EndUpdate(ENGINES))
    with pytest.raises(TransitionError, match=re.escape(f"expects {PublishVersion(5)!r}")):
        update.complete(ResumeEngines(ENGINES))  # resuming before publishing


def test_stamp_with_the_wrong_version_or_engines_is_refused():
    update = WeightUpdate(5, ENGINES, 1)
    for action in [*opening(), SendBucket(0, 1, ENGINES)]:
        update.complete(action)
    with pytest.raises(TransitionError, match=r"StampEngines\(version=5"):
        update.complete(StampEngines(4, ENGINES))
    with pytest.raises(TransitionError, match=r"StampEngines\(version=5"):
        update.complete(StampEngines(5, ENGINES[:2]))
    assert len(update.completed_actions) == 4


def test_lora_skipping_the_unload_is_refused():
    update = WeightUpdate(2, ENGINES, 1, UpdateKind.LORA, "x")
    for action in opening():
        update.complete(action)
    with pytest.raises(TransitionError, match=re.escape(repr(UnloadAdapter(ENGINES, "x")))):
        update.complete(SendBucket(0, 1, ENGINES))


def test_completing_a_step_after_the_update_finished_raises():
    update = WeightUpdate(1, ENGINES, 1)
    for step in update.actions:
        update.complete(step)
    with pytest.raises(TransitionError, match=r"the plan expects None next"):
        update.complete(ResumeEngines(ENGINES))
    assert update.finished


def test_kind_may_be_given_as_its_flag_string():
    steps = plan_update_actions(3, ENGINES, 1, "lora", adapter="a")
    assert isinstance(steps[len(opening())], UnloadAdapter)
    assert WeightUpdate(3, ENGINES, 1, "full").kind is UpdateKind.FULL


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"version": 0}, "version >= 1 from the ledger, got 0"),
        ({"engines": ()}, "at least one engine"),
        ({"kind": "qlora"}, "kind must be 'full' or 'lora', got 'qlora'"),
        ({"n_buckets": 2.0}, "n_buckets=2.0"),
    ],
)
def test_bad_plan_inputs_are_named(kwargs, message):
    args = {"version": 1, "engines": ENGINES, "n_buckets": 2, **kwargs}
    with pytest.raises(TransitionError, match=re.escape(message)):
        plan_update_actions(**args)


def test_a_lora_plan_unloads_only_from_the_engines_holding_the_adapter():
    first = plan_update_actions(1, ENGINES, 1, UpdateKind.LORA, adapter="a", holding=())
    assert not [a for a in first if isinstance(a, UnloadAdapter)]  # first load: no unload
    some = plan_update_actions(2, ENGINES, 1, UpdateKind.LORA, adapter="a", holding=ENGINES[1:])
    assert [a for a in some if isinstance(a, UnloadAdapter)] == [UnloadAdapter(ENGINES[1:], "a")]
    update = WeightUpdate(2, ENGINES, 1, UpdateKind.LORA, "a", holding=())
    for action in opening():
        update.complete(action)
    update.complete(SendBucket(0, 1, ENGINES))  # nothing to unload: the bucket comes next


@pytest.mark.parametrize(
    ("kind", "adapter", "holding"),
    [(UpdateKind.FULL, None, ()), (UpdateKind.LORA, "a", ("elsewhere",))],
)
def test_holding_names_engines_of_a_lora_update_only(kind, adapter, holding):
    with pytest.raises(TransitionError, match=r"holding=.*the engines holding the adapter"):
        plan_update_actions(1, ENGINES, 1, kind, adapter, holding=holding)
