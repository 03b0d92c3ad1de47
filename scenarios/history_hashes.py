"""Every named scenario and every scenario file, at seeds 0-2, under each miles profile: the
history hash that ``python -m sim run NAME --seed S --miles-profile P --json`` prints, one
line each.

    python scenarios/history_hashes.py            # print the lists
    python scenarios/history_hashes.py --write    # record them (one file per profile)
    python scenarios/history_hashes.py --check    # compare with the records; exit 1 if any differs

scenarios/history_hashes.txt is the ``aug2026`` profile's record (miles at 31f1ca9): it is the
record every run was made under before the profiles existed, unchanged by them, so the old
profile provably replays every earlier history. history_hashes_today.txt is the ``today``
profile's (the default).

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
RECORDS = {"aug2026": HERE / "history_hashes.txt", "today": HERE / "history_hashes_today.txt"}
"""Each miles profile's record (miles_core.profile.MilesProfile values)."""
SEEDS = (0, 1, 2)


def sources() -> list[str]:
    """What ``python -m sim list`` names, then every file in scenarios/files/ (by its path
    from the repository root, as a user types it)."""
    from miles_core.scenario import SCENARIOS
    from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS

    files = sorted(p.relative_to(ROOT).as_posix() for p in (HERE / "files").glob("*.toml"))
    return [*SCENARIOS, SWARM, SWARM_TOTAL_LOSS, *files]


def line(source: str, seed: int, profile: str = "aug2026") -> str:
    """``SOURCE SEED HASH STATUS`` of the run ``python -m sim run SOURCE --seed SEED
    --miles-profile PROFILE`` makes, made by that command's own code (its exit code is the
    run's, not this list's)."""
    from sim.__main__ import main

    out = io.StringIO()
    argv = ["run", source, "--seed", str(seed), "--miles-profile", profile, "--json"]
    with contextlib.redirect_stdout(out), contextlib.chdir(ROOT):
        main(argv)
    summary = json.loads(out.getvalue())
    return f"{source} {seed} {summary['history_hash']} {summary['status']}"


def lines(profile: str) -> Iterator[str]:
    for source in sources():
        for seed in SEEDS:
            yield line(source, seed, profile)


def recorded(profile: str = "aug2026") -> list[str]:
    return RECORDS[profile].read_text().splitlines()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python scenarios/history_hashes.py")
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--write", action="store_true", help="record the lists (one file per profile)"
    )
    what.add_argument("--check", action="store_true", help="compare with the record")
    args = parser.parse_args(argv)
    status = 0
    for profile, record in RECORDS.items():
        now = list(lines(profile))
        if args.write:
            record.write_text("\n".join(now) + "\n")
            print(f"wrote {len(now)} lines to {record}")
        elif args.check:
            differ = sorted(set(now) ^ set(recorded(profile)))
            print("\n".join(differ) or f"{profile}: all {len(now)} runs hash as recorded")
            status = 1 if differ else status
        else:
            print("\n".join(f"{row} {profile}" for row in now))
    return status


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
