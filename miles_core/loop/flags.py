"""The loop's flags on a command line, in miles' spelling (``--max-weight-staleness 2``).

Both CLIs (the simulator's and the real backends') add every LoopConfig field
that has a flag in ``FLAGS``; a flag given overrides the scenario's value, one
left out keeps it. A value of the wrong kind is an error naming the flag as
written, before anything runs; an unknown flag is argparse's error naming it.
The overrides given go into the replay line, so a failing run replays with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from miles_core.errors import ConfigError
from miles_core.loop.config import FLAGS, LoopConfig

RUN_OWN_FLAGS = ("steps",)
"""Loop fields every run command (the simulator's and the real backends') spells its own way:
``--steps`` overrides the scenario's steps, and is no loop flag of theirs."""

NONE_WORDS = ("none", "off")
"""What turns off a flag whose value may be None (``--max-weight-staleness none``)."""

_HINTS = typing.get_type_hints(LoopConfig)


def _base(hint: Any) -> tuple[type, bool]:
    """The field's type, and whether it may be None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def _parse(field: str) -> Callable[[str], Any]:
    kind, optional = _base(_HINTS[field])

    def parse(text: str) -> Any:
        if optional and text.lower() in NONE_WORDS:
            return None
        return kind(text)  # ValueError: argparse names the flag and the value

    parse.__name__ = kind.__name__  # argparse's message: "invalid int value: 'x'"
    return parse


def add_loop_flags(parser: argparse.ArgumentParser, skip: Iterable[str] = ()) -> None:
    """Add every loop flag (but the fields in ``skip``, which the CLI spells its own way)."""
    group = parser.add_argument_group("loop flags (miles' names; default: the scenario's)")
    for field, flag in FLAGS.items():
        if field in skip:
            continue
        kind, optional = _base(_HINTS[field])
        doc = f"LoopConfig.{field}" + (f"; {'/'.join(NONE_WORDS)} for None" if optional else "")
        if kind is bool:
            group.add_argument(
                flag,
                dest=field,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=doc,
            )
            continue
        choices = [m.value for m in kind] if issubclass(kind, enum.Enum) else None
        metavar = "{" + ",".join(choices) + "}" if choices else kind.__name__.upper()
        group.add_argument(
            flag,
            dest=field,
            type=_parse(field),
            default=argparse.SUPPRESS,  # absent unless given: "none" is a value, not absence
            metavar=metavar,
            help=doc,
        )


def given_flags(args: argparse.Namespace, skip: Iterable[str] = ()) -> dict[str, Any]:
    """The loop fields set on the command line, in FLAGS order (``none`` included)."""
    return {f: getattr(args, f) for f in FLAGS if f not in skip and hasattr(args, f)}


def with_flags(loop: LoopConfig, overrides: Mapping[str, Any]) -> LoopConfig:
    """``loop`` with the overrides applied and checked; an error names the flag."""
    try:
        return dataclasses.replace(loop, **overrides)
    except ConfigError as error:
        flag = FLAGS.get(error.field, error.field)
        raise ConfigError(flag, error.problem, error.fix) from None


def flags_argv(overrides: Mapping[str, Any]) -> list[str]:
    """The command-line words that give these overrides again (for the replay line)."""
    words: list[str] = []
    for field, value in overrides.items():
        flag = FLAGS[field]
        if isinstance(value, bool):
            words.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif value is None:
            words += [flag, NONE_WORDS[0]]
        else:
            words += [flag, str(value.value if isinstance(value, enum.Enum) else value)]
    return words
