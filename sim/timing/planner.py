"""Run the points of a plan and find the front: each point's seeds run without faults (its
baseline) and with faults drawn from the plan's rates, are judged by every oracle, and
give what a buyer of GPUs asks (sim/timing/plan_file.py for the plan file):

- throughput: tokens trained per second (groups trained x samples x the workload's mean
  response length, over the run's simulated seconds, faults included);
- ETTR: the time to the last step of the run without faults over the time the run with
  faults took to the same step (1.0: faults cost nothing);
- staleness: the mean staleness of the trained groups (in versions);
- waste: the share of generated samples that were never trained (aborted, dropped).

A point is on the front when no other point that passed every oracle is at least as good
on all four and better on one. A point whose run failed an oracle is reported, with its
replay line, and kept off the front.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from miles_core.events import GroupTrained, SampleGenerated, StepCommitted
from miles_core.report.summary import staleness_histogram
from miles_core.scenario.faults import AnyFault
from sim.timing.plan_file import Plan, Point, drawn_faults, horizon_of, with_faults


@dataclass(frozen=True)
class SeedRun:
    seed: int
    seconds: float
    steps: int
    baseline_seconds: float
    baseline_steps: int
    baseline_last_step: float
    """When the baseline committed its last step."""
    seconds_to_baseline: float | None
    """When the run with faults committed the baseline's last step (None: it did not)."""
    tokens_trained: float
    staleness: float | None
    waste: float
    failed: tuple[str, ...]
    faults: int
    drawn: tuple[AnyFault, ...] = ()
    """The faults the run had (its replay file writes them)."""


@dataclass
class PointResult:
    point: Point
    runs: list[SeedRun] = field(default_factory=list)
    on_front: bool = False

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not any(r.failed for r in self.runs)

    def mean(self, name: str) -> float | None:
        values = [getattr(r, name) for r in self.runs if getattr(r, name) is not None]
        return statistics.fmean(values) if values else None

    @property
    def throughput(self) -> float:
        return statistics.fmean(r.tokens_trained / r.seconds for r in self.runs if r.seconds)

    @property
    def ettr(self) -> float:
        """The time to the baseline's last step without faults over the time to the same
        step with them (0 for a run that never got there)."""
        return statistics.fmean(
            r.baseline_last_step / r.seconds_to_baseline if r.seconds_to_baseline else 0.0
            for r in self.runs
        )

    @property
    def replay_seed(self) -> int:
        """The first seed that failed an oracle, else the first with faults, else the first."""
        failed = [r.seed for r in self.runs if r.failed]
        struck = [r.seed for r in self.runs if r.faults]
        return (failed or struck or [self.runs[0].seed])[0]

    def objectives(self) -> tuple[float, float, float, float]:
        """Larger is better on every one (staleness and waste negated)."""
        return (self.throughput, self.ettr, -(self.mean("staleness") or 0.0), -self.mean("waste"))


def _measure(history: Any, n: int, tokens_mean: float) -> tuple[float, float | None, float]:
    trained = sum(isinstance(e, GroupTrained) for e in history)
    generated = sum(isinstance(e, SampleGenerated) for e in history)
    ages = {k: v for k, v in staleness_histogram(history).items() if k.isdigit()}
    staleness = sum(int(k) * v for k, v in ages.items()) / sum(ages.values()) if ages else None
    waste = max(0.0, 1 - trained * n / generated) if generated else 0.0
    return trained * n * tokens_mean, staleness, waste


def _committed(history: Any, step: int) -> float | None:
    return next((e.t for e in history if isinstance(e, StepCommitted) and e.step == step), None)


def run_point(plan: Plan, point: Point, seeds: Sequence[int]) -> list[SeedRun]:
    """The point's seeds: each without faults, then with faults drawn inside that run's
    length (so every one fires), both judged by the oracles."""
    from sim.run import run_scenario

    scenario = point.scenario
    assert scenario is not None
    n, tokens_mean = scenario.loop.n_samples_per_prompt, scenario.timing.response_tokens_mean
    runs = []
    for seed in seeds:
        base = run_scenario(scenario, seed)
        base_seconds = base.history[len(base.history) - 1].t
        base_steps = base.report.steps_done
        step = base_seconds / max(1, base_steps)
        faults = drawn_faults(plan, scenario, seed, horizon_of(base_seconds), step)
        result = run_scenario(with_faults(scenario, faults), seed) if faults else base
        seconds = result.history[len(result.history) - 1].t
        tokens, staleness, waste = _measure(result.history, n, tokens_mean)
        failed = tuple(k for k, v in {**base.verdicts, **result.verdicts}.items() if v)
        steps = result.report.steps_done
        base_end = _committed(base.history, base_steps - 1)
        reached = _committed(result.history, base_steps - 1)
        runs.append(
            SeedRun(
                seed,
                seconds,
                steps,
                base_seconds,
                base_steps,
                base_end or base_seconds,
                reached,
                tokens,
                staleness,
                waste,
                failed,
                len(faults),
                faults,
            )
        )
    return runs


def mark_front(results: Sequence[PointResult]) -> None:
    """Pareto front of the points whose runs all passed."""
    ok = [r for r in results if r.ok]
    for r in ok:
        mine = r.objectives()
        r.on_front = not any(
            all(o >= m for o, m in zip(other.objectives(), mine, strict=True))
            and other.objectives() != mine
            for other in ok
        )


def judge_here(plan: Plan, pts: Sequence[Point]) -> list[PointResult]:
    """Every valid point's seeds run in this process, one after another, and the front
    marked: what ``sim plan`` does over Ray, for a plan small enough not to need it."""
    seeds = range(plan.seeds)
    results = [PointResult(p, run_point(plan, p, seeds) if p.scenario else []) for p in pts]
    mark_front(results)
    return results


__all__ = ["PointResult", "SeedRun", "judge_here", "mark_front", "run_point"]
