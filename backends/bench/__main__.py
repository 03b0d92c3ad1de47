"""Command line of the transfer benchmark.

    python -m backends.bench transfer [--full] [--size-mib 256] [--mix qwen3-30b-a3b|uniform]
        [--receivers 1] [--bucket-mib 64] [--default-bucket-mib 64] [--methods LIST]
        [--modes broadcast,p2p] [--repeats 10] [--warmup 1] [--seed 0]
        [--backend auto|gloo|nccl] [--out bench.json] [--plot bench.png] [--json]
    python -m backends.bench transfer --markdown bench.json   (the table in docs/measurements.md)

One source and N receiver processes on 127.0.0.1 (gloo on CPU; NCCL when
CUDA is present and asked for: written, not run on the CPU machine the figures
in docs/measurements.md come from). A default run times the backend's own paths
at one bucket size against the ceiling (about a minute on 2 cores); ``--full``
adds the technique ladder and the sweep of bucket sizes. Every process ends with
the command, errors, Ctrl-C (exit 130) and SIGTERM (143) included, and nothing is
left in /dev/shm or /tmp (backends/bench/launch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError, int_at_least
from miles_core.outputs import check_distinct_paths

MIB = 1024**2


MAX_RECEIVERS = 64
"""More receivers than this on one machine time its scheduler, not the transfer."""
MEMORY_SHARE = 0.5
"""At most this share of the machine's available memory for the bench's copies."""
COPIES_PER_PROCESS = 3
"""What each process holds per payload byte: the model, the flat tensor, a bucket buffer
or the shared segment (measured: 256 MiB and one receiver peak near 1.6 GB in all)."""
FULL_BUCKETS = "4,16,64,256"


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


def _names(field: str, text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names or any(m not in known for m in names):
        raise ConfigError(field, f"got {text!r}", f"use a subset of {','.join(known)}")
    return names


def available_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be had without swapping)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3  # not Linux: assume a small machine


def _check_bounds(args: argparse.Namespace, buckets: tuple[int, ...]) -> None:
    """The sizes a user gives fit this machine, before any process starts."""
    if args.receivers > MAX_RECEIVERS:
        raise ConfigError(
            "--receivers",
            f"{args.receivers} is above the bound {MAX_RECEIVERS} (a process each)",
            f"pass at most {MAX_RECEIVERS}; more time the scheduler, not the transfer",
        )
    need = (args.receivers + 1) * COPIES_PER_PROCESS * args.size_mib * MIB
    have = int(available_bytes() * MEMORY_SHARE)
    if need > have:
        most = have // ((args.receivers + 1) * COPIES_PER_PROCESS * MIB)
        raise ConfigError(
            "--size-mib",
            f"{args.size_mib} MiB x {args.receivers + 1} processes needs about "
            f"{need / 1024**3:.1f} GiB, above half of this machine's available memory "
            f"({have / 1024**3:.1f} GiB)",
            f"pass --size-mib {most} or less, or fewer --receivers",
        )
    if max(buckets) > args.size_mib:
        raise ConfigError(
            "--bucket-mib",
            f"{max(buckets)} MiB is above the state dict's {args.size_mib} MiB",
            "pass bucket sizes up to --size-mib",
        )


def config_from_args(args: argparse.Namespace, cuda: bool) -> Any:
    """Check every flag; a bad one is a ConfigError naming it and the fix."""
    from backends.bench.methods import BUCKETED, MODES, QUICK_METHODS, QUICK_REFERENCES, REFERENCES
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
    modes = _names("--modes", args.modes, MODES)
    default_methods = ",".join(BUCKETED if args.full else QUICK_METHODS)
    methods = _names("--methods", args.methods or default_methods, BUCKETED)
    buckets = _ints("--bucket-mib", args.bucket_mib or (FULL_BUCKETS if args.full else "64"))
    if args.default_bucket_mib not in buckets:
        raise ConfigError(
            "--default-bucket-mib",
            f"{args.default_bucket_mib} is not among --bucket-mib {','.join(map(str, buckets))}",
            "pick one of the measured bucket sizes",
        )
    _check_bounds(args, buckets)
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
        progress=not args.no_progress,
        methods=methods,
        references=REFERENCES if args.full else QUICK_REFERENCES,
    )


def run(cfg: Any) -> dict[str, Any]:
    """Every rank to the end (backends/bench/launch.py); the raw timings of rank 0."""
    from backends.bench.launch import launch

    return launch(cfg.as_json(), cfg.receivers + 1)


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
    t.add_argument(
        "--full",
        action="store_true",
        help=f"the technique ladder and bucket sizes {FULL_BUCKETS} (several minutes)",
    )
    t.add_argument(
        "--bucket-mib",
        default=None,
        help=f"bucket sizes to sweep (default 64; --full {FULL_BUCKETS})",
    )
    t.add_argument(
        "--methods",
        default=None,
        help="bucketed methods to time (default the backend's own; --full all of them)",
    )
    t.add_argument("--default-bucket-mib", type=int, default=64, help="the headline bucket")
    t.add_argument("--modes", default="broadcast,p2p", help="transfer modes to measure")
    t.add_argument("--repeats", type=int, default=10, help="timed trials per figure")
    t.add_argument("--warmup", type=int, default=1, help="untimed trials per figure")
    t.add_argument("--seed", type=int, default=0, help="seed of the state dict's bytes")
    t.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    t.add_argument("--out", default="bench.json", help="summary JSON ('' to skip)")
    t.add_argument("--plot", default=None, help="PNG plot (default: --out with .png; '' skips)")
    t.add_argument("--json", action="store_true", help="print the summary JSON")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    t.add_argument(
        "--markdown", metavar="JSON", help="print the table of a written --out file as Markdown"
    )
    return parser


def _load() -> float | None:
    """The 1-minute load average: other work on the machine moves every figure with it."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


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
    from backends.bench.launch import BenchFailed, Interrupted
    from backends.bench.report import plot, summarize, table

    started, load_before = time.perf_counter(), _load()
    try:
        raw = run(cfg)
    except Interrupted as stop:
        print(f"transfer bench stopped by {stop}; every rank ended", file=sys.stderr)
        return stop.code
    except BenchFailed as error:
        print(f"transfer bench failed: {error}", file=sys.stderr)
        return 1
    summary = summarize(raw, cfg.as_json())
    summary["wall_seconds"] = time.perf_counter() - started
    summary["machine"] = {
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": _load(),
    }
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
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before the launcher took the signals: nothing started yet
        print("transfer bench stopped by SIGINT", file=sys.stderr)
        sys.exit(130)
