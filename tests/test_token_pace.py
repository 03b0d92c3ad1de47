"""[sim] engine_token_seconds: the engines' token pace as a scenario key, honoured by every
world (the CPU backend's is held to it by test_cpu_backend's pause-mode runs, whose requests
span updates only at that pace)."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from miles_core.errors import ConfigError
from miles_core.events import SampleGenerated
from miles_core.scenario import SCENARIOS, scenario_from_toml, scenario_to_toml
from miles_core.scenario.world import MAX_TOKEN_SECONDS, WorldShape
from sim.run import run_scenario


def _request_seconds(pace: float) -> float:
    base = SCENARIOS["no_failure"]
    scenario = dataclasses.replace(
        base, world=dataclasses.replace(base.world, engine_token_seconds=pace)
    )
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    return statistics.median(e.t - e.sent for e in result.history if isinstance(e, SampleGenerated))


def test_a_slower_pace_than_the_time_model_lengthens_every_request() -> None:
    default = _request_seconds(0.0)  # the time model's 0.01 s a token
    assert _request_seconds(0.005) == default  # a floor below the model's decode changes nothing
    assert _request_seconds(0.05) > 3 * default


def test_the_key_round_trips_through_a_scenario_file() -> None:
    text = "[sim]\nengine_token_seconds = 0.02\n"
    scenario = scenario_from_toml(text, "paced.toml")
    assert scenario.world.engine_token_seconds == 0.02
    assert scenario_from_toml(scenario_to_toml(scenario), "again.toml").world == scenario.world


@pytest.mark.parametrize("value", [-0.1, float("inf"), MAX_TOKEN_SECONDS * 2, "0.1", True])
def test_a_bad_pace_names_the_key_and_the_range(value: object) -> None:
    with pytest.raises(ConfigError) as error:
        WorldShape(engine_token_seconds=value)  # type: ignore[arg-type]
    assert "engine_token_seconds" in str(error.value)
    assert f"from 0 to {MAX_TOKEN_SECONDS:g}" in str(error.value)


def test_the_cpu_backend_flag_takes_the_same_range() -> None:
    pytest.importorskip("ray")
    from backends.common.run.ray_run import check_token_seconds

    check_token_seconds(None)  # not given: the scenario's own pace
    with pytest.raises(ConfigError, match="--engine-token-seconds"):
        check_token_seconds(MAX_TOKEN_SECONDS + 1)
