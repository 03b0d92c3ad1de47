"""One module per ``python -m sim`` command, named as the command; this table names them.

``list`` and ``run`` share the top-level parser (sim/cli/run.py), which also prints every
other command's help line; each other command's module parses its own arguments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    name: str
    """As typed: ``python -m sim NAME``."""
    module: str
    """Its module, whose ``main(argv)`` takes the arguments after the name."""
    help: str
    """Its line in ``python -m sim --help``."""


COMMANDS = (
    Command("list", "sim.cli.run", "the named scenarios, one line each"),
    Command("run", "sim.cli.run", "run a named scenario, a .toml scenario file, or a swarm"),
    Command("sweep", "sim.cli.sweep", "many seeds on Ray: verdicts, failing seeds, fault coverage"),
    Command(
        "shrink", "sim.cli.shrink", "make a failing run small: a TOML scenario that still fails"
    ),
    Command(
        "findability",
        "sim.cli.findability",
        "sweep once per planted bug: the seeds that catch each",
    ),
    Command("bench", "sim.cli.bench", "simulator speed"),
    Command(
        "plan",
        "sim.cli.plan",
        "search a cluster's settings: the front of throughput, ETTR, staleness, waste",
    ),
    Command(
        "calibrate",
        "sim.cli.calibrate",
        "fit the time model: a transfer bench, the published rows, real runs",
    ),
    Command(
        "predict",
        "sim.cli.predict",
        "a preset's weight-update time by the model; --anchors: every published one",
    ),
    Command(
        "judge-joined",
        "sim.cli.judge_joined",
        "the histories of a killed job and its resume, joined and judged",
    ),
)
HELP = {command.name: command.help for command in COMMANDS}
BY_NAME = {command.name: command for command in COMMANDS}
