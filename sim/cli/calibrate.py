"""Fit the simulator's transfer model to the transfer bench, and predict weight updates with it.

    python -m sim calibrate bench.json [--method backend] [--link link|nvlink] [--out fit.json]
    python -m sim predict PRESET [--bucket-mib 512] [--mode broadcast|p2p] [--calibration fit.json]
    python -m sim predict --anchors      (every published row: sim/timing/anchors.py)
    python -m sim calibrate --anchors    (the update path's terms fitted to those rows)

The simulator charges every send ``link_latency_seconds + bytes / bandwidth``
(sim.world.cluster.SimTransport: a broadcast is one send to all engines; p2p one send
per engine, all at once, so a bucket takes one link's send). A bench run
measured one bucketed method at several bucket sizes; with ``sends`` and
``bytes`` counted the way the simulator counts them, each measurement is one
equation ``seconds = latency * sends + bytes / bandwidth``, and least squares
over the bucket sizes gives latency and bandwidth. ``predict`` replays a whole
update through SimTransport itself (the preset's placement decides NVLink or
the inter-node link), so the prediction is the simulator's model and nothing
else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.outputs import check_distinct_paths
from miles_core.scenario import Preset
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, SYSTEM_MODES
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
        raise ConfigError("bench JSON", "fewer than two bucket sizes", "measure >= 2 bucket sizes")
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


def _load_json(path: str, field: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(field, f"{path} does not exist", "check the path") from None
    except json.JSONDecodeError as error:
        raise ConfigError(
            field, f"{path} is not JSON ({error})", "pass the file as written"
        ) from None


def _calibrate_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim calibrate", description=__doc__)
    parser.add_argument(
        "bench", nargs="?", help="the JSON of python -m backends.bench transfer --out"
    )
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="fit the update path's terms to the published rows (sim/timing/anchors.py) instead",
    )
    parser.add_argument("--method", default="backend", help="the bucketed method to fit")
    parser.add_argument(
        "--mode", default=None, help="the mode to write to --out (default: broadcast if measured)"
    )
    parser.add_argument("--link", default="link", choices=sorted(LINK_FIELDS))
    parser.add_argument("--out", default="fit.json", help="the fit, for predict --calibration")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.anchors:
        from sim.timing.anchor_report import calibrate_anchors_main

        if args.bench:
            parser.error("bench: pass a bench JSON or --anchors, not both")
        return calibrate_anchors_main(args.json)
    if not args.bench:
        parser.error("bench: missing; pass the JSON of python -m backends.bench transfer --out")
    try:
        check_distinct_paths({"--out": args.out or None}, {"bench": args.bench})
        summary = _load_json(args.bench, "bench")
        fits = calibrate(summary, args.method)
        mode = args.mode or ("broadcast" if "broadcast" in fits else sorted(fits)[0])
        if mode not in fits:
            raise ConfigError("--mode", f"{mode!r} was not measured", f"use one of {sorted(fits)}")
    except ConfigError as error:
        parser.error(str(error))
    chosen = fits[mode]
    out = {
        "method": args.method,
        "mode": mode,
        "link": args.link,
        "latency_seconds": chosen.latency_seconds,
        "bytes_per_second": chosen.bytes_per_second,
        "fits": {
            m: {
                "latency_seconds": f.latency_seconds,
                "bytes_per_second": f.bytes_per_second,
                "latency_clamped_at_zero": f.clamped,
                "points": [
                    {"sends": s, "bytes": n, "measured": t, "fitted": f.seconds(s, n)}
                    for s, n, t in f.points
                ],
            }
            for m, f in fits.items()
        },
    }
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    receivers = summary["config"]["receivers"]
    print(
        f"fit of {args.method} from {args.bench} "
        f"({receivers} receiver(s), {summary['config']['backend']}):"
    )
    for m, f in fits.items():
        note = " (free fit was negative: clamped)" if f.clamped else ""
        print(
            f"  {m:9s} latency {f.latency_seconds * 1e3:7.3f} ms per send{note}, "
            f"bandwidth {f.bytes_per_second / 1e9:6.2f} GB/s"
        )
        for s, n, t in f.points:
            print(
                f"    {s:5d} sends, {n / 1024**2:6.0f} MiB: measured {t:7.3f} s, "
                f"fit {f.seconds(s, n):7.3f} s"
            )
    print(
        f"wrote the {mode} fit as the '{args.link}' link to {args.out or '(nowhere)'}; "
        "predict any preset with it:"
    )
    example = "qwen3-30b-a3b-4x8-h100" if args.link == "link" else "small"
    print(f"  python -m sim predict {example} --calibration {args.out or 'fit.json'}")
    return 0


def _predict_main(argv: Sequence[str]) -> int:
    from miles_core.scenario import PRESETS

    parser = argparse.ArgumentParser(prog="python -m sim predict", description=__doc__)
    parser.add_argument("preset", nargs="?", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument(
        "--anchors",
        action="store_true",
        help="every published row against its prediction (sim/timing/anchors.py)",
    )
    parser.add_argument(
        "--bucket-mib",
        type=int,
        default=None,
        help=f"bucket size (default: {DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE >> 20}; "
        "an anchor preset's, 1024)",
    )
    parser.add_argument(
        "--mode",
        default=None,
        help="broadcast or p2p (default: broadcast; an anchor preset's system's mode)",
    )
    parser.add_argument(
        "--calibration", default=None, help="a fit.json from python -m sim calibrate"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.anchors:
        from sim.timing.anchor_report import predict_anchors_main

        if args.preset:
            parser.error("preset: pass a preset or --anchors, not both")
        return predict_anchors_main(args.json)
    anchor = ANCHOR_PRESETS.get(args.preset or "")
    if args.mode is None:
        args.mode = SYSTEM_MODES[anchor[1]].value if anchor else "broadcast"
    if args.bucket_mib is None:
        args.bucket_mib = 1024 if anchor else DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE >> 20
    try:
        if not args.preset:
            raise ConfigError("preset", "missing", f"name one of {sorted(PRESETS)} or --anchors")
        if args.preset not in PRESETS:
            raise ConfigError(
                "preset", f"unknown preset {args.preset!r}", f"use one of {sorted(PRESETS)}"
            )
        if args.mode not in (TransferMode.BROADCAST, TransferMode.P2P):
            raise ConfigError("--mode", f"got {args.mode!r}", "use broadcast or p2p")
        if args.bucket_mib < 1:
            raise ConfigError("--bucket-mib", f"got {args.bucket_mib}", "pass a size >= 1 MiB")
        config = PRESETS[args.preset]
        if args.calibration:
            config = apply_fit(config, _load_json(args.calibration, "--calibration"))
        result = predict_update_seconds(config, args.bucket_mib << 20, args.mode)
    except ConfigError as error:
        parser.error(str(error))
    result |= {"preset": args.preset, "mode": args.mode, "bucket_mib": args.bucket_mib}
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(
        f"{args.preset}: {result['bytes'] / 1e9:,.1f} GB in {result['buckets']} buckets of "
        f"{args.bucket_mib} MiB, {args.mode} over {LINK_NAMES[result['link']]}: "
        f"{result['seconds']:.2f} s ({result['effective_gbps']:.1f} GB/s)"
    )
    return 0


def main(argv: Sequence[str]) -> int:
    """Dispatch ``calibrate`` and ``predict`` (argv starts with the command)."""
    if argv[0] == "calibrate":
        if any(a == "--history" or a.startswith("--history=") for a in argv[1:]):
            from sim.cli.calibrate_history import main as fit_run

            return fit_run(argv[1:])
        return _calibrate_main(argv[1:])
    return _predict_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
