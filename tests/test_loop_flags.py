"""miles' defaults and flags: one default each, every LoopConfig flag in miles' spelling on
both command lines and as a scenario-file key, errors that name the flag, and the metrics a
run reports (--metrics, --json, the trace)."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import typing
from typing import Any

import pytest

from miles_core.buffer import DEFAULT_UNUSED_HANDLER, BufferConfig, UnusedHandler
from miles_core.errors import ConfigError
from miles_core.events import GroupDropped, StepCommitted, StepMetrics
from miles_core.kinds import PauseMode
from miles_core.loop import LoopConfig
from miles_core.loop.config import FIELD_OF_KEY, FLAGS
from miles_core.loop.flags import add_loop_flags, flags_argv, given_flags, with_flags
from miles_core.scenario import SCENARIOS, scenario_from_toml
from sim.__main__ import main
from sim.run import run_scenario

HINTS = typing.get_type_hints(LoopConfig)

# a valid value for each flag that differs from its default
GOOD = {
    "steps": 3,
    "rollout_batch_size": 2,
    "n_samples_per_prompt": 4,
    "max_weight_staleness": 2,
    "unused_samples_handler": UnusedHandler.RETRY,
    "staleness_policy": "gate_submission",
    "miles_profile": "aug2026",
    "capacity_factor": 3.0,
    "async_max_concurrent_samples": 8,
    "rollout_submission_granularity": "group",
    "pause_generation_mode": PauseMode.IN_PLACE,
    "dynamic_sampling_filter": "check_reward_nonzero_std",
    "update_weight_buffer_size": 1024,
    "transfer_mode": "p2p",
    "update_weight_delta_encoding": "overwrite",
    "max_step_attempts": 5,
    "max_route_attempts": 6,
    "lora_adapter": "policy",
    "mode": "one_step_off",
    "heartbeat_interval": 3.0,
    "heartbeat_timeout": 4.0,
    "heartbeat_failure_threshold": 2,
    "heartbeat_first_wait": 6.0,
    "use_fault_tolerance": True,
    "rollout_health_check_interval": 5.0,
    "rollout_health_check_timeout": 6.0,
    "rollout_health_check_first_wait": 7.0,
    "rollout_health_check_failure_threshold": 2,
    "mini_ft_controller_enable": True,
    "mini_ft_controller_poll_interval": 4.0,
    "mini_ft_controller_resume_delay": 0.0,
    "namespaced_radix_cache": True,
    "pause_abort_below_start_weight_version": True,
    "save_interval": 2,
    "request_max_retries": 5,
    "request_retry_interval": 0.5,
    "flush_cache_max_retries": 7,
    "flush_cache_retry_interval": 2.0,
    "update_weight_collective_timeout": 60.0,
    "update_weight_engine_request_timeout": 30.0,
    "update_weights_timeout": 90.0,
    "miles_bug_p2p_failures_logged": True,
    "miles_bug_health_monitor_left_paused": True,
    "miles_bug_fsdp_ignores_pause_mode": True,
}
NEEDS = {
    "staleness_policy": "max_weight_staleness = 1\n",
    "pause_abort_below_start_weight_version": "max_weight_staleness = 1\n",
}
"""What a flag's good value needs beside it in a scenario file (the gate and the abort
threshold at pause, version - max_weight_staleness, each need a bound)."""


def test_every_flag_has_a_good_value_here() -> None:
    assert set(GOOD) == set(FLAGS)


def test_miles_defaults_are_stated_once() -> None:
    loop = LoopConfig(steps=1)
    assert loop.unused_samples_handler is DEFAULT_UNUSED_HANDLER is UnusedHandler.DROP
    assert BufferConfig(rollout_batch_size=1).unused_samples_handler is DEFAULT_UNUSED_HANDLER
    assert loop.pause_generation_mode is PauseMode.RETRACT
    assert loop.use_fault_tolerance is False
    assert (loop.rollout_health_check_interval, loop.rollout_health_check_timeout) == (30, 30)
    assert loop.rollout_health_check_first_wait == 0
    assert loop.rollout_health_check_failure_threshold == 1
    assert loop.mini_ft_controller_enable is None  # resolved: mini_ft_controller_on
    assert not loop.mini_ft_controller_on
    assert (loop.mini_ft_controller_poll_interval, loop.mini_ft_controller_resume_delay) == (10, 10)


def _words(field: str, value: Any) -> list[str]:
    return flags_argv({field: value})


@pytest.mark.parametrize("field", sorted(FLAGS))
def test_every_flag_parses_in_miles_spelling_and_round_trips(field: str) -> None:
    parser = argparse.ArgumentParser()
    add_loop_flags(parser)
    value = GOOD[field]
    args = parser.parse_args(_words(field, value))
    given = given_flags(args)
    expected = value.value if isinstance(value, enum.Enum) else value
    got = given[field].value if isinstance(given[field], enum.Enum) else given[field]
    assert given == {field: given[field]} and got == expected
    # and the words for the replay line give it again
    assert given_flags(parser.parse_args(flags_argv(given))) == given


@pytest.mark.parametrize("field", sorted(FLAGS))
def test_every_flag_is_a_scenario_file_key_in_miles_snake_case(field: str) -> None:
    key = FLAGS[field].removeprefix("--").replace("-", "_")
    value = GOOD[field]
    text_value = value.value if isinstance(value, enum.Enum) else value
    literal = json.dumps(text_value) if not isinstance(text_value, bool) else str(value).lower()
    needs = NEEDS.get(field, "")
    scenario = scenario_from_toml(f"[loop]\n{needs}{key} = {literal}\n", "t.toml")
    got = getattr(scenario.loop, field)
    assert (got.value if isinstance(got, enum.Enum) else got) == text_value
    assert field == key or FIELD_OF_KEY[key] == field


def test_none_turns_an_optional_flag_off() -> None:
    parser = argparse.ArgumentParser()
    add_loop_flags(parser)
    given = given_flags(parser.parse_args(["--max-weight-staleness", "none"]))
    assert given == {"max_weight_staleness": None}
    assert flags_argv(given) == ["--max-weight-staleness", "none"]
    assert given_flags(parser.parse_args([])) == {}


def test_a_checked_value_names_the_flag_as_written() -> None:
    loop = SCENARIOS["no_failure"].loop
    with pytest.raises(ConfigError) as caught:
        with_flags(loop, {"pause_generation_mode": PauseMode.ABORT})
    assert caught.value.field == "--pause-generation-mode"
    assert "fully_async cannot use abort" in str(caught.value)
    with pytest.raises(ConfigError, match=r"^--async-max-concurrent-samples: 1 is fewer"):
        with_flags(loop, {"async_max_concurrent_samples": 1})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pause-generation-mode", "pause"], "argument --pause-generation-mode"),
        (["--rollout-batch-size", "2.5"], "argument --rollout-batch-size: invalid int"),
        (["--max-weight-stalenes", "2"], "unrecognized arguments: --max-weight-stalenes"),
        (["--pause-generation-mode", "abort"], "--pause-generation-mode: fully_async cannot"),
        (
            ["--dynamic-sampling-filter-path", "x.y"],
            "--dynamic-sampling-filter-path: cannot import",
        ),
        (
            ["--dynamic-sampling-filter-path", "xy"],
            "--dynamic-sampling-filter-path: unknown filter",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "no_failure", *argv])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_override_the_scenario_and_go_into_the_replay_line(tmp_path, capsys) -> None:
    argv = ["run", "no_failure", "--json", "--max-weight-staleness", "0", "--steps", "3"]
    argv += ["--async-unused-samples-handler", "retry", "--use-fault-tolerance"]
    main(argv)
    info = json.loads(capsys.readouterr().out)
    world = info["world"]
    assert world["max_weight_staleness"] == 0 and world["unused_samples_handler"] == "retry"
    assert world["use_fault_tolerance"] is True and world["pause_generation_mode"] == "retract"
    # a planted failure: expect a different ending, so the run fails and prints its replay
    file = tmp_path / "expects_failure.toml"
    file.write_text('name = "x"\nexpect = { status = "failed", error = "NoAliveCellError" }\n')
    assert main(["run", str(file), "--max-weight-staleness", "none", "--use-fault-tolerance"]) == 1
    replay = capsys.readouterr().err.strip().splitlines()[-1]
    assert replay.endswith("--max-weight-staleness none --use-fault-tolerance")


def test_metrics_go_to_json_lines_the_summary_and_the_trace(tmp_path, capsys) -> None:
    metrics, trace = tmp_path / "m.jsonl", tmp_path / "t.json"
    argv = ["run", "in_place_long_generations", "--json", "--steps", "4"]
    assert main([*argv, "--metrics", str(metrics), "--trace", str(trace)]) == 0
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert all("rollout/fully_async/queue_size" in row for row in rows)
    assert sum(row["rollout/fully_async/samples_on_mixed_weights"] for row in rows) > 0
    info = json.loads(capsys.readouterr().out)
    assert info["metrics"] == rows
    counters = {e["name"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "C"}
    assert "rollout/fully_async/samples_on_mixed_weights" in counters


def test_a_metrics_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "no_failure", "--metrics", str(tmp_path / "no" / "m.jsonl")])
    assert exited.value.code == 2 and "--metrics" in capsys.readouterr().err


def test_metrics_windows_are_per_step() -> None:
    """Each step's counts are that step's (miles reads get_metrics once per step), so the
    window is bounded: drops before step k's commit are counted in one row only."""
    history = run_scenario(SCENARIOS["dynamic_filter_zero_std"], 0).history
    key = "rollout/fully_async/dropped_groups"
    rows = [(e.t, dict(e.metrics)[key]) for e in history if isinstance(e, StepMetrics)]
    assert len(rows) == sum(isinstance(e, StepCommitted) for e in history)
    drops = [e.t for e in history if isinstance(e, GroupDropped)]
    previous = -1.0
    for t, count in rows:
        assert count == sum(previous < d <= t for d in drops)
        previous = t
    assert max(c for _, c in rows) < sum(c for _, c in rows)  # not a running total


def test_in_flight_groups_follow_miles_formula() -> None:
    loop = dataclasses.replace(SCENARIOS["no_failure"].loop, n_samples_per_prompt=4)
    assert dataclasses.replace(loop, async_max_concurrent_samples=9).in_flight_groups == 2
    assert dataclasses.replace(loop, async_max_concurrent_samples=4).in_flight_groups == 1
    assert loop.in_flight_groups == loop.rollout_batch_size  # unset: one batch
    assert HINTS["async_max_concurrent_samples"] == int | None
