"""Command line of the simulator: a command's name to its module in sim/cli/ (the table is
``sim.cli.COMMANDS``), imported only when it runs, so that ``python -m sim run`` never
imports Ray.

    python -m sim list
    python -m sim run [NAME_OR_FILE] [--seed N] [--steps K] ...   (sim/cli/run.py)
    python -m sim sweep [--seeds N] ...     (many seeds on Ray; see sim/search/fanout.py)
    python -m sim shrink REPLAY_OR_SCENARIO (a failing run made small; sim/search/shrinker.py)
    python -m sim findability [--seeds N]   (seeds that catch each planted bug; on Ray)
    python -m sim bench                     (simulator speed; see sim/cli/bench.py)
    python -m sim plan PLAN.toml [--out DIR] [--sensitivity] (search settings and the split; the
                          front; where the published point lands; docs/planner.md)
    python -m sim predict --cluster FILE.toml   (any cluster's update, term by term)
    python -m sim predict --register [--json] (the register of predictions)
    python -m sim calibrate bench.json      (fit the transfer model; sim/timing/calibration.py)
    python -m sim predict PRESET            (a weight update's time by that model)
    python -m sim predict --anchors         (every published update time; docs/timing.md)
    python -m sim calibrate --anchors       (the update path's terms fitted to them)
    python -m sim calibrate --history A.jsonl --scenario A.toml [--check B.jsonl
                          --check-scenario B.toml]   (fit to real runs; sim/timing/run_fit.py)
    python -m sim judge-joined A.jsonl B.jsonl ...   (a killed job's runs, joined and judged)

Exit codes (every command): 0 when every oracle passed; 1 when one failed, with the command
that replays the run as the last line on stderr; 2 when the command is wrong (nothing
ran); 130 after Ctrl-C (sim/cli/run.py says what a run does then).
"""

from __future__ import annotations

import importlib
import sys

from miles_core.ctrl_c import exit_on_ctrl_c


def main(argv: list[str] | None = None) -> int:
    from sim.cli import BY_NAME

    argv = sys.argv[1:] if argv is None else argv
    command = BY_NAME.get(argv[0]) if argv else None
    if command is None or command.module == "sim.cli.run":  # list, run, --help, a wrong name
        return importlib.import_module("sim.cli.run").main(argv)
    return importlib.import_module(command.module).main(argv[1:])


if __name__ == "__main__":
    exit_on_ctrl_c()  # before the imports below: a Ctrl-C in them exits 130, no traceback
    from miles_core.report import exit_cli

    exit_cli(main)
