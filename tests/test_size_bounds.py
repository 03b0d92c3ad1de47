"""Every size a user gives has a bound, checked before work starts (issue 52, item 3):
``rollout_batch_size`` or ``n_samples_per_prompt`` = 1e9 once took the simulator to 3-5 GB
and the CPU backend past 5 GB. Each refusal names the key or flag as the user wrote it, the
bound and how to raise it ([limits] for a scenario's sizes, the command's own otherwise)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.scenario import scenario_from_toml
from miles_core.scenario.limits import ATTEMPT_KEYS, Limits

ROOT = Path(__file__).resolve().parent.parent
HUGE = "1000000000"


def sim_scenario(*argv: str) -> object:
    from sim.cli.run import parser, scenario_of

    return scenario_of(parser().parse_args(["run", "no_failure", *argv]))


@pytest.mark.parametrize(
    ("flag", "bound_key", "value"),
    [
        ("--rollout-batch-size", "samples", 2 * 10**9),
        ("--n-samples-per-prompt", "samples", 4 * 10**9),
        ("--async-max-concurrent-samples", "samples", 10**9),
        ("--async-data-buffer-capacity-factor", "buffered_samples", 8 * 10**9),
        ("--max-step-attempts", "attempts", 10**9),
        ("--max-route-attempts", "attempts", 10**9),
        ("--request-max-retries", "attempts", 10**9),
        ("--flush-cache-max-retries", "attempts", 10**9),
        ("--trainer-heartbeat-checker-failure-threshold", "attempts", 10**9),
        ("--save-interval", "steps", 10**9),
        ("--max-weight-staleness", "steps", 10**9),
    ],
)
def test_a_huge_loop_flag_is_refused_naming_it_the_bound_and_the_limits_key(
    flag: str, bound_key: str, value: int
) -> None:
    with pytest.raises(ConfigError) as error:
        sim_scenario(flag, HUGE)
    assert error.value.field == flag
    assert f"is more than the {getattr(Limits(), bound_key)}" in error.value.problem
    assert f"[limits] {bound_key} = {value}" in error.value.fix


def test_the_flag_given_is_named_not_the_scenarios_other_key() -> None:
    with pytest.raises(ConfigError) as error:
        sim_scenario("--n-samples-per-prompt", "100000")  # x the scenario's batch of 4
    assert error.value.field == "--n-samples-per-prompt"


def test_a_scenario_file_names_its_key_and_its_limits_raise_the_bound() -> None:
    text = 'name = "big"\n[loop]\nrollout_batch_size = 1000000000\n'
    with pytest.raises(ConfigError) as error:
        scenario_from_toml(text, "big.toml")
    assert error.value.field == "[loop].rollout_batch_size"
    assert "raise it in the scenario file: [limits] samples = 2000000000" in error.value.fix
    raised = text.replace("1000000000", "65536") + "[limits]\nsamples = 131072\n"
    assert scenario_from_toml(raised, "big.toml").loop.rollout_batch_size == 65536


def test_the_library_and_the_defaults_sit_inside_the_bounds() -> None:
    from miles_core.scenario import SCENARIOS

    limits = Limits()
    for scenario in SCENARIOS.values():
        loop = scenario.loop
        assert loop.rollout_batch_size * loop.n_samples_per_prompt <= limits.samples
    assert limits.samples >= 512 * 16  # miles' large runs: 512 prompts x 16 samples
    for scenario in SCENARIOS.values():
        assert max(getattr(scenario.loop, key) for key in ATTEMPT_KEYS) <= limits.attempts


def test_the_cpu_backend_refuses_a_huge_batch_before_ray() -> None:
    from backends.common.run.command import check_run
    from backends.common.run.flags import build_parser
    from backends.cpu.stack import CPU

    parser, _ = build_parser(CPU)
    for flag in ("--rollout-batch-size", "--n-samples-per-prompt"):
        with pytest.raises(ConfigError) as error:
            check_run(parser.parse_args(["run", flag, HUGE]), CPU)
        assert error.value.field == flag
        assert "[limits] samples" in error.value.fix
    with pytest.raises(ConfigError, match=r"at most 2\.592e"):
        check_run(parser.parse_args(["run", "--timeout", "1e300"]), CPU)


def test_the_cpu_backend_command_exits_2_in_seconds() -> None:
    start = time.monotonic()
    command = [sys.executable, "-m", "backends.cpu", "run", "--rollout-batch-size", HUGE]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "error: --rollout-batch-size: 8000000000 samples a step" in done.stderr  # x 8
    assert "[limits] samples = 8000000000" in done.stderr
    assert time.monotonic() - start < 60


def test_the_gpu_backend_names_tp_past_the_gpu_bound() -> None:
    from backends.common.run.command import check_run
    from backends.common.run.flags import build_parser
    from backends.gpu.stack import GPU

    parser, _ = build_parser(GPU)
    args = parser.parse_args(["run", "--device", "cpu", "--trainer", "fsdp", "--tp", HUGE])
    args.trainer = "megatron"  # fsdp refuses any TP but 1; megatron takes one this wide
    with pytest.raises(ConfigError) as error:
        check_run(args, GPU)
    assert error.value.field == "--tp"
    assert "[limits] gpus" in error.value.fix


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("prompts", "--prompts"),
        ("max_operand", "--max-operand"),
        ("hidden_size", "--hidden-size"),
        ("layers", "--layers"),
        ("heads", "--heads"),
        ("warmup_steps", "--warmup-steps"),
    ],
)
def test_tasks_make_bounds_each_size(field: str, flag: str) -> None:
    from backends.tasks.spec import ArithSpec

    with pytest.raises(ConfigError) as error:
        ArithSpec(**{field: 10**9})
    assert error.value.field == flag
    assert "pass at most" in error.value.fix


def test_tasks_learn_bounds_its_samples_and_response() -> None:
    from backends.common.training.grpo_settings import MAX_SAMPLES, GrpoSettings

    for field, flag in (
        ("rollout_batch_size", "--rollout-batch-size"),
        ("n_samples_per_prompt", "--n-samples-per-prompt"),
        ("max_new_tokens", "--rollout-max-response-len"),
    ):
        with pytest.raises(ConfigError) as error:
            GrpoSettings(**{field: 10**9})
        assert error.value.field == flag
    assert GrpoSettings(rollout_batch_size=MAX_SAMPLES, n_samples_per_prompt=1)


def test_tasks_learn_refuses_huge_steps_before_loading() -> None:
    command = [sys.executable, "-m", "backends.tasks", "learn", "--task", "/nonexistent"]
    done = subprocess.run(
        [*command, "--steps", HUGE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--steps: got 1000000000; pass an integer from 1 to 100000" in done.stderr


@pytest.mark.parametrize("flag", ["--repeats", "--rounds"])
def test_sim_bench_bounds_its_counts(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sim.cli.bench import _parse

    with pytest.raises(SystemExit) as exit_:
        _parse([flag, HUGE])
    assert exit_.value.code == 2
    assert f"{flag}: got {HUGE}, more than" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("sweep", ["--seeds", "4", "--workers", "100000"]),
        ("sweep", ["--seeds", "4", "--recheck", "1000000000"]),
        ("findability", ["--seeds", "4", "--workers", "100000"]),
        ("plan", ["plans/small.toml", "--workers", "100000"]),
    ],
)
def test_fan_out_counts_are_bounded_before_ray(
    command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """--workers 100000 had Ray fork a worker process per task in flight; --recheck 1e9 kept
    a hash per seed run twice."""
    import importlib

    import backends.common.session.ray_session as session

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started before the bound was checked")

    monkeypatch.setattr(session, "ray_session", no_ray)
    main = importlib.import_module(f"sim.cli.{command}").main
    with pytest.raises(SystemExit) as ended:
        main(argv)
    assert ended.value.code == 2
    flag = "--recheck" if "--recheck" in argv else "--workers"
    assert f"{flag}: got" in capsys.readouterr().err


@pytest.mark.parametrize("threads", ["0", "100000"])
def test_tasks_threads_are_bounded_by_the_cpus_before_torch(threads: str) -> None:
    """torch.set_num_threads(100000) started a thread for each."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "backends.tasks", "--threads", threads, "make", "--out", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"--threads: got {threads}" in done.stderr
