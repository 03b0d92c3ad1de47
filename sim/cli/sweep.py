"""``python -m sim sweep``: many seeds on Ray, judged by every oracle (see sim/search/fanout.py).

Exit codes: 0 when every seed passed and the re-checked seeds gave the same
hashes; 1 when a seed failed, a hash differed, or (``--require-probes``) a core
rare-state probe was reached by no seed; 2 when the command is wrong
(nothing ran); 130 after Ctrl-C (what finished is still reported).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

from tqdm import tqdm

from backends.common.session.address import check_address
from miles_core.errors import ConfigError
from miles_core.scenario.limits import Limits, check_steps
from sim.cli.workers import check_workers
from sim.scenarios import find_scenario
from sim.search.fanout import Source, SweepRun, Tally, sweep
from sim.search.plants import check_plant
from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS
from sim.search.sweep_report import summary, text_lines, write_out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim sweep",
        description="judge many seeds on Ray: verdicts, failing seeds, fault coverage",
        allow_abbrev=False,
    )
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds", type=_count, metavar="N", help="seeds 0..N-1 (default 1000; 1e6 is 1000000)"
    )
    seeds.add_argument("--seed-range", metavar="A:B", help="seeds A..B-1")
    p.add_argument(
        "--scenario",
        action="extend",
        nargs="+",
        metavar="swarm|NAME|FILE",
        help="what each seed runs; several after one flag or the flag repeated (default: swarm)",
    )
    p.add_argument("--steps", type=int, help="steps per run (default: the scenario's; swarm 12)")
    p.add_argument("--address", help="an existing Ray cluster (default: a local Ray)")
    p.add_argument("--workers", type=int, help="tasks at once (default: the CPUs Ray has)")
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    p.add_argument("--out", metavar="DIR", help="write sweep.json, coverage.png, failing seeds")
    p.add_argument(
        "--plant", metavar="NAME", help="a planted bug in every worker (sim/search/plants)"
    )
    p.add_argument("--recheck", type=int, default=20, metavar="N", help="seeds run twice")
    p.add_argument("--no-aim", action="store_true", help="never aim seeds at empty map cells")
    p.add_argument(
        "--liveness",
        action="store_true",
        help="every seed in liveness mode: faults, a heal, then progress within a bound",
    )
    p.add_argument(
        "--require-probes",
        action="store_true",
        help="fail (exit 1) when a core rare-state probe was reached by no seed",
    )
    return p


MAX_SEEDS = sys.maxsize
MAX_RECHECK = 10_000
"""Seeds run twice: the tally keeps each one's hash until its second run."""
"""The most seeds one sweep counts (seeds stream: memory does not grow with them)."""


def _count(text: str) -> int:
    """An integer, also written as a whole number in e-notation (``1e9``)."""
    try:
        value = Decimal(text)
    except InvalidOperation:
        value = Decimal("nan")
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    if value.copy_abs() > MAX_SEEDS:  # before int(): 1e999999999 has a billion digits
        raise argparse.ArgumentTypeError(
            f"{text} is more than {MAX_SEEDS}, the most a sweep counts"
        )
    return int(value)


def _seeds(args: argparse.Namespace) -> range:
    if args.seed_range is None:
        n = 1000 if args.seeds is None else args.seeds
        if not 1 <= n <= MAX_SEEDS:
            raise ConfigError("--seeds", f"got {n}", f"pass an integer from 1 to {MAX_SEEDS}")
        return range(n)
    a, sep, b = args.seed_range.partition(":")
    try:
        first, end = int(a), int(b)
    except ValueError:
        first, end = 0, -1
    if not sep or end <= first:
        raise ConfigError(
            "--seed-range", f"got {args.seed_range!r}", "write A:B with integers A < B"
        )
    if end - first > MAX_SEEDS:
        raise ConfigError(
            "--seed-range", f"got {end - first} seeds", f"pass at most {MAX_SEEDS} (B - A)"
        )
    return range(first, end)


def _sources(args: argparse.Namespace) -> list[Source]:
    sources = []
    for text in args.scenario or [SWARM]:
        if text in (SWARM, SWARM_TOTAL_LOSS):
            if args.steps is not None:  # a swarm keeps to the default bounds
                check_steps(args.steps, Limits(), "--steps")
            sources.append(Source(text))
        else:  # loaded here: a wrong name or file is refused before any seed runs
            scenario = find_scenario(text)
            scenario.with_run(steps=args.steps)  # --steps within its bounds and its faults
            sources.append(Source(text, scenario))
    return sources


def _check(args: argparse.Namespace) -> None:
    if args.steps is not None and args.steps < 1:
        raise ConfigError("--steps", f"got {args.steps}", "pass an integer >= 1")
    check_workers(args.workers, args.address)
    if not 0 <= args.recheck <= MAX_RECHECK:
        raise ConfigError(
            "--recheck", f"got {args.recheck}", f"pass an integer from 0 to {MAX_RECHECK}"
        )
    if args.plant is not None:
        check_plant(args.plant)
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError("--out", f"{args.out} is a file", "pass a directory (made if missing)")


def _needs_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "sweep", "needs Ray, which is not installed", "pip install -e '.[sweep]'"
        ) from None


class _Lines:
    """The sweep's bar where stderr is no terminal (CI, a log, a pipe), which tqdm would leave
    blank: a line every ``every`` seeds and at the last, in tqdm's words."""

    def __init__(self, total: int, every: int) -> None:
        self.total, self.every, self.n = total, every, 0
        self.started = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n % self.every == 0 or self.n == self.total:
            elapsed = time.perf_counter() - self.started
            meter = tqdm.format_meter(self.n, self.total, elapsed, unit="seed", ascii=True)
            print(f"sweep: {meter}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Nothing to clear: each line stays."""


LINES = 20
"""Lines a sweep prints without a terminal, one per this fraction of its seeds."""


def _progress(total: int, workers: int, quiet: bool) -> tqdm | _Lines:
    """A tqdm bar on a terminal; else a line per 1/LINES of the seeds (none with --json)."""
    if quiet or sys.stderr.isatty():
        return tqdm(total=total, unit="seed", disable=quiet)
    print(f"sweep: {total} seeds on {workers} workers", file=sys.stderr, flush=True)
    return _Lines(total, max(1, -(-total // LINES)))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _check(args)
        seeds, sources = _seeds(args), _sources(args)
        _needs_ray()
        check_address(args.address)  # a cluster nobody answers at: one line, not Ray's 72
    except ConfigError as error:
        parser.error(str(error))
    import ray

    from backends.common.session.ray_session import ray_session  # Ray only once the input is good

    local_workers = args.workers or os.cpu_count() or 1
    # what a Ctrl-C before the first seed leaves: nothing judged, and it says so
    run, workers, nodes = SweepRun(Tally(), interrupted=True), local_workers, 0
    try:  # Ctrl-C at any moment, Ray's start-up and shutdown included, reports and exits 130
        session = ray_session(0, args.address, local_workers, show_start=not args.json)
        with session:
            workers = args.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            nodes = sum(1 for n in ray.nodes() if n["Alive"])
            bar = _progress(len(seeds) * len(sources), workers, args.json)
            run = sweep(
                sources,
                seeds,
                workers=workers,
                steps=args.steps,
                plant=args.plant,
                recheck=args.recheck,
                aim=not args.no_aim,
                liveness=args.liveness,
                on_outcome=lambda outcome: bar.update(1),
            )
            bar.close()
    except KeyboardInterrupt:
        run.interrupted = True
    info = summary(run, workers, nodes, args.plant, args.liveness)
    written = write_out(Path(args.out), info, run.tally) if args.out is not None else []
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print("\n".join(text_lines(info, run.tally) + written))
    if run.interrupted:
        return 130
    missed = info["probes"]["core_missed"] if args.require_probes else []
    if missed:
        print(f"--require-probes: no seed reached {', '.join(missed)}", file=sys.stderr)
    return 0 if run.ok and not missed else 1


if __name__ == "__main__":
    sys.exit(main())
