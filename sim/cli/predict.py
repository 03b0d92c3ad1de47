"""``python -m sim predict``: a preset's weight-update time by the simulator's model,
(``--anchors``) every published row against its prediction, (``--decode``) the engines'
decode law against published throughput figures, (``--profiles``) three faults under
each miles profile (sim/timing/profile_compare.py), or (``--cluster FILE.toml``)
any cluster described in a file, term by term (sim/timing/cluster_file.py and cluster_setup.py,
docs/clusters.md); its help is calibrate's (sim/cli/calibrate.py), which says how the model
is fitted."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from miles_core.errors import ConfigError
from miles_core.scenario.anchor_presets import ANCHOR_PRESETS, SYSTEM_MODES
from miles_core.transfer import DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE, TransferMode
from sim.cli import calibrate as calibrate_command
from sim.cli.calibrate import load_json
from sim.timing.calibration import LINK_NAMES, apply_fit, predict_update_seconds


def main(argv: Sequence[str]) -> int:
    from miles_core.scenario import PRESETS

    parser = argparse.ArgumentParser(
        prog="python -m sim predict", description=calibrate_command.__doc__
    )
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
        "an anchor preset's, 1024; with --cluster, the file's bucket_mib)",
    )
    parser.add_argument(
        "--mode",
        default=None,
        help="broadcast or p2p (default: broadcast; an anchor preset's system's mode)",
    )
    parser.add_argument(
        "--calibration", default=None, help="a fit.json from python -m sim calibrate"
    )
    parser.add_argument(
        "--cluster",
        metavar="FILE.toml",
        help="a cluster from a file: model, trainer, engines, links, transfer "
        "(docs/clusters.md; clusters/ holds every anchor preset as one)",
    )
    parser.add_argument(
        "--register",
        action="store_true",
        help="the register of predictions (docs/predictions.md), each predicted again today",
    )
    parser.add_argument(
        "--decode",
        action="store_true",
        help="the engines' decode law against published throughput figures, held out by "
        "source (docs/decode-law.md)",
    )
    parser.add_argument(
        "--profiles",
        action="store_true",
        help="a killed engine, a hung engine and a killed trainer cell under each miles "
        "profile, at two presets: recovery and serving capacity lost (docs/miles.md)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.profiles:
        from sim.timing.profile_compare import report as profiles_report

        if args.preset or args.anchors or args.cluster or args.register or args.decode:
            parser.error("--profiles: goes alone")
        print(profiles_report())
        return 0
    if args.decode:
        from sim.timing.decode_report import report

        given = (("preset", args.preset), ("--anchors", args.anchors), ("--cluster", args.cluster))
        others = [flag for flag, value in given if value] + ["--json"] * args.json
        if others or args.register:
            parser.error(f"--decode: goes alone, without {', '.join(others or ['--register'])}")
        print(report())
        return 0
    if args.register:
        from sim.timing.register import print_register, register_json

        given = (("preset", args.preset), ("--anchors", args.anchors), ("--cluster", args.cluster))
        others = [flag for flag, value in given if value]
        if others:
            parser.error(f"--register: goes alone (or with --json), without {', '.join(others)}")
        if args.json:
            print(json.dumps(register_json(), sort_keys=True))
            return 0
        return print_register()
    if args.cluster is not None:
        return _predict_cluster(parser, args)
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
            config = apply_fit(config, load_json(args.calibration, "--calibration"))
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


def _predict_cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--cluster: the file's update, checked before any work, printed term by term."""
    from sim.timing.cluster_file import load_cluster
    from sim.timing.cluster_setup import cluster_setup, predict_cluster

    try:
        for flag, given in (("preset", args.preset), ("--anchors", args.anchors)):
            if given:
                raise ConfigError(flag, "given with --cluster", "pass one of them")
        for flag, given in (("--mode", args.mode), ("--calibration", args.calibration)):
            if given is not None:
                raise ConfigError(flag, "given with --cluster", "set it in the file's [transfer]")
        if args.bucket_mib is not None and args.bucket_mib < 1:
            raise ConfigError("--bucket-mib", f"got {args.bucket_mib}", "pass a size >= 1 MiB")
        result = predict_cluster(cluster_setup(load_cluster(args.cluster), args.bucket_mib))
    except ConfigError as error:
        parser.error(str(error))
    print(json.dumps(result, sort_keys=True) if args.json else "\n".join(cluster_lines(result)))
    return 0


TERMS = {
    "fixed": "per update, on the source",
    "prepare": "pack + gather + convert (+ p2p re-shard), on the trainer",
    "wire": "buckets on the link",
    "land": "requantize + load, on the engines",
}


def cluster_lines(r: Mapping[str, Any]) -> list[str]:
    """--cluster's report: the layout, the update's time, each term and each rate's origin."""
    m, tr, en = r["model"], r["trainer"], r["engines"]
    experts = f", {m['experts']} experts" if m["experts"] else ""
    how = "many-source p2p" if r["many_source_p2p"] and r["mode"] == "p2p" else r["mode"]
    how += ", buckets pipelined" if r["pipelined_buckets"] else ", stages in turn"
    lines = [
        f"{r['cluster']}: {m['name']}, {m['params_billions']:g}B parameters in {m['dtype']} "
        f"({m['layers']} layers{experts})",
        f"  trainer: {tr['gpus']} GPUs ({tr['nodes']} nodes x {tr['gpus_per_node']}), TP "
        f"{tr['tp']} PP {tr['pp']} CP {tr['cp']} EP {tr['ep']}",
        f"  engines: {en['count']} x {en['gpus']} GPUs, TP {en['tp']} EP {en['ep']}"
        + (", colocated with the trainer" if en["colocated"] else ""),
        f"  transfer: {r['system'] or 'no system (the links alone)'}, {how}",
        f"  weights: {r['bytes'] / 1e9:,.1f} GB in {r['buckets']:,} buckets of "
        f"{r['bucket_mib']} MiB",
        f"  update: {r['seconds']:.3f} s ({r['effective_gbps']:.1f} GB/s)",
    ]
    lines += [f"    {k:<8} {v:8.3f} s   {TERMS[k]}" for k, v in r["terms"].items()]
    lines.append("  rates:")
    for name, rate in r["rates"].items():
        lines.append(f"    {name:<24} {rate['value']:>9.4g} {rate['unit']:<5} {rate['source']}")
    return lines


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
