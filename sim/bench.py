"""Simulator throughput, measured side by side with bare SimPy in the same process.

    python -m sim bench [--steps K] [--repeats R]

1. events/s of a scenario run (SimPy events processed by the seeded
   environment, the orchestration included) against a bare SimPy loop that
   processes the same number of events; the ratio is the figure of merit;
2. wall time of the production-shaped preset for K training steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable

import simpy

from miles_core.errors import ConfigError
from miles_core.scenario import PRESETS, SCENARIOS, Scenario
from sim.run import run_scenario


def _bare_simpy(events: int) -> float:
    """Seconds for plain SimPy to process exactly ``events`` events.

    One process yields ``events - 2`` timeouts: with its start (Initialize) and its
    end that is ``events`` SimPy events, each processed by ``Environment.step``,
    the same unit ``SeededEnvironment.processed`` counts in a scenario run. (A
    resumption is a callback of the timeout, not an event of its own.)
    """
    env = simpy.Environment()

    def ticker(env: simpy.Environment, n: int):
        for _ in range(n):
            yield env.timeout(1)

    env.process(ticker(env, max(0, events - 2)))
    started = time.perf_counter()
    env.run()
    return time.perf_counter() - started


def _timed(run: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    events = run()
    return time.perf_counter() - started, events


def _scenario_events(scenario: Scenario, seed: int, steps: int | None = None) -> Callable[[], int]:
    def run() -> int:
        result = run_scenario(scenario, seed, steps)
        failed = [str(v) for v in result.verdicts.values() if v]
        if failed:
            raise RuntimeError("a benchmark run must pass its oracles:\n" + "\n".join(failed))
        return result.events

    return run


def production_scenario(steps: int) -> Scenario:
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(
        base.loop,
        steps=steps,
        rollout_batch_size=32,
        n_samples_per_prompt=8,
        update_weight_buffer_size=2 * 1024**3,
        heartbeat_interval=10.0,
        heartbeat_timeout=10.0,
    )
    preset = PRESETS["production-30b-moe"]
    return dataclasses.replace(
        base,
        name="production-30b-moe",
        world=preset.world,
        timing=preset.timing,
        loop=loop,
        preset="production-30b-moe",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim bench", description=__doc__)
    parser.add_argument("--steps", type=int, default=1000, help="production-preset steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value < 1:
            parser.error(str(ConfigError(flag, f"got {value}", "pass an integer >= 1")))

    ratios, sim_rates, bare_rates = [], [], []
    for seed in range(args.repeats):
        seconds, events = _timed(
            _scenario_events(SCENARIOS["cell_crash_before_allreduce"], seed, 200)
        )
        bare = _bare_simpy(events)
        sim_rates.append(events / seconds)
        bare_rates.append(events / bare)
        ratios.append(bare / seconds)
    prod_seconds, prod_events = _timed(_scenario_events(production_scenario(args.steps), 0))
    summary = {
        "scenario_events_per_second": statistics.median(sim_rates),
        "bare_simpy_events_per_second": statistics.median(bare_rates),
        "ratio_to_bare_simpy": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
        "production_preset": {
            "steps": args.steps,
            "wall_seconds": prod_seconds,
            "events": prod_events,
            "events_per_second": prod_events / prod_seconds,
        },
    }
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    r = summary["ratio_to_bare_simpy"]
    print(f"scenario run (cell_crash_before_allreduce, 200 steps, {args.repeats} seeds):")
    ours, bare = summary["scenario_events_per_second"], summary["bare_simpy_events_per_second"]
    print(f"  {ours:,.0f} events/s vs bare SimPy {bare:,.0f} events/s")
    print(
        f"  ratio to bare SimPy: median {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})"
    )
    p = summary["production_preset"]
    print(
        f"production-30b-moe preset: {p['steps']} steps in {p['wall_seconds']:.1f} s wall "
        f"({p['events']:,} events, {p['events_per_second']:,.0f}/s)"
    )
    return 0
