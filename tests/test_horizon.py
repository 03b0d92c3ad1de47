"""sim/horizon.py: a run that is only slow is neither stalled nor without progress.

Found by hand: ``sim run no_failure --steps 3 --rollout-batch-size 1024
--n-samples-per-prompt 16`` (inside the [limits] bound) ended STALLED at t=750, every
request still decoding, because the horizon counted training time alone; with that fixed,
its first step (821 s) failed the 600 s progress window.
"""

from __future__ import annotations

import dataclasses

from miles_core.scenario.model import DEFAULT_PROGRESS_WINDOW
from sim.horizon import horizon, progress_window, rollout_seconds
from sim.run import run_scenario
from sim.scenarios import SCENARIOS

BASE = SCENARIOS["no_failure"]


def _batch(prompts: int, samples: int, steps: int = 1):  # type: ignore[no-untyped-def]
    loop = dataclasses.replace(
        BASE.loop, rollout_batch_size=prompts, n_samples_per_prompt=samples, steps=steps
    )
    return dataclasses.replace(BASE, loop=loop)


def test_a_large_batch_on_two_engines_is_slow_not_stalled() -> None:
    scenario = _batch(512, 16)  # one step of 8,192 samples: over 250 s of generation
    assert rollout_seconds(scenario) > 5 * scenario.timing.train_step_seconds
    result = run_scenario(scenario, seed=0)
    assert result.report.status.value == "completed"
    assert {name: v for name, v in result.verdicts.items() if v} == {}


def test_the_horizon_follows_the_longer_of_training_and_generation() -> None:
    slow_training = dataclasses.replace(
        BASE, timing=dataclasses.replace(BASE.timing, train_step_seconds=60.0)
    )
    large = _batch(512, 16)
    assert rollout_seconds(slow_training) < 60.0 < rollout_seconds(large)
    assert horizon(slow_training, 8, False) == 50 * 8 * 60.0
    assert horizon(large, 8, False) == 50 * 8 * rollout_seconds(large)
    assert horizon(dataclasses.replace(large, max_seconds=12.0), 8, False) == 12.0


def test_a_window_the_scenario_sets_is_kept_and_an_unset_one_grows_with_the_step() -> None:
    assert progress_window(BASE) == DEFAULT_PROGRESS_WINDOW
    large = _batch(1024, 16)
    assert progress_window(large) > DEFAULT_PROGRESS_WINDOW
    assert progress_window(dataclasses.replace(large, progress_window=30.0)) == 30.0
