"""``python -m sim shrink``: a failing run made small (see sim/search/shrinker.py).

    python -m sim shrink 'python -m sim run swarm --seed 7 --steps 12' [--out FILE]
    python -m sim shrink swarm --seed 7 [--aim ...] [--plant NAME] [any `sim run` flag]

The run is given as its replay line (one quoted argument) or as ``sim run``'s
own arguments. It must fail; the oracle to keep failing is the first that
failed, or ``--oracle``. Writes the shrunk scenario as TOML (``--out``, default
``shrunk-seedN.toml``) and prints the line that replays it.

Exit codes: 0 when a failing scenario was written; 2 when the command is wrong
or the run passes (nothing to shrink).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys

from miles_core.errors import ConfigError
from miles_core.outputs import check_distinct_paths
from miles_core.report import check_writable
from miles_core.scenario import save_scenario_file, scenario_from_toml, scenario_to_toml
from sim.cli.run import parser as run_parser
from sim.cli.run import scenario_file, scenario_of
from sim.run import replay_command, run_scenario
from sim.search.aim import parse_aim
from sim.search.plants import check_plant, planted
from sim.search.shrinker import Shrinker, shrink, signature


def _own_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sim shrink", add_help=False, allow_abbrev=False)
    p.add_argument("--out", metavar="FILE", help="where to write the shrunk scenario")
    p.add_argument("--oracle", help="the oracle that must keep failing (default: the first)")
    p.add_argument("-h", "--help", action="store_true")
    return p


def _run_argv(rest: list[str]) -> list[str]:
    """``sim run``'s arguments, from a replay line or as given."""
    if len(rest) == 1 and rest[0].startswith("python"):
        words = shlex.split(rest[0])
        if words[1:4] != ["-m", "sim", "run"]:
            raise ConfigError("REPLAY", f"got {rest[0]!r}", "pass a line 'python -m sim run ...'")
        return words[4:]
    return rest


def main(argv: list[str]) -> int:
    own, rest = _own_flags().parse_known_args(argv)
    if own.help:
        print(__doc__)
        return 0
    parser = run_parser()  # the run command's parsing, under python -m sim's usage
    try:
        args = parser.parse_args(["run", *_run_argv(rest)])
        if args.plant is not None:
            check_plant(args.plant)
        args.aim = parse_aim(args.aim) if args.aim is not None else None
        scenario = scenario_of(args)
        out = check_writable(own.out or f"shrunk-seed{args.seed}.toml", "--out")
        check_distinct_paths({"--out": out}, {"the scenario file": scenario_file(args.scenario)})
    except ConfigError as error:
        parser.error(str(error))
    with planted(args.plant):
        first = run_scenario(scenario, args.seed)
    failed = [name for name, v in first.verdicts.items() if v is not None]
    if not failed or (own.oracle is not None and own.oracle not in failed):
        what = own.oracle or "any oracle"
        print(f"the run does not fail {what} (failed: {failed or 'none'}): nothing to shrink")
        return 2
    oracle = own.oracle or failed[0]
    shrinker = Shrinker(args.seed, oracle, args.plant, signature(first.verdicts[oracle]))
    small = shrink(scenario, shrinker)
    name = f"shrunk from seed {args.seed}: fails {shrinker.oracle}"
    origin = shlex.join(["python", "-m", "sim", "run", *_run_argv(rest)])
    small = dataclasses.replace(small, name="shrunk", description=f"{name} (from: {origin})")
    small = small.with_run(seed=args.seed)
    written = scenario_from_toml(scenario_to_toml(small), str(out))
    if not shrinker.fails(written):  # what the file replays, run once more, as a user would
        print(
            f"the shrunk scenario no longer fails {shrinker.oracle} the same way when run from "
            f"its file: nothing written (report this; the original run: {origin})",
            file=sys.stderr,
        )
        return 1
    save_scenario_file(out, small)
    replay = replay_command(str(out), args.seed, plant=args.plant)
    print(
        f"{name} after {shrinker.runs} runs: faults {len(scenario.faults)} -> "
        f"{len(small.faults)}, steps {scenario.loop.steps} -> {small.loop.steps}, cells "
        f"{scenario.world.num_cells} -> {small.world.num_cells}, engines "
        f"{scenario.world.num_engines} -> {small.world.num_engines}"
    )
    for fault in small.faults:
        print(f"  {fault}")
    print(f"wrote {out}\nreplay: {replay}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
