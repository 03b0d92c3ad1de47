"""Simulated training steps of the production-shaped presets (sim/cli/bench.py).

``production_scenario`` is the ``production-30b-moe`` preset (8 trainer cells of
8 GPUs, 16 engines of 4 GPUs, 61 GB of weights in 1,024 tensors, 2 GiB buckets,
32 prompts x 8 samples per step) with no fault; ``scale_scenario`` is
``production-64x256`` (64 cells of 8 GPUs, 256 engines of 4, 8 GiB buckets, 64
prompts x 8 samples, cell 1 killed before the allreduce of the middle step).
Seed 0. Timed: ``run_scenario``, one whole run, the oracles' judgement of its
history included.

- ``[1]``: ``production_scenario(steps=1)``, the figure for "one training step".
  It includes what a run pays once whatever its length (building the simulated
  cluster, among others).
- ``[10]``: ``production_scenario(steps=10)``; extra_info ``seconds_per_step_median``
  is its median divided by 10 (setup spread over the steps), ``sim_per_wall_median``
  the simulated seconds per wall second (the figure of merit: a run that reaches
  the same history with fewer SimPy events is faster by it).
"""

from __future__ import annotations

import pytest

from miles_core.events import FaultInjected, RunStatus, StepCommitted, VersionPublished
from sim.cli.bench import production_scenario, scale_scenario
from sim.run import run_scenario

PRESETS = {"production-30b-moe": production_scenario, "production-64x256": scale_scenario}


@pytest.mark.parametrize("steps", [1, 10])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_production_preset_step(benchmark, preset: str, steps: int) -> None:
    scenario = PRESETS[preset](steps)

    result = benchmark.pedantic(run_scenario, args=(scenario, 0), rounds=5, warmup_rounds=1)

    assert result.ok, [str(v) for v in result.verdicts.values() if v]
    assert result.report.status is RunStatus.COMPLETED
    assert result.report.steps_done == steps
    committed = [e.step for e in result.history if isinstance(e, StepCommitted)]
    assert committed == list(range(steps))
    assert any(isinstance(e, VersionPublished) for e in result.history)
    assert sum(isinstance(e, FaultInjected) for e in result.history) == len(scenario.faults)
    # Deterministic: the same seed gives the same history.
    assert run_scenario(scenario, 0).hash == result.hash

    benchmark.extra_info.update(steps=steps, simpy_events=result.events, history_hash=result.hash)
    if benchmark.stats is not None:  # None under --benchmark-disable
        stats = benchmark.stats.stats
        benchmark.extra_info["seconds_per_step_median"] = stats.median / steps
        simulated = result.history[-1].t
        benchmark.extra_info["sim_per_wall_median"] = round(simulated / stats.median)
