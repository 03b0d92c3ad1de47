"""A fault at a time leaves the run before that time as it was.

An aimed seed finds its moment in a probe run without the aimed fault, then adds
the fault at that moment (sim/aim.py); shrinking drops faults and expects the rest
of the run to stay put. Both need the run with one more fault at t to be the run
without it up to t, tie-breaks included: the schedule's one fault clock
(``Schedule._clock``) keeps the simulator's tie-break draws before t the same.
"""

from __future__ import annotations

import dataclasses

import pytest

from miles_core.events import FaultScheduled
from miles_core.scenario.faults import make_fault
from sim.run import run_scenario
from sim.swarm import swarm_scenario


def _before(history: object, t: float) -> list[object]:
    return [e for e in history if e.t < t and not isinstance(e, FaultScheduled)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["kill_cell", "restart_engine"])
def test_one_more_fault_at_a_time_changes_nothing_before_it(seed: int, kind: str) -> None:
    base = swarm_scenario(seed)
    without = run_scenario(base, seed).history
    t = 0.5 * without[-1].t
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
