"""Every named scenario and every scenario file, at seeds 0-2: the history hash that
``python -m sim run NAME --seed S --json`` prints, one line each.

    python scenarios/history_hashes.py            # print the list
    python scenarios/history_hashes.py --write    # record it in scenarios/history_hashes.txt
    python scenarios/history_hashes.py --check    # compare with the record; exit 1 if any differs

The record pins behaviour across changes that must not alter it (a move of code, a
split of a module): scenarios/test_history_hashes.py compares every run with it. A change
that means to alter a run's history rewrites the record with ``--write`` and says why in
its commit. A hash reads a traceback as "" (miles_core.events ``_WHERE_NOT_WHAT``), so
moving code does not change it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECORD = HERE / "history_hashes.txt"
SEEDS = (0, 1, 2)


def sources() -> list[str]:
    """What ``python -m sim list`` names, then every file in scenarios/files/ (by its path
    from the repository root, as a user types it)."""
    from miles_core.scenario import SCENARIOS
    from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS

    files = sorted(p.relative_to(ROOT).as_posix() for p in (HERE / "files").glob("*.toml"))
    return [*SCENARIOS, SWARM, SWARM_TOTAL_LOSS, *files]


def line(source: str, seed: int) -> str:
    """``SOURCE SEED HASH STATUS`` of the run ``python -m sim run SOURCE --seed SEED`` makes,
    made by that command's own code (its exit code is the run's, not this list's)."""
    from sim.__main__ import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.chdir(ROOT):
        main(["run", source, "--seed", str(seed), "--json"])
    summary = json.loads(out.getvalue())
    return f"{source} {seed} {summary['history_hash']} {summary['status']}"


def lines() -> Iterator[str]:
    for source in sources():
        for seed in SEEDS:
            yield line(source, seed)


def recorded() -> list[str]:
    return RECORD.read_text().splitlines()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python scenarios/history_hashes.py")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help=f"record the list in {RECORD.name}")
    what.add_argument("--check", action="store_true", help="compare with the record")
    args = parser.parse_args(argv)
    now = list(lines())
    if args.write:
        RECORD.write_text("\n".join(now) + "\n")
        print(f"wrote {len(now)} lines to {RECORD}")
        return 0
    if args.check:
        differ = sorted(set(now) ^ set(recorded()))
        print("\n".join(differ) or f"all {len(now)} runs hash as recorded")
        return 1 if differ else 0
    print("\n".join(now))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
