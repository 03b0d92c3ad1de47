"""The published clusters of ``../shared/research/anchors.md`` as presets, each under the
weight-update system that was measured on it, so every published figure is one command
(``python -m sim predict PRESET``; ``python -m sim predict --anchors`` prints them all).

A preset is a cluster (the model's bytes on the wire, the trainer's GPUs and PP stages, the
engines and their expert shards) under a system: the update path's terms
(sim/world/update_cost.py) with the values fitted to the published rows by
``python -m sim calibrate --anchors`` (sim/timing/anchors.py). ``SYSTEMS`` is that one table;
a test fits them again and holds these figures to the fit.

The trainer is one cell of all its GPUs (its DP replicas hold the same weights; one
sends), placed on nodes of 8 GPUs before the engines, so trainer and engines never share
a node and the wire is the inter-node link. checkpoint-engine runs colocated (the same
GPUs train and serve): its fitted per-GPU rate covers host-to-device copy, broadcast and
reload, and stands in for the link.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.scenario.world import TimeModel, WorldShape
from miles_core.transfer import TransferMode

GB = 10**9


@dataclass(frozen=True)
class Cluster:
    """A published setup: the model's bytes on the wire and where they go."""

    params_billions: float
    bytes_per_param: float
    train_gpus: int
    gather_shares: int
    """Ways the update's gather splits, at once: miles' PP stages; Perplexity's schedule
    gives every trainer GPU its own share."""
    engines: int
    gpus_per_engine: int
    engine_ep: int

    @property
    def param_bytes(self) -> int:
        return round(self.params_billions * self.bytes_per_param * GB)

    def world(self) -> WorldShape:
        # tensors of about 256 MB: 1 GB buckets hold four, as a model's large tensors fill them
        tensors = max(16, self.param_bytes // (256 * 10**6))
        return WorldShape(
            num_cells=1,
            gpus_per_cell=self.train_gpus,
            num_engines=self.engines,
            gpus_per_engine=self.gpus_per_engine,
            param_bytes=self.param_bytes,
            num_tensors=tensors,
        )


H100_NIC = 45.4e9
"""Fitted per-GPU rate of the inter-node link under miles' updates (a 400 Gb/s NIC is 50
GB/s raw): the wire of every miles row and of Perplexity's."""
MILES_GATHER = 58.3e9
"""Fitted rate of Megatron's TP/EP all-gather with the HF conversion, per PP stage (the
two are one term: no published row tells them apart)."""

SYSTEMS: Mapping[str, TimeModel] = {
    # miles' broadcast path: NCCL from one rank per PP stage, each stage gathering its
    # share, a bucket's stages in turn (update_weight_from_distributed.py).
    "miles-nccl": TimeModel(
        link_bytes_per_second=H100_NIC,
        gather_bytes_per_second=MILES_GATHER,
        update_fixed_seconds=0.091,
    ),
    # miles' RDMA P2P path: the same gather, every trainer GPU writing its share, each
    # target rank taking its expert shard (p2p.py); its transfer plan and CPU model replica
    # are the larger fixed cost. A sender serving several engine ranks re-shards the bucket
    # for each in turn (reshard_bytes_per_second), but no rate is charged: only GLM-5's own
    # row asks for one (fitted without it, the rate comes out negative), and the rate its
    # row gives moves Qwen3-235B's held-out ratio from 1.21 to 1.41 (docs/timing.md).
    "miles-rdma": TimeModel(
        link_bytes_per_second=H100_NIC,
        gather_bytes_per_second=MILES_GATHER,
        update_fixed_seconds=1.225,
        many_source_p2p=True,
    ),
    # checkpoint-engine (MoonshotAI/checkpoint-engine README): host memory -> GPU ->
    # NCCL broadcast -> reload, pipelined; one fitted rate per GPU and a fixed cost.
    "checkpoint-engine-broadcast": TimeModel(
        link_bytes_per_second=96.33e9,
        update_fixed_seconds=0.812,
        broadcast_hop_seconds=0.000609,
        pipelined_buckets=True,
    ),
    "checkpoint-engine-p2p": TimeModel(
        link_bytes_per_second=64.0e9, update_fixed_seconds=0.640, pipelined_buckets=True
    ),
    # Perplexity's static RDMA schedule: every trainer GPU gathers and writes its own
    # share, pipelined; nothing of it is fitted (miles' link and gather rates).
    "perplexity-rdma": TimeModel(
        link_bytes_per_second=H100_NIC,
        gather_bytes_per_second=MILES_GATHER,
        many_source_p2p=True,
        pipelined_buckets=True,
    ),
}
"""The update path's fitted defaults, one row per system (the terms not named are the
simulator's: see TimeModel)."""


def _miles(params: float, nodes: int, pp: int, engine_gpus: int, ep: int) -> Cluster:
    """miles' P2P profiling setups: as many trainer nodes as rollout nodes, bf16 on the wire."""
    gpus = 8 * nodes
    return Cluster(params, 2.0, gpus, pp, gpus // engine_gpus, engine_gpus, ep)


CLUSTERS: Mapping[str, Cluster] = {
    # miles docs/advanced/p2p-weight-transfer.md, "Profiling Results" (H100, 1 GB buckets)
    "glm-4.7-flash-1+1": _miles(30, 1, 1, 4, 4),
    "qwen3-30b-a3b-2+2": _miles(30.5, 2, 1, 8, 8),
    "glm-4.5-air-4+4": _miles(106, 4, 4, 8, 8),
    "qwen3-235b-a22b-8+8": _miles(235, 8, 4, 32, 32),
    "glm-5-16+16": _miles(744, 16, 8, 64, 64),
    "kimi-k2-32+32": _miles(1040, 32, 8, 32, 32),
    # checkpoint-engine README: one engine over the whole job's GPUs, the weights as served
    "glm-4.5-air-8xh800": Cluster(106, 2.0, 8, 1, 1, 8, 1),
    "qwen3-235b-a22b-8xh800": Cluster(235, 2.0, 8, 1, 1, 8, 1),
    "deepseek-v3.1-fp8-16xh20": Cluster(671, 1.0, 16, 1, 1, 16, 1),
    "kimi-k2-fp8-16xh20": Cluster(1040, 1.0, 16, 1, 1, 16, 1),
    "deepseek-v3.1-fp8-256xh20": Cluster(671, 1.0, 256, 1, 16, 16, 1),
    "kimi-k2-fp8-256xh20": Cluster(1040, 1.0, 256, 1, 16, 16, 1),
    # Perplexity: 256 BF16 trainer GPUs -> 128 FP8 inference GPUs (FP8 on the wire), as
    # 8 engines of 16 GPUs with 16 expert shards; every trainer GPU its own share
    "kimi-k2-fp8-256+128": Cluster(1040, 1.0, 256, 256, 8, 16, 16),
}

KIMI_REQUANTIZE_SECONDS = 0.884
"""miles' Kimi-K2 rows include the rollout side's FP8 requantization (post_load_weights,
about 884 ms, "Profiling Results"): the rate that gives it on 32 GPUs per engine."""


def preset_timing(cluster_name: str, system: str) -> TimeModel:
    """The system's fitted terms with the cluster's layout."""
    cluster = CLUSTERS[cluster_name]
    timing = dataclasses.replace(
        SYSTEMS[system],
        gather_shares=cluster.gather_shares,
        engine_ep=cluster.engine_ep,
        engine_tp=cluster.gpus_per_engine,
    )
    if cluster_name == "kimi-k2-32+32":
        per_gpu = cluster.param_bytes / cluster.gpus_per_engine
        timing = dataclasses.replace(
            timing, quantize_bytes_per_second=per_gpu / KIMI_REQUANTIZE_SECONDS
        )
    return timing


ANCHOR_PRESETS: Mapping[str, tuple[str, str]] = {
    **{f"miles-{c}-{s}": (c, f"miles-{s}") for c in list(CLUSTERS)[:6] for s in ("nccl", "rdma")},
    **{
        f"checkpoint-engine-{c}-{s}": (c, f"checkpoint-engine-{s}")
        for c in list(CLUSTERS)[6:12]
        for s in ("broadcast", "p2p")
    },
    "perplexity-kimi-k2-fp8-256+128": ("kimi-k2-fp8-256+128", "perplexity-rdma"),
}
"""Preset name -> (cluster, system)."""

SYSTEM_MODES: Mapping[str, TransferMode] = {
    "miles-nccl": TransferMode.BROADCAST,
    "miles-rdma": TransferMode.P2P,
    "checkpoint-engine-broadcast": TransferMode.BROADCAST,
    "checkpoint-engine-p2p": TransferMode.P2P,
    "perplexity-rdma": TransferMode.P2P,
}
"""The transfer mode each system sends in."""

__all__ = ["ANCHOR_PRESETS", "CLUSTERS", "SYSTEMS", "SYSTEM_MODES", "Cluster", "preset_timing"]
