"""The simulator's transfer model fitted to the transfer bench (``calibrate``: least squares
of ``seconds = latency * sends + bytes / bandwidth`` over the bench's bucket sizes), and a
weight update predicted with it (``predict_update_seconds``: the update replayed through
SimTransport itself). How the sends and bytes are counted, and what a fit means, is the
commands' help: sim/cli/calibrate.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from miles_core.errors import ConfigError
from miles_core.scenario import Preset
from miles_core.transfer import (
    DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE,
    TransferMode,
    plan_buckets,
    plan_transfer,
)
from sim.world.cluster import SimCluster
from sim.world.runtime import SimRuntime

LINK_FIELDS = {"link": "link_bytes_per_second", "nvlink": "nvlink_bytes_per_second"}
LINK_NAMES = {"link": "the inter-node link", "nvlink": "NVLink"}


@dataclasses.dataclass(frozen=True)
class Fit:
    latency_seconds: float
    bytes_per_second: float
    points: tuple[tuple[int, int, float], ...]
    """(sends, bytes, measured seconds) per bucket size."""
    clamped: bool = False
    """The free fit gave a negative latency (noise): latency fixed at 0, bandwidth refit."""

    def seconds(self, sends: int, nbytes: int) -> float:
        return self.latency_seconds * sends + nbytes / self.bytes_per_second


def least_squares(points: Sequence[tuple[int, int, float]]) -> Fit:
    """seconds = a * sends + b * bytes, by the 2x2 normal equations; latency a, bandwidth 1/b."""
    if len(points) < 2:
        raise ConfigError(
            "bench JSON",
            "fewer than two bucket sizes (a default bench run times one)",
            "run the bench with --full, or --bucket-mib 4,16,64,256",
        )
    sxx = sum(s * s for s, _, _ in points)
    sxy = sum(s * n for s, n, _ in points)
    syy = sum(n * n for _, n, _ in points)
    sxt = sum(s * t for s, _, t in points)
    syt = sum(n * t for _, n, t in points)
    det = sxx * syy - sxy * sxy
    if det <= 0 or abs(det) < 1e-12 * sxx * syy:
        raise ConfigError(
            "bench JSON",
            "send counts are proportional to bytes, so latency and bandwidth cannot be told apart",
            "measure bucket sizes that give different bucket counts",
        )
    a = (syy * sxt - sxy * syt) / det
    b = (sxx * syt - sxy * sxt) / det
    clamped = a < 0
    if clamped:
        a, b = 0.0, syt / syy
    if b <= 0:
        raise ConfigError("bench JSON", "times do not grow with bytes", "rerun the bench")
    return Fit(a, 1 / b, tuple(points), clamped)


def points_of(summary: Mapping[str, Any], mode: str, method: str) -> list[tuple[int, int, float]]:
    """(sends, bytes, median seconds) of one method in one mode, counted as SimTransport does."""
    payload = int(summary["payload_bytes"])  # p2p's links run at once: one send per bucket
    points = []
    for r in summary["results"]:
        if (r["mode"], r["method"]) == (mode, method) and r["bucket_bytes"]:
            points.append((int(r["buckets"]), payload, float(r["seconds"]["median"])))
    return sorted(points)


def calibrate(summary: Mapping[str, Any], method: str = "backend") -> dict[str, Fit]:
    modes = sorted({r["mode"] for r in summary.get("results", [])})
    if not modes:
        raise ConfigError("bench JSON", "has no results", "pass the --out file of the bench")
    points = {m: points_of(summary, m, method) for m in modes}
    if not any(points.values()):
        methods = sorted({r["method"] for r in summary["results"] if r["bucket_bytes"]})
        raise ConfigError(
            "--method", f"{method!r} has no bucketed results", f"use one of {methods}"
        )
    return {m: least_squares(p) for m, p in points.items()}


def predict_update_seconds(
    config: Preset,
    buffer_size: int = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE,
    mode: TransferMode | str = TransferMode.BROADCAST,
    seed: int = 0,
) -> dict[str, Any]:
    """One full-weight update from cell 0 to every engine, timed by SimTransport itself."""
    rt = SimRuntime(seed)
    cluster = SimCluster(rt, config.world, config.timing)
    buckets = plan_buckets(cluster.units, buffer_size)

    async def update() -> float:
        transport = cluster.transport
        await transport.connect(0, 0, dict.fromkeys(cluster.engine_ids, 0))
        for bucket in buckets:
            plan = plan_transfer(mode, (bucket,), cluster.engine_ids)
            targets = {e: 0 for t in plan.transfers for e in t.targets}  # the first processes
            if plan.mode is TransferMode.P2P:  # as the update loop sends: every link at once
                await transport.send_bucket_each(0, 0, bucket, targets)
            else:
                await transport.send_bucket(0, 0, bucket, targets)
        return rt.now()

    seconds = rt.run(update())
    local = all(cluster.engine_nodes[e] <= cluster.cell_nodes[0] for e in cluster.engine_ids)
    nbytes = sum(b.nbytes for b in buckets)
    return {
        "seconds": seconds,
        "buckets": len(buckets),
        "bytes": nbytes,
        "link": "nvlink" if local and len(cluster.cell_nodes[0]) == 1 else "link",
        "effective_gbps": nbytes / seconds / 1e9,
    }


def apply_fit(config: Preset, fit: Mapping[str, Any]) -> Preset:
    """The preset with the calibrated latency and the bandwidth of the fitted link kind."""
    timing = dataclasses.replace(
        config.timing,
        link_latency_seconds=float(fit["latency_seconds"]),
        **{LINK_FIELDS[fit["link"]]: float(fit["bytes_per_second"])},
    )
    return dataclasses.replace(config, timing=timing)
