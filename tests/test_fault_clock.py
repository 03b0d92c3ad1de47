"""A fault at a time leaves the run before that time as it was.

An aimed seed finds its moment in a probe run without the aimed fault, then adds
the fault at that moment (sim/search/aim.py); shrinking drops faults and expects the rest
of the run to stay put. Both need the run with one more fault at t to be the run
without it up to t, tie-breaks included: the schedule's one fault clock
(``Schedule._clock``) keeps the simulator's tie-break draws before t the same.
"""

from __future__ import annotations

import dataclasses

import pytest

from miles_core.events import EngineExited, FaultInjected, FaultScheduled, SampleGenerated
from miles_core.scenario.faults import make_fault
from sim.run import run_scenario
from sim.scenarios import SCENARIOS
from sim.search.swarm import swarm_scenario


def _before(history: object, t: float) -> list[object]:
    return [e for e in history if e.t < t and not isinstance(e, FaultScheduled)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["kill_cell", "restart_engine", "mid_generation"])
def test_one_more_fault_at_a_time_changes_nothing_before_it(seed: int, kind: str) -> None:
    """mid_generation: a kill armed by after_time splits a request's decode at its halfway
    only if that is after the time, so nothing is scheduled for an earlier moment."""
    base = swarm_scenario(seed, liveness=False)  # a heal would disarm the fault added late
    without = run_scenario(base, seed).history
    t = 0.5 * without[-1].t
    if kind == "mid_generation":
        extra = make_fault("kill_engine", engine="engine-0", point=kind, after_time=t)
    else:
        target = {"cell": 1} if kind == "kill_cell" else {"engine": "engine-0"}
        extra = make_fault(kind, at=t, **target)
    with_it = run_scenario(dataclasses.replace(base, faults=(*base.faults, extra)), seed).history
    before, after = _before(without, t), _before(with_it, t)
    assert len(before) > 20
    first = next((i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), None)
    assert first is None and len(before) == len(after), (
        f"the runs part at #{first}: {before[first] if first is not None else ''}\n"
        f"replay: python -m sim run swarm --seed {seed}"
    )


@pytest.mark.parametrize("after_time", [3.0, 9.5])
def test_a_mid_generation_kill_armed_by_time_strikes_the_first_halfway_after_it(
    after_time: float,
) -> None:
    """Requests that got halfway before the time are spared; the kill strikes at the first
    halfway after it, on its engine (engine_crash_mid_generation arms it by step instead)."""
    base = SCENARIOS["engine_crash_mid_generation"]
    kill = make_fault(
        "kill_engine", engine="engine-1", point="mid_generation", after_time=after_time
    )
    history = run_scenario(dataclasses.replace(base, faults=(kill,)), 0).history
    [struck] = [e for e in history if isinstance(e, FaultInjected)]
    assert struck.t >= after_time
    exited = [e for e in history if isinstance(e, EngineExited) and e.engine == "engine-1"]
    assert exited and exited[0].t == struck.t
    halfway = [  # requests of engine-1 that ran undisturbed and got halfway after the time
        e.t - e.engine_seconds / 2
        for e in history
        if isinstance(e, SampleGenerated)
        and e.engine == "engine-1"
        and e.engine_seconds
        and len(set(e.all_versions)) == 1
    ]
    assert not [h for h in halfway if after_time <= h < struck.t - 1e-9]
