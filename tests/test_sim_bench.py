"""The benchmark compares like with like: the bare loop processes as many SimPy events."""

from __future__ import annotations

import simpy

import sim.bench
from sim.run import run_scenario
from sim.scenarios import SCENARIOS


class _Counting(simpy.Environment):
    processed = 0

    def step(self) -> None:
        super().step()
        self.processed += 1


def test_the_bare_loop_processes_exactly_the_events_it_is_credited_with(monkeypatch) -> None:
    events = run_scenario(SCENARIOS["no_failure"], 0, 2).events
    envs: list[_Counting] = []

    def counting() -> _Counting:
        envs.append(_Counting())
        return envs[-1]

    monkeypatch.setattr(sim.bench.simpy, "Environment", counting)
    sim.bench._bare_simpy(events)
    assert envs[-1].processed == events
