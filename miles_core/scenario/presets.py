"""Named worlds a scenario starts from (``preset = "..."``), and the loop every scenario
file starts from.

Link figures come from public specs: NVLink ~370 GB/s broadcast bus bandwidth, a
400 Gb/s InfiniBand NIC ~47 GB/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.loop.config import LoopConfig
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, CLUSTERS, preset_timing
from miles_core.scenario.world import TimeModel, WorldShape


@dataclass(frozen=True)
class Preset:
    world: WorldShape
    timing: TimeModel


_LARGE_MODEL_TIMING = TimeModel(
    response_tokens_mean=2048.0,
    decode_seconds_per_token=0.004,
    train_step_seconds=120.0,
    allreduce_seconds=4.0,
    link_bytes_per_second=47e9,  # 400 Gb/s InfiniBand per NIC
    nvlink_bytes_per_second=370e9,
    checkpoint_bytes_per_second=20e9,
)

PRESETS: Mapping[str, Preset] = {
    "small": Preset(WorldShape(), TimeModel()),
    # 64 trainer GPUs as 8 cells of TP x PP = 8, 64 rollout GPUs as 16 engines of 4;
    # Qwen3-30B-A3B in bf16 is about 61 GB of weights.
    "production-30b-moe": Preset(
        WorldShape(
            num_cells=8,
            gpus_per_cell=8,
            num_engines=16,
            gpus_per_engine=4,
            param_bytes=61 * 10**9,
            num_tensors=1024,
        ),
        _LARGE_MODEL_TIMING,
    ),
    # The production preset at the scale users run: 512 trainer GPUs as 64 cells of
    # TP x PP = 8, 1,024 rollout GPUs as 256 engines of TP4 (the simulator's speed goal is
    # measured on it: ``python -m sim bench --preset production-64x256``).
    "production-64x256": Preset(
        WorldShape(
            num_cells=64,
            gpus_per_cell=8,
            num_engines=256,
            gpus_per_engine=4,
            param_bytes=61 * 10**9,
            num_tensors=1024,
        ),
        _LARGE_MODEL_TIMING,
    ),
    # Kimi-K2: 1.04T parameters, one byte each in FP8 (scales and the few BF16 tensors left
    # out); 256 GPUs as 128 trainer GPUs and 8 engines of TP16 (checkpoint-engine's 256xH20
    # run used TP16 instances), NCCL broadcast from one source rank.
    "kimi-k2-1t-fp8-256gpu": Preset(
        WorldShape(
            num_cells=1,
            gpus_per_cell=128,
            num_engines=8,
            gpus_per_engine=16,
            param_bytes=1_040 * 10**9,
            num_tensors=8192,
        ),
        TimeModel(
            response_tokens_mean=4096.0,
            train_step_seconds=600.0,
            allreduce_seconds=10.0,
            link_bytes_per_second=47e9,
            nvlink_bytes_per_second=370e9,
            checkpoint_bytes_per_second=20e9,
        ),
    ),
    # Qwen3-30B-A3B in BF16 (~61 GB) on 4 nodes x 8 H100: 16 trainer GPUs as 2 cells of 8,
    # 16 rollout GPUs as 4 engines of TP4.
    "qwen3-30b-a3b-4x8-h100": Preset(
        WorldShape(
            num_cells=2,
            gpus_per_cell=8,
            num_engines=4,
            gpus_per_engine=4,
            param_bytes=61 * 10**9,
            num_tensors=1024,
        ),
        _LARGE_MODEL_TIMING,
    ),
    # the published clusters under the systems measured on them (anchor_presets.py)
    **{
        name: Preset(CLUSTERS[cluster].world(), preset_timing(cluster, system))
        for name, (cluster, system) in ANCHOR_PRESETS.items()
    },
}

DEFAULT_LOOP = LoopConfig(
    steps=8,
    update_weight_buffer_size=16 * 1024**2,
    heartbeat_interval=2.0,
    heartbeat_timeout=1.0,
    heartbeat_failure_threshold=3,
)
"""The small preset's 64 MiB of weights go in 4 buckets, so bucket faults have room;
heartbeats every 2 s, 3 misses of 1 s fail a cell (miles' checker, scaled down)."""
