"""A cluster file (sim/timing/cluster_file.py) as the simulator's input: the Cluster, world
and TimeModel the anchor presets build, each rate with where it came from, and the update
replayed through the simulator with its terms (``python -m sim predict --cluster``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from miles_core.scenario import Preset, TimeModel, WorldShape
from miles_core.scenario.anchor_presets import GB, SYSTEMS, Cluster
from miles_core.scenario.limits import Limits
from miles_core.transfer import TransferMode, plan_buckets
from sim.timing.calibration import predict_update_seconds
from sim.timing.cluster_file import (
    DTYPES,
    GATHER_EVERY_GPU,
    MAX_SENDS,
    TENSOR_BYTES,
    ClusterFile,
    require,
    wire_keys,
)
from sim.world.update_cost import Route, bucket_cost, update_fixed_seconds


@dataclass(frozen=True)
class Rate:
    """A figure the update's terms use, and where it came from."""

    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class ClusterSetup:
    """The file as the simulator takes it: the cluster, its preset, each rate's origin."""

    file: ClusterFile
    cluster: Cluster
    preset: Preset
    rates: Mapping[str, Rate]


def _check_sizes(f: ClusterFile) -> None:
    """Sizes a typo makes, within Limits' bounds (before a byte is counted as an int)."""
    limits, m = Limits(), f.model
    engine_gpus = 0 if f.engines.colocated else f.engines.count * f.engines.gpus
    total = f.trainer.gpus + engine_gpus
    require(
        total <= limits.gpus,
        "[trainer].nodes" if f.trainer.gpus >= engine_gpus else "[engines].count",
        f"{total} GPUs in all is more than the {limits.gpus} the simulator places",
        "check the figure",
    )
    nbytes = m.params_billions * DTYPES[m.dtype] * GB
    require(
        nbytes // TENSOR_BYTES <= limits.tensors,
        "[model].params_billions",
        f"{nbytes / 1e12:,.1f} TB of weights is more than the {limits.tensors} tensors of 256 "
        "MB this command plans",
        "check the figure (Kimi-K2 is 1040)",
    )


def _check_sends(f: ClusterFile, world: WorldShape) -> None:
    """A replay of at most MAX_SENDS sends."""
    sends = len(plan_buckets(world.units(), f.transfer.bucket_mib << 20)) * f.engines.count
    require(
        sends <= MAX_SENDS,
        "[engines].count",
        f"the update is {sends} sends (buckets x engines), more than the {MAX_SENDS} this "
        "command replays",
        "use larger buckets ([transfer] bucket_mib) or fewer, larger engines",
    )


def _timing(f: ClusterFile, cluster: Cluster) -> tuple[TimeModel, dict[str, str]]:
    """The system's fitted terms (without one, the simulator's bare model) with the file's
    layout and rates; and the key that set each field the file set."""
    changes: dict[str, Any] = {
        "gather_shares": cluster.gather_shares,
        "engine_ep": f.engines.ep,
        "engine_tp": f.engines.tp,
    }
    given: dict[str, str] = {}
    wire = next((k for k in wire_keys(f) if k in f.links), None)
    for field, key in (("link", wire), ("nvlink", "nvlink_gbps")):
        if key in f.links:
            changes[f"{field}_bytes_per_second"] = f.links[key] * GB
            given[f"{field}_bytes_per_second"] = f"[links] {key}"
    seconds = f.engines.requantize_seconds
    if seconds is not None:
        per_gpu = cluster.param_bytes / cluster.gpus_per_engine
        changes["quantize_bytes_per_second"] = per_gpu / seconds
        given["quantize_bytes_per_second"] = f"[engines] requantize_seconds = {seconds:g}"
    base = SYSTEMS[f.transfer.system] if f.transfer.system else TimeModel()
    return dataclasses.replace(base, **changes), given


RATES = (
    ("wire", "link_bytes_per_second"),
    ("gather + convert", "gather_bytes_per_second"),
    ("re-shard per extra rank", "reshard_bytes_per_second"),
    ("convert", "convert_bytes_per_second"),
    ("requantize", "quantize_bytes_per_second"),
    ("load", "load_bytes_per_second"),
    ("fixed per update", "update_fixed_seconds"),
    ("fixed per bucket", "bucket_fixed_seconds"),
    ("per bucket per doubling", "broadcast_hop_seconds"),
    ("latency per bucket", "link_latency_seconds"),
)
"""The figures the update's terms use, as the output names them (those at 0 are not)."""


def _rates(f: ClusterFile, timing: TimeModel, given: Mapping[str, str]) -> dict[str, Rate]:
    system, bare, rates = f.transfer.system, TimeModel(), {}
    for name, field in RATES:
        value = getattr(timing, field)
        if field in given:
            source = given[field]
        elif system and getattr(SYSTEMS[system], field) != getattr(bare, field):
            source = f"fitted: {system}"
        else:
            source = "simulator default"
        per_second = field.endswith("bytes_per_second")
        if value:
            rates[name] = Rate(
                value / GB if per_second else value, "GB/s" if per_second else "s", source
            )
    used = {given[field].split()[1] for _, field in RATES if field in given}
    for key in (k for k in f.links if k not in used):
        why = "no bucket stays within a node" if key == "nvlink_gbps" else "not this wire's"
        rates[key] = Rate(f.links[key], "GB/s", f"[links] {key}, unused: {why}")
    return rates


def cluster_setup(f: ClusterFile, bucket_mib: int | None = None) -> ClusterSetup:
    """The file as the simulator's input (``bucket_mib``, --bucket-mib, replaces the file's)."""
    if bucket_mib is not None:
        f = dataclasses.replace(f, transfer=dataclasses.replace(f.transfer, bucket_mib=bucket_mib))
    _check_sizes(f)
    m, tr, en = f.model, f.trainer, f.engines
    shares = tr.gpus if f.transfer.system in GATHER_EVERY_GPU else tr.pp
    cluster = Cluster(m.params_billions, DTYPES[m.dtype], tr.gpus, shares, en.count, en.gpus, en.ep)
    world = dataclasses.replace(cluster.world(), gpus_per_node=tr.gpus_per_node)
    _check_sends(f, world)
    timing, given = _timing(f, cluster)
    return ClusterSetup(f, cluster, Preset(world, timing), _rates(f, timing, given))


def cluster_terms(
    preset: Preset, mode: TransferMode, bucket_bytes: int, within_a_node: bool = False
) -> dict[str, float]:
    """The update's seconds by term: sim/timing/anchors.py's update_terms for a mode where
    it takes a named system (a file may give a mode alone), on the route the simulator
    took; a test holds the two equal on every anchor preset."""
    t, w = preset.timing, preset.world
    route = Route(within_a_node, w.gpus_per_cell, w.num_engines, w.gpus_per_engine)
    terms = {"fixed": update_fixed_seconds(t), "prepare": 0.0, "wire": 0.0, "land": 0.0}
    for i, bucket in enumerate(plan_buckets(w.units(), bucket_bytes)):
        cost = bucket_cost(t, bucket.nbytes, route, mode is TransferMode.P2P)
        for stage, seconds in cost.charged(t.pipelined_buckets, first=i == 0).items():
            terms[stage] += seconds
    return terms


def predict_cluster(setup: ClusterSetup) -> dict[str, Any]:
    """The update replayed through the simulator, its terms, its rates and their origins."""
    f, preset = setup.file, setup.preset
    bucket_bytes = f.transfer.bucket_mib << 20
    result = predict_update_seconds(preset, bucket_bytes, f.transfer.mode)
    terms = cluster_terms(preset, f.transfer.mode, bucket_bytes, result["link"] == "nvlink")
    return result | {
        "cluster": f.path,
        "model": dataclasses.asdict(f.model),
        "trainer": dataclasses.asdict(f.trainer) | {"gpus": f.trainer.gpus},
        "engines": dataclasses.asdict(f.engines),
        "system": f.transfer.system,
        "mode": f.transfer.mode.value,
        "many_source_p2p": preset.timing.many_source_p2p,
        "pipelined_buckets": preset.timing.pipelined_buckets,
        "bucket_mib": f.transfer.bucket_mib,
        "terms": terms,
        "rates": {name: dataclasses.asdict(rate) for name, rate in setup.rates.items()},
    }


__all__ = [
    "ClusterSetup",
    "Rate",
    "cluster_setup",
    "cluster_terms",
    "predict_cluster",
]
