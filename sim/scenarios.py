"""The named scenarios, and scenario files (TOML) a user writes without Python.

A scenario file:

    name = "my-crash"
    description = "cell 1 dies before the allreduce of step 2, comes back at step 5"
    preset = "small"              # optional: start from a preset's sim settings
    [sim]                         # optional: overrides of sim.cluster.SimConfig
    num_cells = 3
    [loop]                        # optional: miles_core.loop.LoopConfig fields
    steps = 10
    max_weight_staleness = 2
    [[faults]]                    # any number of sim.faults.Fault
    kind = "kill_cell"
    cell = 1
    point = "before_allreduce"
    step = 2

Unknown keys, sections or values are errors that name the key and the fix.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from miles_core.buffer import UnusedHandler
from miles_core.errors import ConfigError
from miles_core.loop import LoopConfig
from miles_core.transfer import TransferMode
from sim.cluster import SimConfig
from sim.faults import Fault
from sim.run import Scenario
from sim.swarm import SWARM, SWARM_TOTAL_LOSS, swarm_scenario

PRESETS: Mapping[str, SimConfig] = {
    "small": SimConfig(),
    "production-30b-moe": SimConfig(
        # 64 trainer GPUs as 8 cells of TP x PP = 8, 64 rollout GPUs as 16 engines of 4;
        # Qwen3-30B-A3B in bf16 is about 61 GB of weights.
        num_cells=8,
        gpus_per_cell=8,
        num_engines=16,
        gpus_per_engine=4,
        param_bytes=61 * 10**9,
        num_tensors=1024,
        response_tokens_mean=2048.0,
        decode_seconds_per_token=0.004,
        train_step_seconds=120.0,
        allreduce_seconds=4.0,
        link_bytes_per_second=47e9,  # 400 Gb/s InfiniBand per NIC
        nvlink_bytes_per_second=370e9,
        checkpoint_bytes_per_second=20e9,
    ),
    # Shaped like published weight-update runs, with link figures from public specs:
    # NVLink ~370 GB/s broadcast bus bandwidth, a 400 Gb/s InfiniBand NIC ~47 GB/s.
    "kimi-k2-1t-fp8-256gpu": SimConfig(
        # Kimi-K2: 1.04T parameters, one byte each in FP8 (scales and the few BF16 tensors
        # left out); 256 GPUs as 128 trainer GPUs and 8 engines of TP16 (checkpoint-engine's
        # 256xH20 run used TP16 instances), NCCL broadcast from one source rank.
        num_cells=1,
        gpus_per_cell=128,
        num_engines=8,
        gpus_per_engine=16,
        param_bytes=1_040 * 10**9,
        num_tensors=8192,
        response_tokens_mean=4096.0,
        train_step_seconds=600.0,
        allreduce_seconds=10.0,
        link_bytes_per_second=47e9,
        nvlink_bytes_per_second=370e9,
        checkpoint_bytes_per_second=20e9,
    ),
    "qwen3-30b-a3b-4x8-h100": SimConfig(
        # Qwen3-30B-A3B in BF16 (~61 GB) on 4 nodes x 8 H100: 16 trainer GPUs as 2 cells of 8,
        # 16 rollout GPUs as 4 engines of TP4.
        num_cells=2,
        gpus_per_cell=8,
        num_engines=4,
        gpus_per_engine=4,
        param_bytes=61 * 10**9,
        num_tensors=1024,
        response_tokens_mean=2048.0,
        decode_seconds_per_token=0.004,
        train_step_seconds=120.0,
        allreduce_seconds=4.0,
        link_bytes_per_second=47e9,
        nvlink_bytes_per_second=370e9,
        checkpoint_bytes_per_second=20e9,
    ),
}

_LOOP = LoopConfig(
    steps=8,
    update_weight_buffer_size=16 * 1024**2,
    heartbeat_interval=2.0,
    heartbeat_timeout=1.0,
    heartbeat_failure_threshold=3,
)
"""The small preset's 64 MiB of weights go in 4 buckets, so bucket faults have room;
heartbeats every 2 s, 3 misses of 1 s fail a cell (miles' checker, scaled down)."""


def _scenario(name: str, description: str, faults: tuple[Fault, ...] = (), **loop: Any) -> Scenario:
    return Scenario(name, description, SimConfig(), dataclasses.replace(_LOOP, **loop), faults)


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        _scenario("no_failure", "two cells, two engines, eight steps, no fault"),
        _scenario(
            "cell_crash_before_allreduce",
            "cell 1 dies before the allreduce of step 2: the survivor discards, the step "
            "retries on a shrunk quorum; cell 1 is healed back at step 5",
            (
                Fault("kill_cell", cell=1, point="before_allreduce", step=2),
                Fault("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "updater_dies_after_many_updates",
            "the updating cell 0 dies after bucket 1 of the update following step 12: "
            "cell 1 takes over and the version continues",
            (Fault("kill_cell", cell=0, point="after_bucket", bucket=1, after_step=12),),
            steps=16,
        ),
        _scenario(
            "crash_mid_weight_update",
            "the updater dies after bucket 2 of the first update: no engine serves the "
            "half-sent weights and the version advances once",
            (Fault("kill_cell", cell=0, point="after_bucket", bucket=2),),
        ),
        _scenario(
            "engine_crash_mid_generation",
            "engine-1 dies halfway through a request: its groups are aborted and recycled",
            (Fault("kill_engine", engine="engine-1", point="mid_generation", after_step=2),),
        ),
        _scenario(
            "engine_crash_mid_generation_drop",
            "as engine_crash_mid_generation, with --async-unused-samples-handler drop",
            (Fault("kill_engine", engine="engine-1", point="mid_generation", after_step=2),),
            unused_samples_handler=UnusedHandler.DROP,
        ),
        _scenario(
            "engine_restart",
            "engine-0 restarts at step 3: it serves only after it received the current "
            "weights and version",
            (Fault("restart_engine", engine="engine-0", point="step_begin", step=3),),
        ),
        _scenario(
            "first_update",
            "one step: everything trained before the first update has no version, and the "
            "staleness filter is off (not staleness 0)",
            steps=1,
            max_weight_staleness=0,
        ),
        _scenario(
            "staleness_retry",
            "rollout runs far ahead of slow training with --max-weight-staleness 1 and retry: "
            "stale groups are recycled, none is trained beyond the bound",
            in_flight_groups=16,
            max_weight_staleness=1,
            capacity_factor=4.0,
        ),
        _scenario(
            "staleness_drop",
            "as staleness_retry with drop: stale groups are dropped with a reason",
            in_flight_groups=16,
            max_weight_staleness=1,
            capacity_factor=4.0,
            unused_samples_handler=UnusedHandler.DROP,
        ),
        _scenario(
            "buffer_backpressure",
            "capacity floor(0.5 x 4) = 2 with 12 groups in flight: puts block until a get",
            in_flight_groups=12,
            capacity_factor=0.5,
        ),
        _scenario(
            "all_cells_dead",
            "both cells die before the allreduce of step 1: a clear error, no hang",
            (
                Fault("kill_cell", cell=0, point="before_allreduce", step=1),
                Fault("kill_cell", cell=1, point="before_allreduce", step=1),
            ),
        ),
        _scenario(
            "cell_killed_between_steps",
            "cell 1 dies at t=10 s while idle: the heartbeat checker or the next call "
            "notices, the quorum shrinks; the cell is restarted and healed at step 5",
            (
                Fault("kill_cell", cell=1, at=10.0),
                Fault("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        Scenario(
            "kill_during_heal",
            "three cells; cell 2 dies at step 1 and is restarted at step 3; the healing "
            "source, cell 0, dies while sending the checkpoint, so cell 2 is healed from "
            "cell 1 at the next refresh; cell 0 comes back at step 5",
            SimConfig(num_cells=3),
            _LOOP,
            (
                Fault("kill_cell", cell=2, point="before_allreduce", step=1),
                Fault("start_cell", cell=2, point="step_begin", step=3),
                Fault("kill_cell", cell=0, point="during_heal"),
                Fault("start_cell", cell=0, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "engine_killed_mid_update",
            "engine-1 dies right after bucket 1 of the update following step 2: the update "
            "drops it and is retried with the same version on engine-0",
            (
                Fault(
                    "kill_engine", engine="engine-1", point="after_bucket", bucket=1, after_step=2
                ),
            ),
        ),
        _scenario(
            "heartbeat_false_positive",
            "cell 1 stops answering heartbeats for 12 s while healthy: after 3 misses it is "
            "declared dead and stopped (a false positive), and healed back at step 5",
            (
                Fault("drop_heartbeat", cell=1, at=9.0, duration=12.0),
                Fault("start_cell", cell=1, point="step_begin", step=5),
            ),
        ),
        _scenario(
            "slow_cell",
            "cell 0 computes 4x slower for 30 s: steps take longer, nothing fails",
            (Fault("slow_cell", cell=0, at=5.0, duration=30.0, factor=4.0),),
        ),
        _scenario(
            "slow_link",
            "the weight-transfer link is 50x slower for 40 s",
            (Fault("slow_link", at=5.0, duration=40.0, factor=50.0),),
        ),
        _scenario(
            "router_trouble",
            "the router adds 2 s to every request for 20 s, then fails every request for 5 s: "
            "failed requests abort their groups, which are recycled",
            (
                Fault("delay_router", at=5.0, duration=20.0, seconds=2.0),
                Fault("fail_router", at=30.0, duration=5.0),
            ),
        ),
        _scenario(
            "lora_update",
            "only a LoRA adapter is trained and pushed: one atomic unit, unload-then-load, "
            "and the engines are stamped with the version like a full update; the updater "
            "dies mid-push once",
            (Fault("kill_cell", cell=0, point="after_bucket", bucket=0, after_step=2),),
            lora_adapter="policy",
            update_weight_buffer_size=64 * 1024,
        ),
        _scenario(
            "one_step_off",
            "the synchronous baseline: batch k+1 is generated while step k trains; updates "
            "never abort generation and every trained group is exactly one version old",
            mode="one_step_off",
        ),
        _scenario(
            "one_step_off_crash",
            "one-step-off with cell 1 dying before the allreduce of step 3 and healed at step 6",
            (
                Fault("kill_cell", cell=1, point="before_allreduce", step=3),
                Fault("start_cell", cell=1, point="step_begin", step=6),
            ),
            mode="one_step_off",
        ),
        _scenario(
            "p2p_transfer",
            "weights go point-to-point to each engine instead of by broadcast",
            transfer_mode=TransferMode.P2P,
        ),
    )
}


def _apply(base: Any, overrides: Mapping[str, Any], section: str) -> Any:
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"[{section}]", f"unknown keys {unknown}", f"use only {sorted(known)}")
    try:
        return dataclasses.replace(base, **overrides)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"[{section}]", str(error), "fix the value") from None


def load_scenario_file(path: Path) -> Scenario:
    """Read a TOML scenario file; every mistake is a ConfigError naming the key."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(str(path), f"is not valid TOML ({error})", "fix the syntax") from None
    known = {"name", "description", "preset", "sim", "loop", "faults", "progress_window"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            str(path), f"unknown top-level keys {unknown}", f"use only {sorted(known)}"
        )
    preset = data.get("preset", "small")
    if preset not in PRESETS:
        raise ConfigError("preset", f"unknown preset {preset!r}", f"use one of {sorted(PRESETS)}")
    sim = _apply(PRESETS[preset], data.get("sim", {}), "sim")
    loop_data = dict(data.get("loop", {}))
    for key, enum in (("transfer_mode", TransferMode), ("unused_samples_handler", UnusedHandler)):
        if key in loop_data:
            try:
                loop_data[key] = enum(loop_data[key])
            except ValueError:
                choices = [e.value for e in enum]
                raise ConfigError(
                    f"[loop].{key}", f"got {loop_data[key]!r}", f"use one of {choices}"
                ) from None
    loop = _apply(_LOOP, loop_data, "loop")
    faults = data.get("faults", [])
    if not isinstance(faults, list):
        raise ConfigError("faults", "is not a list", "write each fault as a [[faults]] table")
    return Scenario(
        name=str(data.get("name", path.stem)),
        description=str(data.get("description", "")),
        sim=sim,
        loop=loop,
        faults=tuple(Fault.from_dict(f) for f in faults),
        progress_window=float(data.get("progress_window", 600.0)),
    )


def find_scenario(name_or_file: str, seed: int = 0) -> Scenario:
    """A named scenario, a swarm drawn from ``seed``, or a scenario file's path."""
    if name_or_file in SCENARIOS:
        return SCENARIOS[name_or_file]
    if name_or_file in (SWARM, SWARM_TOTAL_LOSS):
        return swarm_scenario(seed, total_loss=name_or_file == SWARM_TOTAL_LOSS)
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise ConfigError("scenario", f"file {name_or_file!r} does not exist", "check the path")
        return load_scenario_file(path)
    raise ConfigError(
        "scenario",
        f"unknown scenario {name_or_file!r}",
        "run 'python -m sim list' for the names, or pass a .toml file",
    )
