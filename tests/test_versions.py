"""The version ledger: reserve/publish, failover, checkpoints, and the staleness helper."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.errors import VersionRegressionError
from miles_core.versions import (
    INITIAL_WEIGHTS_VERSION,
    LedgerSnapshot,
    Reservation,
    VersionLedger,
    staleness,
)


def published_to(n: int, updater: str = "cell-0") -> VersionLedger:
    ledger = VersionLedger()
    for _ in range(n):
        ledger.publish(ledger.reserve(updater), updater)
    return ledger


# --- reserve / publish --------------------------------------------------------------------------


def test_current_is_none_before_the_first_update():
    ledger = VersionLedger()
    assert ledger.current is None
    assert ledger.reservation is None
    assert ledger.next_version() == 1
    assert ledger.snapshot() == LedgerSnapshot(None)


def test_reserve_gives_one_then_publish():
    ledger = VersionLedger()
    assert ledger.reserve("cell-0") == 1
    assert ledger.current is None  # reserved is not published
    assert ledger.reservation == Reservation(1, "cell-0")

    assert ledger.publish(1, "cell-0") == 1
    assert ledger.current == 1
    assert ledger.reservation is None
    assert ledger.next_version() == 2


def test_versions_strictly_increase():
    ledger = VersionLedger()
    seen = []
    for k in range(12):
        updater = f"cell-{k % 3}"
        seen.append(ledger.publish(ledger.reserve(updater), updater))
        assert ledger.current == seen[-1]
    assert seen == list(range(1, 13))


def test_reserve_twice_without_publishing_gives_the_same_number():
    ledger = published_to(4)
    assert ledger.reserve("cell-0") == 5
    assert ledger.reserve("cell-1") == 5  # cell-0 died: cell-1 takes the reservation over
    assert ledger.reservation == Reservation(5, "cell-1")

    with pytest.raises(
        VersionRegressionError,
        match=re.escape(
            "updater 'cell-0' published weight version 5 but the reservation is "
            "version 5 for 'cell-1'"
        ),
    ):
        ledger.publish(5, "cell-0")
    assert ledger.current == 4

    assert ledger.publish(5, "cell-1") == 5
    assert ledger.current == 5


def test_abandon_then_reserve_gives_the_same_number():
    ledger = published_to(2)
    assert ledger.reserve("cell-0") == 3
    ledger.abandon(3)
    assert ledger.reservation is None
    assert ledger.current == 2
    assert ledger.reserve("cell-2") == 3
    assert ledger.publish(3, "cell-2") == 3


def test_abandon_of_another_number_keeps_the_reservation():
    ledger = published_to(2)
    ledger.reserve("cell-0")
    ledger.abandon(7)
    assert ledger.reservation == Reservation(3, "cell-0")
    ledger.abandon(3)
    ledger.abandon(3)  # abandoning twice is harmless
    assert ledger.reservation is None


def test_publish_without_a_reservation_raises():
    ledger = published_to(3)
    with pytest.raises(
        VersionRegressionError,
        match=r"'cell-0' published weight version 4 but nothing is reserved; call reserve\(\)",
    ):
        ledger.publish(4, "cell-0")
    assert ledger.current == 3


def test_publish_of_a_number_not_reserved_raises():
    ledger = published_to(3)
    ledger.reserve("cell-0")
    with pytest.raises(
        VersionRegressionError,
        match=r"published weight version 6 but the reservation is version 4 for 'cell-0'",
    ):
        ledger.publish(6, "cell-0")
    assert ledger.current == 3
    assert ledger.reservation == Reservation(4, "cell-0")


def test_publish_by_a_different_updater_raises():
    ledger = VersionLedger()
    ledger.reserve("cell-0")
    with pytest.raises(
        VersionRegressionError,
        match=r"updater 'cell-3' published weight version 1 but the reservation is version 1 "
        r"for 'cell-0'",
    ):
        ledger.publish(1, "cell-3")
    assert ledger.current is None
    assert ledger.reservation == Reservation(1, "cell-0")


def test_publishing_the_same_version_twice_raises():
    ledger = published_to(1)
    with pytest.raises(VersionRegressionError, match=r"backwards: published 1, then 1"):
        ledger.publish(1, "cell-0")
    assert ledger.current == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "2", None])
def test_publish_of_a_non_version_raises(bad):
    ledger = VersionLedger()
    ledger.reserve("cell-0")
    with pytest.raises(
        VersionRegressionError,
        match=r"'cell-0' reported weight version " + re.escape(repr(bad)) + r"; .*integers >= 1",
    ):
        ledger.publish(bad, "cell-0")
    assert ledger.current is None


def test_failover_continues_the_sequence():
    ledger = VersionLedger()
    for expected in range(1, 58):
        assert ledger.reserve("cell-0") == expected
        assert ledger.publish(expected, "cell-0") == expected
    assert ledger.current == 57

    ledger.reserve("cell-0")  # cell 0 starts update 58 and dies mid-transfer
    taken_over = ledger.reserve("cell-1")

    assert taken_over == 58
    assert ledger.publish(taken_over, "cell-1") == 58
    assert ledger.current == 58
    assert ledger.publish(ledger.reserve("cell-1"), "cell-1") == 59


def test_private_counter_regression_is_an_error():
    ledger = published_to(57, "cell-0")
    ledger.reserve("cell-1")
    # cell 1's own counter says this is its first update
    with pytest.raises(VersionRegressionError) as info:
        ledger.publish(1, "cell-1")
    message = str(info.value)
    assert "backwards" in message
    assert re.search(r"\b57\b", message)
    assert re.search(r"then 1 from 'cell-1'", message)
    assert ledger.current == 57
    assert ledger.reservation == Reservation(58, "cell-1")


def test_check_forward_names_the_source():
    ledger = published_to(5)
    ledger.check_forward(6, source="engine-0")
    ledger.check_forward(60, source="engine-0")  # ahead is not a regression
    with pytest.raises(VersionRegressionError, match=r"published 5, then 4 from 'engine-1'"):
        ledger.check_forward(4, source="engine-1")
    assert ledger.current == 5


# --- snapshot / restore -------------------------------------------------------------------------


def test_snapshot_restore_round_trip():
    ledger = published_to(5)
    snap = ledger.snapshot()
    assert snap == LedgerSnapshot(5)

    restored = VersionLedger(snap)
    assert restored.current == 5
    assert restored.reservation is None
    assert restored.reserve("cell-1") == 6

    other = VersionLedger()
    other.restore(snap)
    assert other.current == 5
    assert other.snapshot() == snap


def test_restore_of_an_older_snapshot_raises_and_leaves_the_ledger_unchanged():
    ledger = published_to(7)
    old = LedgerSnapshot(3)
    ledger.reserve("cell-2")
    with pytest.raises(
        VersionRegressionError,
        match=r"checkpoint at weight version 3 would move the ledger back from 7; "
        r"restore the latest checkpoint",
    ):
        ledger.restore(old)
    assert ledger.current == 7
    assert ledger.reservation == Reservation(8, "cell-2")
    assert ledger.publish(8, "cell-2") == 8


def test_restore_of_the_previous_version_raises():
    ledger = published_to(5)
    with pytest.raises(
        VersionRegressionError, match=r"version 4 would move the ledger back from 5"
    ):
        ledger.restore(LedgerSnapshot(4))
    assert ledger.current == 5


def test_restore_of_none_onto_a_published_ledger_raises():
    ledger = published_to(5)
    with pytest.raises(VersionRegressionError, match=r"move the ledger back from 5 to None"):
        ledger.restore(LedgerSnapshot(None))
    assert ledger.current == 5


def test_restore_of_none_onto_a_fresh_ledger_is_allowed():
    ledger = VersionLedger(LedgerSnapshot(None))
    assert ledger.current is None
    assert ledger.reserve("cell-0") == 1


def test_restore_forward_is_allowed_and_drops_the_reservation():
    ledger = published_to(5)
    ledger.reserve("cell-0")
    ledger.restore(LedgerSnapshot(10))
    assert ledger.current == 10
    assert ledger.reservation is None
    with pytest.raises(VersionRegressionError, match=r"published 10, then 6"):
        ledger.publish(6, "cell-0")
    assert ledger.reserve("cell-0") == 11


def test_restore_of_the_same_version_is_allowed():
    ledger = published_to(4)
    ledger.restore(ledger.snapshot())
    assert ledger.current == 4


@pytest.mark.parametrize("bad", [0, -2, True, 2.5])
def test_restore_of_a_non_version_raises(bad):
    with pytest.raises(
        VersionRegressionError,
        match=r"checkpoint holds weight version " + re.escape(repr(bad)) + r"; .*integers >= 1",
    ):
        VersionLedger(LedgerSnapshot(bad))


# --- staleness ----------------------------------------------------------------------------------


def test_initial_weights_count_as_version_zero():
    assert INITIAL_WEIGHTS_VERSION == 0


@pytest.mark.parametrize(
    ("current", "oldest", "expected"),
    [
        (None, 3, None),
        (None, None, None),
        (5, None, 5),
        (5, 3, 2),
        (5, 5, 0),
        (1, 0, 1),
        (3, 5, -2),  # negative: the caller treats it as a regression
    ],
)
def test_staleness_helper(current, oldest, expected):
    assert staleness(current, oldest) == expected


# --- property: the sequence never goes backwards ------------------------------------------------

UPDATERS = [f"cell-{k}" for k in range(4)]
_reserve = st.tuples(st.just("reserve"), st.sampled_from(UPDATERS))
_publish = st.tuples(st.just("publish_reserved"))
_op = st.one_of(
    _reserve,
    _publish,
    _reserve,
    _publish,
    st.tuples(st.just("publish_wrong"), st.integers(-2, 12), st.sampled_from(UPDATERS)),
    st.tuples(st.just("abandon"), st.booleans(), st.integers(0, 12)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restore"), st.integers(0, 100)),
    st.tuples(st.just("restore"), st.integers(0, 100)),
    st.tuples(st.just("failover"), st.integers(1, 3)),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(_op, min_size=10, max_size=60))
def test_published_versions_never_go_backwards(ops):
    ledger = VersionLedger()
    current: int | None = None  # the model
    reserved: tuple[int, str] | None = None
    published: list[int] = []
    snapshots: list[LedgerSnapshot] = []

    def raises(call) -> None:
        before = (ledger.current, ledger.reservation)
        with pytest.raises(VersionRegressionError):
            call()
        assert (ledger.current, ledger.reservation) == before

    for op in ops:
        kind = op[0]
        if kind == "reserve" or (kind == "failover" and reserved is not None):
            if kind == "reserve":
                updater = op[1]
            else:  # another updater takes over the dead one's reservation
                updater = UPDATERS[(UPDATERS.index(reserved[1]) + op[1]) % len(UPDATERS)]
            expected = (current or 0) + 1
            assert reserved is None or reserved[0] == expected
            assert ledger.reserve(updater) == expected
            reserved = (expected, updater)
        elif kind == "publish_reserved" and reserved is not None:
            version, updater = reserved
            assert ledger.publish(version, updater) == version
            assert version == (1 if current is None else current + 1)
            published.append(version)
            current, reserved = version, None
        elif kind == "publish_wrong":
            _, version, updater = op
            if reserved is not None and (version, updater) == reserved:
                version += 1
            raises(lambda v=version, u=updater: ledger.publish(v, u))
        elif kind == "abandon":
            _, of_reserved, number = op
            if of_reserved and reserved is not None:
                number = reserved[0]
            ledger.abandon(number)
            if reserved is not None and reserved[0] == number:
                reserved = None
        elif kind == "snapshot":
            snap = ledger.snapshot()
            assert snap.version == current
            snapshots.append(snap)
        elif kind == "restore" and snapshots:
            snap = snapshots[op[1] % len(snapshots)]
            older = current is not None and (snap.version is None or snap.version < current)
            if older:
                raises(lambda s=snap: ledger.restore(s))
            else:
                ledger.restore(snap)
                # restoring a version drops the reservation; restoring the empty checkpoint
                # onto a ledger that never published is a no-op
                if snap.version is not None:
                    reserved = None
                current = snap.version
        assert ledger.current == current
        assert ledger.reservation == (None if reserved is None else Reservation(*reserved))

    assert published == sorted(set(published))
    assert all(b == a + 1 for a, b in itertools.pairwise(published))
    assert published[:1] in ([], [1])
