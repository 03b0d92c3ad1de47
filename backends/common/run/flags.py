"""The ``run`` command's flags, apart from the run itself: parsing (and refusing a bad flag)
imports neither Ray nor torch, so a wrong command fails at once."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from backends.common.training.flags import add_training_flags
from miles_core.loop.flags import add_loop_flags

OWN_FLAGS = ("steps",)


def build_parser(
    prog: str, description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The parser with its ``run`` command; ``extra`` adds a backend's own run flags."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="train (default) or run a scenario for real",
        allow_abbrev=False,  # a misspelt flag is an error, never a guess
    )
    run.add_argument(
        "--scenario",
        default=None,
        help="a scenario name (python -m sim list) or a .toml file (default: train 20 steps, "
        "no fault); a swarm seed runs here once saved with python -m sim run swarm "
        "--save-scenario FILE",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--trace", help="write a Chrome trace (open it in Perfetto)")
    run.add_argument(
        "--history",
        metavar="FILE",
        help="write the event history as JSON lines (python -m sim calibrate --history reads it)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.add_argument(
        "--plot", metavar="FILE", help="write a PNG of reward, staleness and update time per step"
    )
    run.add_argument(
        "--address", default=None, help="join this Ray cluster instead of starting one"
    )
    run.add_argument(
        "--metrics", metavar="FILE", help="write miles' rollout metrics as JSON lines, one per step"
    )
    run.add_argument("--save", metavar="DIR", help="save model, optimizer and ledger at the end")
    run.add_argument("--load", metavar="DIR", help="resume from a --save checkpoint")
    run.add_argument(
        "--timeout", type=float, default=900.0, help="wall seconds before the run counts as stalled"
    )
    run.add_argument(
        "--engine-token-seconds",
        type=float,
        default=None,
        metavar="S",
        help="a floor on each generated token's time (default: the scenario's [sim] "
        "engine_token_seconds, 0 unless set: as fast as the tiny policy goes, about a "
        "millisecond); longer requests live across more weight updates",
    )
    run.add_argument(
        "--flattened-bucket",
        action="store_true",
        help="send each weight bucket as one packed broadcast (load_format flattened_bucket); "
        "by default one broadcast per tensor, as miles' distributed path sends them",
    )
    if extra is not None:
        extra(run)
    add_training_flags(run)
    add_loop_flags(run, skip=OWN_FLAGS)
    return parser, sub
