"""``python -m sim predict``: a preset's weight-update time by the simulator's model, or
(``--anchors``) every published row against its prediction; its help is calibrate's
(sim/cli/calibrate.py), which says how the model is fitted."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
