"""The independent-DP cell group: states, refresh/heal plans, attempts, routing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miles_core.cells import (
    TRANSITIONS,
    CellEvent,
    CellGroup,
    CellState,
    Decision,
    Outcome,
)
from miles_core.errors import (
    ConfigError,
    NoAliveCellError,
    RetriesExhaustedError,
    TransitionError,
)


def test_every_state_is_reachable_and_only_table_transitions_are_allowed() -> None:
    reachable = {CellState.ALIVE}
    frontier = [CellState.ALIVE]
    while frontier:
        state = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is state and dst not in reachable:
                reachable.add(dst)
                frontier.append(dst)
    assert reachable == set(CellState)
    group = CellGroup(1, 1)
    with pytest.raises(TransitionError, match="initialized is not allowed in state alive"):
        group.apply(0, CellEvent.INITIALIZED)
    assert group.state(0) is CellState.ALIVE


def test_crash_shrinks_the_quorum_under_a_new_id() -> None:
    group = CellGroup(3, 2)
    assert group.refresh().reconfigure is False
    group.mark_failed(1, "actor died")
    plan = group.refresh()
    assert plan.reconfigure is True
    assert plan.quorum_id == 1
    assert plan.members == (0, 2)
    assert plan.heals == ()
    again = group.refresh()
    assert again.reconfigure is False and again.quorum_id == 1


def test_restarted_cell_is_healed_from_the_first_alive_cell() -> None:
    group = CellGroup(4, 2)
    group.mark_failed(0, "oom")
    group.mark_failed(2, "oom")
    assert group.refresh().members == (1, 3)
    group.restart(2, "operator")
    assert group.state(2) is CellState.PENDING
    plan = group.refresh()
    assert plan.reconfigure and plan.quorum_id == 2
    assert plan.members == (1, 2, 3)
    (heal,) = plan.heals
    assert (heal.src_cell, heal.dst_cell) == (1, 2)
    assert (heal.src_alive_rank, heal.dst_alive_rank) == (0, 1)
    assert heal.src_ranks == (2, 3) and heal.dst_ranks == (4, 5)
    assert group.state(2) is CellState.ALLOCATED_UNINITIALIZED
    group.heal_done(2)
    assert group.alive() == (1, 2, 3)
    assert group.refresh().reconfigure is False


def test_heal_failure_errors_the_cell_and_reconfigures_again() -> None:
    group = CellGroup(2, 1)
    group.mark_failed(1, "crash")
    group.refresh()
    group.restart(1, "auto")
    plan = group.refresh()
    group.heal_failed(1, "killed during healing")
    assert group.state(1) is CellState.ERRORED
    after = group.refresh()
    assert after.reconfigure and after.quorum_id == plan.quorum_id + 1
    assert after.members == (0,)


def test_transitions_are_reported_once_with_reasons() -> None:
    group = CellGroup(2, 1)
    group.mark_failed(0, "heartbeat lost")
    group.restart(0, "auto-restart")
    taken = group.take_transitions()
    assert [(t.cell, t.old, t.new) for t in taken] == [
        (0, CellState.ALIVE, CellState.ERRORED),
        (0, CellState.ERRORED, CellState.STOPPED),
        (0, CellState.STOPPED, CellState.PENDING),
    ]
    assert taken[0].reason == "heartbeat lost"
    assert group.take_transitions() == ()


@pytest.mark.parametrize(
    ("outcomes", "decision", "alive_after"),
    [
        ({0: Outcome.NORMAL, 1: Outcome.NORMAL}, Decision.COMMIT, (0, 1)),
        # a cell failed before the exchange: the survivor's allreduce failed -> it discards
        ({0: Outcome.DISCARDED, 1: Outcome.ERRORED}, Decision.RETRY, (0,)),
        # a cell failed after the exchange: the survivor's step is valid
        ({0: Outcome.NORMAL, 1: Outcome.ERRORED}, Decision.COMMIT, (0,)),
        ({0: Outcome.DISCARDED, 1: Outcome.DISCARDED}, Decision.RETRY, (0, 1)),
        ({0: Outcome.NORMAL, 1: Outcome.DISCARDED}, Decision.RETRY, (0, 1)),
        ({0: Outcome.ERRORED, 1: Outcome.ERRORED}, Decision.RETRY, ()),
    ],
)
def test_attempt_classification(outcomes, decision, alive_after) -> None:
    group = CellGroup(2, 1)
    attempt = group.begin_attempt(step=7)
    assert attempt.cells == (0, 1) and attempt.attempt == 1
    result = group.finish_attempt(outcomes)
    assert result.decision is decision
    assert group.alive() == alive_after
    assert set(result.errored) == {c for c, o in outcomes.items() if o is Outcome.ERRORED}


def test_crash_before_allreduce_retries_on_the_shrunk_quorum() -> None:
    group = CellGroup(2, 1)
    group.refresh()
    first = group.begin_attempt(0)
    assert (
        group.finish_attempt({0: Outcome.DISCARDED, 1: Outcome.ERRORED}).decision is Decision.RETRY
    )
    plan = group.refresh()
    assert plan.members == (0,) and plan.reconfigure
    second = group.begin_attempt(0)
    assert second.attempt == first.attempt + 1
    assert second.cells == (0,) and second.quorum_id == plan.quorum_id
    assert group.finish_attempt({0: Outcome.NORMAL}).decision is Decision.COMMIT
    assert group.begin_attempt(1).attempt == 1


def test_step_retries_are_bounded() -> None:
    group = CellGroup(2, 1, max_step_attempts=3)
    for _ in range(3):
        group.begin_attempt(5)
        group.finish_attempt({0: Outcome.DISCARDED, 1: Outcome.DISCARDED})
    with pytest.raises(RetriesExhaustedError, match="step 5 failed 3 attempts"):
        group.begin_attempt(5)


def test_outcomes_must_match_the_attempt() -> None:
    group = CellGroup(2, 1)
    group.begin_attempt(0)
    with pytest.raises(
        TransitionError, match=r"outcomes for cells \[0\] but the attempt ran on \[0, 1\]"
    ):
        group.finish_attempt({0: Outcome.NORMAL})
    with pytest.raises(TransitionError, match="still running"):
        group.begin_attempt(1)


def test_all_cells_dead_is_a_clear_error_everywhere() -> None:
    group = CellGroup(2, 1)
    group.mark_failed(0, "x")
    group.mark_failed(1, "y")
    with pytest.raises(NoAliveCellError, match=r"no trainer cell is alive.*0=errored, 1=errored"):
        group.refresh()
    with pytest.raises(NoAliveCellError, match="step 3"):
        group.begin_attempt(3)
    with pytest.raises(NoAliveCellError, match="update_weights"):
        group.routed("update_weights").target()


def test_update_weights_fails_over_to_the_next_alive_cell() -> None:
    group = CellGroup(3, 1)
    call = group.routed("update_weights")
    assert call.target() == 0
    call.failed("died after bucket 2")
    assert group.state(0) is CellState.ERRORED
    assert call.target() == 1
    assert call.tries == 2


def test_routed_retries_are_bounded() -> None:
    group = CellGroup(1, 1, max_route_attempts=2)
    call = group.routed("save")
    call.target()
    call.target()
    with pytest.raises(RetriesExhaustedError, match="save failed on 2 tries"):
        call.target()


def test_restart_of_an_alive_cell_is_refused() -> None:
    group = CellGroup(2, 1)
    with pytest.raises(TransitionError, match="cell 0 is alive; only errored or stopped"):
        group.restart(0, "no")


@pytest.mark.parametrize("field", ["num_cells", "gpus_per_cell", "max_step_attempts"])
def test_bad_config_names_the_field(field) -> None:
    kwargs = {"num_cells": 2, "gpus_per_cell": 1, field: 0}
    with pytest.raises(ConfigError, match=f"{field}: got 0"):
        CellGroup(**kwargs)


def test_unknown_cell_is_named() -> None:
    with pytest.raises(ConfigError, match="cell 5 does not exist"):
        CellGroup(2, 1).state(5)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["fail", "stop", "restart", "refresh", "attempt", "route", "heal"]),
        st.integers(0, 3),
        st.sampled_from(list(Outcome)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_never_routes_or_trains_on_a_cell_that_is_not_alive(ops) -> None:
    group = CellGroup(4, 2, max_step_attempts=1000, max_route_attempts=1000)
    step = 0
    quorum = group.quorum_id
    for op, cell, outcome in ops:
        try:
            if op == "fail":
                group.mark_failed(cell, "fault")
            elif op == "stop":
                group.stop(cell, "operator")
            elif op == "restart":
                group.restart(cell, "operator")
            elif op == "refresh":
                plan = group.refresh()
                assert plan.quorum_id >= quorum
                quorum = plan.quorum_id
                for heal in plan.heals:
                    assert group.state(heal.src_cell) is CellState.ALIVE
                    assert heal.src_cell == min(group.alive())
                    assert group.state(heal.dst_cell) is CellState.ALLOCATED_UNINITIALIZED
            elif op == "heal":
                if group.state(cell) is CellState.ALLOCATED_UNINITIALIZED:
                    group.heal_done(cell)
            elif op == "attempt":
                attempt = group.begin_attempt(step)
                assert all(group.state(c) is CellState.ALIVE for c in attempt.cells)
                outcomes = {c: outcome if c == cell else Outcome.NORMAL for c in attempt.cells}
                if group.finish_attempt(outcomes).decision is Decision.COMMIT:
                    step += 1
            else:
                target = group.routed("update_weights").target()
                assert group.state(target) is CellState.ALIVE
                assert target == min(group.alive())
        except NoAliveCellError:
            assert group.alive() == ()
        except TransitionError:
            assert op == "restart"
            assert group.state(cell) in (
                CellState.ALIVE,
                CellState.PENDING,
                CellState.ALLOCATED_UNINITIALIZED,
            )
