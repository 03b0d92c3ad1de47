"""The GPU backend's own code, end to end on CPU: Megatron-core TP cells over gloo, local
engines, gloo standing in for NCCL and shared files for CUDA IPC.

What the GPU host adds (CUDA, NCCL, CUDA IPC, SGLang) is checked by the device
check (python -m backends.gpu devcheck), not here.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the real backends need the cpu extra (see the README)")
pytest.importorskip("megatron.core", reason="the Megatron trainer needs megatron-core")

from backends.common.run.ray_run import TRAIN, RealResult, run_in_ray
from backends.common.session.ray_session import ray_session
from backends.gpu.stack import GPU_FLAGS, gpu_stack
from miles_core.conformance import decisions, rollout
from miles_core.errors import ConfigError
from miles_core.events import HealEnded, VersionPublished, WeightsChecked
from sim.run import Scenario, run_scenario
from sim.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent


def flags(**given: object) -> argparse.Namespace:
    """The GPU backend's flags at their defaults, but on CPU, and those ``given``."""
    values = {flag.dest: flag.default for flag in GPU_FLAGS}
    return argparse.Namespace(**(values | {"device": "cpu"} | given))


def run_gpu(scenario: Scenario, steps: int | None, **given: object) -> RealResult:
    stack, scenario = gpu_stack(flags(**given), scenario)
    return run_in_ray(scenario, seed=0, steps=steps, timeout=600, stack=stack)


def _failed(result: RealResult) -> str:
    return "\n".join(str(v) for v in result.verdicts.values() if v)


def _checked_bitwise(result: RealResult) -> None:
    """After every update each engine's weights were hashed and equal the trainer's
    (the trainer's checksum is of its Megatron weights converted to HF names)."""
    checks = [e for e in result.history if isinstance(e, WeightsChecked)]
    published = [e.version for e in result.history if isinstance(e, VersionPublished)]
    assert {(c.engine, c.version) for c in checks} >= {
        (engine, v) for engine in ("engine-0", "engine-1") for v in published
    }
    assert checks and all(c.checksum == c.trainer_checksum for c in checks)


@pytest.fixture(scope="module")
def ray_cluster():
    with ray_session(num_gpus=8):
        yield


def test_megatron_tp2_cells_train_and_engines_hold_their_weights_bitwise(ray_cluster) -> None:
    transport = "nccl"  # ipc runs in a conformance case below
    result = run_gpu(TRAIN, 6, transport=transport)
    assert result.ok, _failed(result)
    assert result.scenario.world.gpus_per_cell == 2  # each cell one TP=2 group
    rewards = [result.step_rewards[s] for s in sorted(result.step_rewards)]
    assert statistics.fmean(rewards[-2:]) > rewards[0] + 0.1, rewards
    _checked_bitwise(result)
    stack = result.summary()["stack"]
    assert stack | {"transport": transport} == stack
    assert stack["trainer"] == "megatron" and stack["collective_backend"] == "gloo"


@pytest.mark.parametrize(
    ("name", "transport"),
    [
        ("cell_crash_before_allreduce", "nccl"),
        # over IPC's shared files, whose sender dies mid-update
        ("crash_mid_weight_update", "ipc"),
        # (restart_before_stamp is left out to keep CI under 15 minutes: the CPU backend's
        # conformance runs it, through the same engine actor and restart path)
    ],
)
def test_conformance_with_the_simulator(ray_cluster, name: str, transport: str) -> None:
    """Megatron TP=2 cells decide as the simulator does: a cell killed before its
    all-reduce, one killed mid-update, an engine restarted mid-update."""
    scenario = SCENARIOS[name]
    real = run_gpu(scenario, None, transport=transport)
    assert real.ok, _failed(real)
    assert real.summary()["stack"]["transport"] == transport
    # as many steps as the real run took where until_witnessed ran it on for the restart
    sim = run_scenario(scenario, 0, real.report.steps_done if scenario.until_witnessed else None)
    assert sim.ok
    steps_run = f"{name}, {real.report.steps_done} steps"
    print(f"\n{steps_run}: sim {rollout(sim.history)} | real {rollout(real.history)}")
    assert decisions(real.history).differences(decisions(sim.history)) == []
    checked = {e.version for e in real.history if isinstance(e, WeightsChecked)}
    assert set(real.report.versions) <= checked
    if name == "cell_crash_before_allreduce":  # Megatron state healed rank to rank
        assert any(isinstance(e, HealEnded) for e in real.history)


def test_flags_that_cannot_run_are_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--tp.*FSDP2"):
        gpu_stack(flags(trainer="fsdp", tp=2), TRAIN)
    with pytest.raises(ConfigError, match=r"--engine.*CUDA only.*--engine local"):
        gpu_stack(flags(engine="sglang"), TRAIN)
    with pytest.raises(ConfigError, match="--tp"):
        gpu_stack(flags(tp=0), TRAIN)
    stack, scenario = gpu_stack(flags(tp=1), TRAIN)
    assert scenario.world.gpus_per_cell == 1 and stack.engine == "local"


def test_device_cuda_without_cuda_exits_at_once_naming_the_alternatives() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "backends.gpu", "run", "--steps", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--device cpu" in done.stderr and "python -m backends.cpu" in done.stderr
    assert "Ray" not in done.stderr
