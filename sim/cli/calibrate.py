"""Fit the simulator's transfer model to the transfer bench, and predict weight updates with it.

    python -m sim calibrate bench.json [--method backend] [--link link|nvlink] [--out fit.json]
    python -m sim predict PRESET [--bucket-mib 512] [--mode broadcast|p2p] [--calibration fit.json]
    python -m sim predict --anchors      (every published row: sim/timing/anchors.py)
    python -m sim calibrate --anchors    (the update path's terms fitted to those rows)

The simulator charges every send ``link_latency_seconds + bytes / bandwidth``
(sim.world.transport.SimTransport: a broadcast is one send to all engines; p2p one send
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
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.outputs import check_distinct_paths
from miles_core.user_files import JSON_BYTES, read_user_text
from sim.scenarios import find_scenario
from sim.timing import run_fit
from sim.timing.calibration import LINK_FIELDS, calibrate


def load_json(path: str, field: str) -> Any:
    try:
        return json.loads(read_user_text(path, field, JSON_BYTES, "a JSON file"))
    except json.JSONDecodeError as error:
        raise ConfigError(
            field, f"{path} is not JSON ({error})", "pass the file as written"
        ) from None


def _bench_main(argv: Sequence[str]) -> int:
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
        summary = load_json(args.bench, "bench")
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


def _history_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim calibrate --history", description=run_fit.__doc__
    )
    parser.add_argument(
        "--history",
        required=True,
        action="append",
        help="a real run's --history file (again for more runs: the fit pools them)",
    )
    parser.add_argument(
        "--scenario", required=True, help="the scenario the first run ran (its time model)"
    )
    parser.add_argument("--check", help="another real run's --history, to predict")
    parser.add_argument("--check-scenario", help="the scenario --check's run ran")
    parser.add_argument("--seed", type=int, default=0, help="the seed --check's run used")
    parser.add_argument("--out", help="write the fitted figures as JSON")
    parser.add_argument("--json", action="store_true")
    return parser


def _history_main(argv: Sequence[str]) -> int:
    parser = _history_parser()
    args = parser.parse_args(argv)
    try:
        if (args.check is None) != (args.check_scenario is None):
            raise ConfigError(
                "--check", "needs --check-scenario (and the other way round)", "pass both"
            )
        if args.check in args.history:
            raise ConfigError("--check", f"{args.check} is fitted on", "check another run")
        inputs = {f"--history {h}": Path(h) for h in args.history}
        inputs["--check"] = Path(args.check) if args.check else None
        check_distinct_paths({"--out": Path(args.out) if args.out else None}, inputs)
        histories = [run_fit.read_history(h) for h in args.history]
        scenario = find_scenario(args.scenario)
        timing, how = run_fit.fit_timing(histories, scenario)
        units = run_fit.model_units(histories[0])
        rows = None
        if args.check:
            real = run_fit.figures(run_fit.read_history(args.check, "--check"))
            other = find_scenario(args.check_scenario)
            predicted = run_fit.figures(run_fit.check(other, timing, args.seed, units))
            rows = run_fit.compare(real, predicted)
    except ConfigError as error:
        parser.error(str(error))
    out = run_fit.timing_json(timing, how, units) | {"check": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0 if rows is None or all(r["within"] for r in rows if r["real"]) else 1
    runs = ", ".join(args.history)
    size = f"a model of {sum(units)} bytes in {len(units)} units" if units else "no model"
    print(f"fitted from {runs} (time model of {args.scenario}; {size}):")
    for field, value in out["timing"].items():
        print(f"  {field:30s} {value:12.6g}  {how.get(field, '(as the scenario has it)')}")
    if rows is None:
        return 0
    print(f"\n{args.check_scenario}, real ({args.check}) and predicted (seed {args.seed}):")
    print(f"  {'figure':20s} {'real':>9s} {'predicted':>9s} {'ratio':>6s}")
    for r in rows:
        if r["ratio"] is None:
            print(f"  {r['figure']:20s} (not in both runs)")
            continue
        mark = "within 1.25x" if r["within"] else "OFF by more than 1.25x"
        print(
            f"  {r['figure']:20s} {r['real']:8.2f}s {r['predicted']:8.2f}s {r['ratio']:6.2f}"
            f"  {mark}"
        )
    return 0 if all(r["within"] for r in rows if r["real"]) else 1


def main(argv: Sequence[str]) -> int:
    """``python -m sim calibrate``: a transfer bench's JSON, ``--anchors``, or ``--history``."""
    if any(a == "--history" or a.startswith("--history=") for a in argv):
        return _history_main(argv)
    return _bench_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
