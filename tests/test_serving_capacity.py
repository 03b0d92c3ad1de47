"""miles_core.report.capacity: engine-seconds not serving, per fault, over hand-made histories."""

from __future__ import annotations

import pytest

from miles_core.buffer import UnusedHandler
from miles_core.engines import EngineState
from miles_core.events import EngineStateChanged, Event, FaultInjected, History, RunStarted
from miles_core.kinds import FaultKind, PauseMode
from miles_core.report.capacity import capacity_line, outages, serving_capacity

S, U, D = EngineState.SERVING, EngineState.UNSYNCED, EngineState.DOWN


def started(t: float = 0.0) -> RunStarted:
    return RunStarted(
        t=t,
        seed=0,
        scenario="x",
        engines=("engine-0", "engine-1"),
        num_cells=2,
        max_weight_staleness=None,
        steps=1,
        pause_mode=PauseMode.RETRACT,
        fault_tolerance=True,
        unused_samples_handler=UnusedHandler.DROP,
    )


def moved(t: float, engine: str, old: EngineState, new: EngineState, inc: int = 0) -> Event:
    return EngineStateChanged(t=t, engine=engine, old=old, new=new, incarnation=inc, reason="")


def fault(t: float, index: int, kind: FaultKind, engine: str | None = None, cell=None) -> Event:
    return FaultInjected(t=t, index=index, fault=kind, engine=engine, cell=cell)


def test_an_outage_is_split_by_state_and_laid_to_its_engines_fault() -> None:
    history = History(
        [
            started(),
            fault(10.0, 0, FaultKind.KILL_ENGINE, "engine-1"),
            moved(10.0, "engine-1", S, D),
            moved(12.0, "engine-1", D, U, 1),
            moved(17.0, "engine-1", U, S, 1),
            moved(20.0, "engine-0", S, S),  # a routine update changes nothing
        ]
    )
    report = serving_capacity(history)
    assert report["engine_seconds"] == pytest.approx(40.0)
    assert report["engine_seconds_not_serving"] == pytest.approx(7.0)
    assert (report["down"], report["pending_weights"]) == pytest.approx((2.0, 5.0))
    [row] = report["by_fault"]
    assert row["fault"] == 0 and row["target"] == "engine-1" and row["outages"] == 1
    assert row["engine_seconds_not_serving"] == pytest.approx(7.0)
    assert report["unattributed"] == 0.0
    assert "7.0 engine-s not serving" in (capacity_line(report) or "")


def test_a_cell_fault_takes_outages_no_later_engine_fault_explains() -> None:
    """An aborted window stopping both engines after the updater cell died is the cell's; an
    earlier fault of engine-1 does not take engine-1's later outage."""
    history = History(
        [
            started(),
            fault(1.0, 0, FaultKind.HANG_ENGINE, "engine-1"),
            moved(3.0, "engine-1", S, D),
            moved(4.0, "engine-1", D, S, 1),
            fault(8.0, 1, FaultKind.KILL_CELL, cell=0),
            moved(8.0, "engine-0", S, D),
            moved(8.0, "engine-1", S, D, 1),
            moved(9.0, "engine-0", D, U, 1),
            moved(10.0, "engine-0", U, S, 1),
        ]
    )
    report = serving_capacity(history)
    rows = {r["fault"]: r for r in report["by_fault"]}
    assert rows[0]["engine_seconds_not_serving"] == pytest.approx(1.0)
    assert rows[1]["target"] == "cell 0" and rows[1]["outages"] == 2
    # engine-1 is never back: counted to the history's end (t=10)
    assert rows[1]["engine_seconds_not_serving"] == pytest.approx(2.0 + 2.0)
    lost, _, _ = outages(history)
    assert [o.ended for o in lost if o.engine == "engine-1"] == [4.0, None]


def test_an_outage_before_any_fault_is_unattributed_and_none_is_no_line() -> None:
    history = History([started(), moved(0.0, "engine-0", S, U), moved(2.0, "engine-0", U, S)])
    report = serving_capacity(history)
    assert report["unattributed"] == pytest.approx(2.0) and report["by_fault"] == []
    assert (
        capacity_line(serving_capacity(History([started(), moved(5.0, "engine-0", S, S)]))) is None
    )
    assert capacity_line(serving_capacity(History([started()]))) is None
