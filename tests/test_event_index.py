"""miles_core/event_index.py: the by-class index every oracle reads, what it holds, and that
it agrees with a walk of the whole history."""

from __future__ import annotations

from miles_core.event_index import forget, index_bytes, select
from miles_core.events import SampleGenerated, StepCommitted
from sim.run import run_scenario
from sim.scenarios import SCENARIOS


def test_select_is_the_walk_of_the_history_in_order() -> None:
    history = run_scenario(SCENARIOS["engine_restart"], seed=0).history
    kinds = (SampleGenerated, StepCommitted)
    walked = [(seq, e) for seq, e in enumerate(history) if isinstance(e, kinds)]
    assert list(select(history, *kinds)) == walked
    steps = [(seq, e) for seq, e in walked if isinstance(e, StepCommitted)]
    assert list(select(history, StepCommitted)) == steps and steps


def test_the_index_holds_a_pointer_and_a_position_an_event() -> None:
    """What the soak adds to the history's bytes: a pointer to each event, and its position
    (a pointer to an int object of 28 bytes)."""
    history = run_scenario(SCENARIOS["no_failure"], seed=0, steps=40).history
    assert index_bytes(history) == 0  # not indexed yet
    select(history, StepCommitted)
    held = index_bytes(history) / len(history)
    assert 44 <= held < 56  # 8 + 8 + 28, and what the lists keep spare as they grow
    forget(history)
    assert index_bytes(history) == 0
