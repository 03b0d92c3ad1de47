"""--pause-abort-below-start-weight-version (ours; SGLang's draft abort_below_start_weight_version,
sglang #34185): refused where SGLang would refuse the field, the pause's threshold, and its
effect measured in the simulator against the flag off (docs/miles.md, "abort below a start
version at pause").

The measurement runs retract_long_generations (responses of ~20 s against 5 s steps, under
retract) with a staleness bound of 1, flag off and on, seeds 0-3. What it shows (the
direction asserted here is the one measured): fewer retracted requests re-prefilled, fewer
groups refused as stale at the buffer, some requests aborted at the pause instead, the
trained samples' staleness at the bound either way, and no fewer groups unused in all.
Run as a script it prints the figures.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError, TransitionError
from miles_core.events import (
    EnginesPaused,
    EnginesPausedAbortingBelow,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    GroupTrained,
    History,
    SampleGenerated,
)
from miles_core.kinds import PauseMode, SampleOutcome
from miles_core.loop.config import LoopConfig
from miles_core.oracles.requests import requests_kept
from miles_core.pause_filter import abort_below
from miles_core.scenario import SCENARIOS
from miles_core.scenario.files import load_scenario_file
from miles_core.weight_update import PauseEngines, plan_update_actions
from sim.run import run_scenario
from sim.world import engine as sim_engine

ROOT = Path(__file__).resolve().parent.parent
FILE = "scenarios/files/pause_abort_below_start_version.toml"
SEEDS = range(4)


# -- the flag --------------------------------------------------------------------------------


def test_refused_with_an_abort_pause_and_without_a_bound() -> None:
    with pytest.raises(ConfigError, match=r"pause_abort_below_start_weight_version.*abort"):
        LoopConfig(
            steps=1,
            mode="one_step_off",
            pause_generation_mode=PauseMode.ABORT,
            max_weight_staleness=1,
            pause_abort_below_start_weight_version=True,
        )
    with pytest.raises(ConfigError, match="--max-weight-staleness, which is unset"):
        LoopConfig(steps=1, pause_abort_below_start_weight_version=True)
    LoopConfig(steps=1, max_weight_staleness=1, pause_abort_below_start_weight_version=True)


def test_the_pause_carries_the_threshold_and_abort_refuses_it() -> None:
    assert abort_below(7, 2) == 5
    (pause, *_) = plan_update_actions(7, ("e0",), 1, abort_below=5)
    assert pause == PauseEngines(("e0",), PauseMode.RETRACT, 5)
    (pause, *_) = plan_update_actions(7, ("e0",), 1)
    assert pause.abort_below is None  # type: ignore[union-attr]
    with pytest.raises(TransitionError, match="abort_below"):
        plan_update_actions(7, ("e0",), 1, pause_mode=PauseMode.ABORT, abort_below=5)


# -- the scenario file -------------------------------------------------------------------


def test_the_scenario_aborts_at_the_pause_and_passes_every_oracle() -> None:
    scenario = load_scenario_file(ROOT / FILE)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    pauses = [e for e in result.history if isinstance(e, EnginesPausedAbortingBelow)]
    assert pauses
    bound = scenario.loop.max_weight_staleness
    assert bound == 1
    # each threshold is the version the update reserved less the bound (versions 1, 2, ...)
    assert [p.abort_below for p in pauses[:3]] == [1 - bound, 2 - bound, 3 - bound]
    aborted = _aborted(result.history)
    assert aborted  # some requests were dropped at a pause
    # requests_kept accepts them only as the pause's: the same history with plain pauses fails
    plain = History(
        EnginesPaused(t=e.t, update_id=e.update_id, engines=e.engines, incarnations=e.incarnations)
        if isinstance(e, EnginesPausedAbortingBelow)
        else e
        for e in result.history
    )
    violation = requests_kept(plain)
    assert violation is not None and "was aborted under pause mode retract" in violation.message
    # ... and a threshold no request was declared below excuses none of them
    low = History(
        dataclasses.replace(e, abort_below=0) if isinstance(e, EnginesPausedAbortingBelow) else e
        for e in result.history
    )
    assert requests_kept(low) is not None


def test_with_the_flag_off_the_pause_sends_no_threshold() -> None:
    scenario = load_scenario_file(ROOT / FILE)
    off = dataclasses.replace(
        scenario,
        loop=dataclasses.replace(scenario.loop, pause_abort_below_start_weight_version=False),
    )
    result = run_scenario(off, 0)
    assert result.ok, result.failures()
    assert not any(isinstance(e, EnginesPausedAbortingBelow) for e in result.history)
    assert not _aborted(result.history)


def _aborted(history: History) -> list[SampleGenerated]:
    return [
        e for e in history if isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.ABORTED
    ]


# -- the measurement -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured() -> dict[bool, list[dict[str, Any]]]:
    return measure()


def measure() -> dict[bool, list[dict[str, Any]]]:
    """Per flag value, one row of figures per seed."""
    base = SCENARIOS["retract_long_generations"]
    rows: dict[bool, list[dict[str, Any]]] = {}
    with _counting_recompute() as recomputed:
        for on in (False, True):
            loop = dataclasses.replace(
                base.loop, max_weight_staleness=1, pause_abort_below_start_weight_version=on
            )
            scenario = dataclasses.replace(base, loop=loop)
            rows[on] = []
            for seed in SEEDS:
                recomputed.clear()
                result = run_scenario(scenario, seed)
                assert result.ok, result.failures()
                rows[on].append({**figures(result.history), "recomputed": sum(recomputed)})
    return rows


def figures(history: History) -> dict[str, Any]:
    """What each run wasted, read from its history."""
    unused = {e.group_id: e.reason for e in history if isinstance(e, GroupDropped | GroupRecycled)}
    samples = [e for e in history if isinstance(e, SampleGenerated)]
    trained = {e.group_id for e in history if isinstance(e, GroupTrained)}
    ages = [
        e.staleness
        for e in history
        if isinstance(e, GroupGot) and e.group_id in trained and e.staleness is not None
    ]
    return {
        "stale": sum(why.startswith("stale") for why in unused.values()),
        "aborted_groups": sum(why.startswith("aborted") for why in unused.values()),
        "aborted": sum(s.outcome is SampleOutcome.ABORTED for s in samples),
        "wasted_seconds": sum(s.engine_seconds or 0.0 for s in samples if s.group_id in unused),
        "max_staleness": max(ages),
        "trained": len(trained),
    }


@contextlib.contextmanager
def _counting_recompute() -> Iterator[list[float]]:
    """The prefill tokens of each retracted request's recompute (prompt and tokens so far),
    counted around the simulated engine's prefill while the block runs (the world keeps no
    such count; SGLang's would be its prefill throughput after a retract)."""
    counted: list[float] = []
    prefill = sim_engine.SimEngine._prefill

    async def counting(self: Any, job: Any, interrupt: Any) -> bool:
        if job.recompute and job.done > 0:  # a retracted request's KV, computed again
            counted.append(self.cluster.timing.prompt_tokens + job.done)
        return await prefill(self, job, interrupt)

    sim_engine.SimEngine._prefill = counting  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        sim_engine.SimEngine._prefill = prefill  # type: ignore[method-assign]


def test_fewer_recomputes_and_stale_groups_some_aborted_at_the_pause(
    measured: dict[bool, list[dict[str, Any]]],
) -> None:
    off, on = measured[False], measured[True]
    for a, b in zip(off, on, strict=True):
        assert b["recomputed"] < a["recomputed"]  # retract re-prefills fewer tokens
        assert b["stale"] <= a["stale"]  # the buffer refuses fewer as stale
        assert a["aborted"] == 0 < b["aborted"]  # dropped at the pause instead
        assert a["max_staleness"] == b["max_staleness"] == 1  # the bound holds either way
        assert a["trained"] == b["trained"]
    assert sum(b["stale"] for b in on) < sum(a["stale"] for a in off)
    # but more groups go unused in all: the declared version is the one published as the
    # request was sent, and one sent while an update was under way took its first tokens
    # from the newer weights (the buffer would have kept it); an aborted sample takes its
    # whole group with it
    for a, b in zip(off, on, strict=True):
        assert b["stale"] + b["aborted_groups"] >= a["stale"]


if __name__ == "__main__":  # the figures docs/miles.md quotes
    rows = measure()
    for on, runs in rows.items():
        for seed, row in zip(SEEDS, runs, strict=True):
            print("on " if on else "off", seed, {k: round(v, 1) for k, v in row.items()})
