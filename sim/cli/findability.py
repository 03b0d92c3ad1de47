"""``python -m sim findability``: how findable each planted bug is by a swarm sweep.

    python -m sim findability [--seeds N] [--plant NAME ...] [--workers K] [--json]

For each planted bug (sim/search/plants.py; all of them by default) one sweep of the
same seeds with the bug in every worker, in one Ray session: the seeds that
caught it, the oracles that did, the seeds a sweep from the first one needed to
first catch it, and the seeds that catch it with 99% confidence at that rate.
A plant no seed catches is the sweep's blind spot: exit 1, naming it.

Exit codes: 0 when every plant was caught; 1 when one was not; 2 when the
command is wrong; 130 after Ctrl-C (the plants done so far are reported).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from miles_core.errors import ConfigError
from sim.cli.workers import check_workers
from sim.search.fanout import Source, sweep
from sim.search.plants import PLANTS, check_plant
from sim.search.swarm import SWARM
from sim.search.sweep_report import findability


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sim findability",
        description="sweep the swarm once per planted bug: how many seeds catch each",
        allow_abbrev=False,
    )
    p.add_argument("--seeds", type=int, default=1000, metavar="N", help="seeds 0..N-1 per plant")
    p.add_argument("--plant", action="extend", nargs="+", metavar="NAME", help="default: all")
    p.add_argument("--workers", type=int, help="tasks at once (default: the CPUs)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _row(plant: str, seeds: int, workers: int) -> dict[str, Any] | None:
    """One plant's sweep (None when Ctrl-C cut it short)."""
    run = sweep([Source(SWARM)], range(seeds), workers=workers, plant=plant, recheck=0)
    if run.interrupted:
        return None
    failed = {name: n for name, (_, n) in run.tally.oracles.items() if n}
    oracles = sorted(failed.items(), key=lambda item: (-item[1], item[0]))
    return {
        "plant": plant,
        "named_oracle": PLANTS[plant][1],
        "seeds": run.tally.seeds,
        **findability(run.tally),
        "caught_by": dict(oracles),
        "wall_seconds": round(run.wall_seconds, 1),
    }


def table(rows: list[dict[str, Any]]) -> list[str]:
    width = max(len(r["plant"]) for r in rows)
    lines = [f"  {'plant':{width}s} {'caught':>11s} {'first':>6s} {'99%':>6s}  oracles that caught"]
    for r in rows:
        caught = f"{r['caught']}/{r['seeds']}"
        first = r["seeds_to_first_catch"] or "-"
        needed = r["seeds_for_99_percent"] or "-"
        by = ", ".join(f"{name} {n}" for name, n in r["caught_by"].items()) or "none"
        lines.append(f"  {r['plant']:{width}s} {caught:>11s} {first!s:>6s} {needed!s:>6s}  {by}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.seeds < 1:
            raise ConfigError("--seeds", f"got {args.seeds}", "pass an integer >= 1")
        check_workers(args.workers)
        plants = args.plant or list(PLANTS)
        for name in plants:
            check_plant(name)
    except ConfigError as error:
        parser.error(str(error))
    from backends.common.session.ray_session import ray_session

    workers = args.workers or os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    interrupted = False
    try:
        with ray_session(0, None, workers, show_start=not args.json):
            for plant in plants:
                row = _row(plant, args.seeds, workers)
                if row is None:
                    interrupted = True
                    break
                rows.append(row)
                if not args.json:
                    print(f"{plant}: {row['caught']} of {row['seeds']} seeds", file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
    missed = [r["plant"] for r in rows if not r["caught"]]
    if args.json:
        print(json.dumps({"rows": rows, "missed": missed, "interrupted": interrupted}))
    elif rows:
        print("\n".join([f"findability over seeds 0-{args.seeds - 1} of the swarm:", *table(rows)]))
        if missed:
            print(f"caught by no seed: {', '.join(missed)}")
    if interrupted:
        return 130
    return 1 if missed else 0


__all__ = ["main", "table"]
