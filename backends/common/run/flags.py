"""The ``run`` command's flags, each declared once: its name, type or choices, default, help,
and when the replay line spells it. Both real backends build their parser and their replay
line from these declarations (``RUN_FLAGS``, ``STACK_FLAGS``, and a backend's own in
``RealBackend.flags``), so a flag cannot be parsed one way and replayed another. The
training flags (backends/common/training/flags.py) and miles' loop flags
(miles_core/loop/flags.py) are declared where they are read, and replayed from there.

Parsing (and refusing a bad flag) imports neither Ray nor torch, so a wrong command fails
at once.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from backends.common.training.flags import add_training_flags
from miles_core.loop.flags import RUN_OWN_FLAGS, add_loop_flags, flags_argv, given_flags

if TYPE_CHECKING:
    from backends.common.stack import Stack
    from miles_core.scenario import Scenario


class Spelt(Enum):
    """When the replay line spells a flag: a failing run replays with what it ran, never
    with where it wrote or which cluster it joined."""

    NEVER = "never"
    ALWAYS = "always"
    GIVEN = "given"
    """When its value is not the default."""


@dataclass(frozen=True)
class Flag:
    """One flag of ``run``: what argparse is told, and how the replay line gives it again."""

    name: str
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None
    metavar: str | None = None
    switch: bool = False
    """Takes no value (``store_true``): spelt bare, when true."""
    replay: Spelt = Spelt.NEVER

    def __post_init__(self) -> None:
        if self.switch and self.default is not False:
            raise ValueError(f"{self.name}: a switch is off by default")

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        if self.switch:
            parser.add_argument(self.name, action="store_true", help=self.help)
            return
        parser.add_argument(
            self.name,
            type=self.type,
            choices=self.choices,
            default=self.default,
            metavar=self.metavar,
            help=self.help,
        )

    def words(self, value: Any) -> list[str]:
        """This flag as the replay line spells it, given the value the run took."""
        if self.replay is Spelt.NEVER or (self.replay is Spelt.GIVEN and value == self.default):
            return []
        return [self.name] if self.switch else [self.name, str(value)]


def switch(name: str, help: str, replay: Spelt = Spelt.NEVER) -> Flag:
    """A flag that takes no value, off unless given."""
    return Flag(name, help, default=False, switch=True, replay=replay)


RUN_FLAGS: tuple[Flag, ...] = (
    Flag(
        "--scenario",
        help="a scenario name (python -m sim list) or a .toml file (default: train 20 steps, "
        "no fault); a swarm seed runs here once saved with python -m sim run swarm "
        "--save-scenario FILE",
        replay=Spelt.GIVEN,
    ),
    Flag("--seed", type=int, default=0, replay=Spelt.ALWAYS),
    Flag("--steps", "override the scenario's steps", type=int, replay=Spelt.ALWAYS),
    Flag("--trace", "write a Chrome trace (open it in Perfetto)"),
    Flag(
        "--history",
        "write the event history as JSON lines (python -m sim calibrate --history reads it)",
        metavar="FILE",
    ),
    switch("--json", "print one JSON summary"),
    Flag("--plot", "write a PNG of reward, staleness and update time per step", metavar="FILE"),
    Flag("--address", "join this Ray cluster instead of starting one"),
    Flag("--metrics", "write miles' rollout metrics as JSON lines, one per step", metavar="FILE"),
    Flag("--save", "save model, optimizer and ledger at the end", metavar="DIR"),
    Flag("--load", "resume from a --save checkpoint", metavar="DIR", replay=Spelt.GIVEN),
    Flag("--timeout", "wall seconds before the run counts as stalled", type=float, default=900.0),
    Flag(
        "--engine-token-seconds",
        "a floor on each generated token's time (default: the scenario's [sim] "
        "engine_token_seconds, 0 unless set: as fast as the tiny policy goes, about a "
        "millisecond); longer requests live across more weight updates",
        type=float,
        metavar="S",
        replay=Spelt.GIVEN,
    ),
)
"""What to run, what to write, where: the same in both backends. The replay line spells the
seed and the steps the run took, then the scenario, checkpoint and pace given."""

STACK_FLAGS: tuple[Flag, ...] = (
    switch(
        "--flattened-bucket",
        "send each weight bucket as one packed broadcast (load_format flattened_bucket); "
        "by default one broadcast per tensor, as miles' distributed path sends them",
        replay=Spelt.GIVEN,
    ),
)
"""How the weights travel, in both backends (``Stack.packed``); the replay line spells these
after the backend's own."""


@dataclass(frozen=True)
class RealBackend:
    """A real backend as its ``run`` command knows it, declared once in its own package."""

    prog: str
    """The module: ``python -m PROG`` in its usage and its replay line."""
    description: str
    flags: tuple[Flag, ...]
    """Its own run flags, which make its Stack; the replay line spells them first."""
    stack_from: Callable[[argparse.Namespace, Scenario], tuple[Stack, Scenario]]
    """Its flags to its Stack, and the scenario's world as that stack runs it."""


def build_parser(
    backend: RealBackend,
) -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The backend's parser with its ``run`` command (a caller may add more commands)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {backend.prog}", description=backend.description
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="train (default) or run a scenario for real",
        allow_abbrev=False,  # a misspelt flag is an error, never a guess
    )
    for flag in (*RUN_FLAGS, *STACK_FLAGS, *backend.flags):
        flag.add_to(run)
    add_training_flags(run)
    add_loop_flags(run, skip=RUN_OWN_FLAGS)
    return parser, sub


def spelt(flags: Sequence[Flag], values: Mapping[str, Any]) -> list[str]:
    """The words of these flags: those always spelt, then those given, each in order."""
    ordered = [f for f in flags if f.replay is Spelt.ALWAYS]
    ordered += [f for f in flags if f.replay is Spelt.GIVEN]
    return [word for flag in ordered for word in flag.words(values[flag.dest])]


def replay_line(
    backend: RealBackend, args: argparse.Namespace, steps: int, training: Sequence[str] = ()
) -> str:
    """The command that runs this again: the stack, the training flags as resolved
    (``Training.argv``), the seed and the ``steps`` the run took, what it ran, miles' loop
    flags given."""
    values = vars(args) | {"steps": steps}
    words = ["python", "-m", backend.prog, "run"]
    words += spelt((*backend.flags, *STACK_FLAGS), values)
    words += [*training, *spelt(RUN_FLAGS, values)]
    return shlex.join(words + flags_argv(given_flags(args, RUN_OWN_FLAGS)))
