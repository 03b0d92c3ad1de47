"""Command line of the transfer benchmark.

    python -m backends.bench transfer [--size-mib 256] [--mix qwen3-30b-a3b|uniform]
        [--receivers 1] [--bucket-mib 4,16,64,256] [--default-bucket-mib 64]
        [--modes broadcast,p2p] [--repeats 5] [--warmup 1] [--seed 0]
        [--backend auto|gloo|nccl] [--out bench.json] [--plot bench.png] [--json]
    python -m backends.bench transfer --markdown bench.json   (the table in docs/measurements.md)

One source and N receiver processes on 127.0.0.1 (gloo on CPU; NCCL when
CUDA is present and asked for: written, not run on the CPU machine the figures
in docs/measurements.md come from). Every process ends with the command, errors
included.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError, int_at_least
from miles_core.outputs import check_distinct_paths

MIB = 1024**2


def _ints(field: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(
            field, f"got {text!r}", "pass comma-separated whole MiB, e.g. 4,16,64"
        ) from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(field, f"got {text!r}", "pass one or more sizes >= 1 MiB")
    return values


def config_from_args(args: argparse.Namespace, cuda: bool) -> Any:
    """Check every flag; a bad one is a ConfigError naming it and the fix."""
    from backends.bench.methods import MODES
    from backends.bench.state import MIXES
    from backends.bench.worker import BenchConfig

    for field, value, least in (
        ("--size-mib", args.size_mib, 1),
        ("--receivers", args.receivers, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
        ("--tensors", args.tensors, 1),
    ):
        if not int_at_least(value, least):
            raise ConfigError(field, f"got {value!r}", f"pass a whole number >= {least}")
    if args.mix not in MIXES:
        raise ConfigError("--mix", f"got {args.mix!r}", f"use one of {', '.join(MIXES)}")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError("--modes", f"got {args.modes!r}", f"use a subset of {','.join(MODES)}")
    buckets = _ints("--bucket-mib", args.bucket_mib)
    if args.default_bucket_mib not in buckets:
        raise ConfigError(
            "--default-bucket-mib",
            f"{args.default_bucket_mib} is not among --bucket-mib {args.bucket_mib}",
            "pick one of the measured bucket sizes",
        )
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError("--backend", "nccl needs CUDA, which is not available", "use gloo")
    return BenchConfig(
        size_bytes=args.size_mib * MIB,
        mix=args.mix,
        tensors=args.tensors,
        receivers=args.receivers,
        bucket_sizes=tuple(b * MIB for b in buckets),
        default_bucket=args.default_bucket_mib * MIB,
        modes=modes,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        backend=backend,
        progress=not args.json,
    )


def run(cfg: Any) -> dict[str, Any]:
    """Spawn the ranks against a TCPStore this process hosts; the raw timings of rank 0."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from backends.bench.worker import HOST, rank_main

    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60)
    )
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # the shm ceilings' segment
    with (
        tempfile.TemporaryDirectory(prefix="transfer-bench-") as tmp,
        tempfile.TemporaryDirectory(prefix="transfer-bench-", dir=shm) as shared,
    ):
        out = str(Path(tmp) / "raw.json")
        # join=True: an error in one rank terminates the others; daemon: none outlives us
        mp.spawn(
            rank_main,
            args=(cfg, store.port, out, str(Path(shared) / "segment")),
            nprocs=cfg.receivers + 1,
            join=True,
            daemon=True,
        )
        return json.loads(Path(out).read_text())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m backends.bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser(
        "transfer",
        help="bucketed weight transfer vs its ceiling, naive and memcpy",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    t.add_argument("--size-mib", type=int, default=256, help="state-dict budget")
    t.add_argument("--mix", default="qwen3-30b-a3b", help="tensor mix: qwen3-30b-a3b or uniform")
    t.add_argument("--tensors", type=int, default=64, help="tensor count of the uniform mix")
    t.add_argument("--receivers", type=int, default=1, help="receiver ranks (engines)")
    t.add_argument("--bucket-mib", default="4,16,64,256", help="bucket sizes to sweep")
    t.add_argument("--default-bucket-mib", type=int, default=64, help="the headline bucket")
    t.add_argument("--modes", default="broadcast,p2p", help="transfer modes to measure")
    t.add_argument("--repeats", type=int, default=5, help="timed trials per figure")
    t.add_argument("--warmup", type=int, default=1, help="untimed trials per figure")
    t.add_argument("--seed", type=int, default=0, help="seed of the state dict's bytes")
    t.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    t.add_argument("--out", default="bench.json", help="summary JSON ('' to skip)")
    t.add_argument("--plot", default=None, help="PNG plot (default: --out with .png; '' skips)")
    t.add_argument("--json", action="store_true", help="print the summary JSON")
    t.add_argument(
        "--markdown", metavar="JSON", help="print the table of a written --out file as Markdown"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.markdown:
        from backends.bench.report import markdown

        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    plot_path = (
        args.plot
        if args.plot is not None
        else (args.out and str(Path(args.out).with_suffix(".png")))
    )
    try:
        plot_flag = "--plot" if args.plot is not None else "--plot (default: --out as .png)"
        check_distinct_paths({"--out": args.out or None, plot_flag: plot_path or None})
        import torch

        cfg = config_from_args(args, torch.cuda.is_available())
    except ConfigError as error:
        parser.error(str(error))
    from backends.bench.report import plot, summarize, table

    started = time.perf_counter()
    summary = summarize(run(cfg), cfg.as_json())
    summary["wall_seconds"] = time.perf_counter() - started
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))
    if plot_path:
        try:
            plot(summary, Path(plot_path))
        except ConfigError as error:
            print(f"no plot: {error}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(table(summary))
        print(f"({summary['wall_seconds']:.0f} s; JSON {args.out or '-'}, plot {plot_path or '-'})")
    return 0 if summary["all_weights_bitwise_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
