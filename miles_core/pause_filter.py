"""Drop, at an update's pause, the requests already too stale to train on (a proposal).

SGLang's draft ``abort_below_start_weight_version`` (sglang #34185, open, 2026-08-09, based
on ``sglang-miles``): ``POST /pause_generation {"mode": "retract",
"abort_below_start_weight_version": 7}`` aborts each request whose caller-declared
``GenerateReqInput.start_weight_version`` is strictly below 7 while paused; ``mode`` still
decides what happens to the survivors, and ``mode="abort"`` rejects the field (it aborts
everything already). Its motivation: under retract a request that started under weights
already too old to train on is re-prefilled on resume only to be discarded afterwards.

miles sends no ``start_weight_version`` on /generate today (docs/miles-today-reading.md
sections 9 and 10; miles #2296, open, "measure staleness from submit"), so the flag
``--pause-abort-below-start-weight-version`` is ours: the producer declares, per request,
the version published when it sent it, and each update's pause names the threshold

    the version the update publishes - --max-weight-staleness

A request declared below it cannot be trained within the bound once that version is
published (the buffer's staleness is the consumer's version less the oldest span's, and a
span is never older than the version its request was sent under), so the buffer would drop
or recycle its group anyway; aborted at the pause, its group goes to the unused handler as
an aborted group does today.
"""

from __future__ import annotations

from typing import Protocol

from miles_core.errors import ConfigError
from miles_core.kinds import PauseMode
from miles_core.versions import INITIAL_WEIGHTS_VERSION

FLAG = "--pause-abort-below-start-weight-version"


class Flags(Protocol):
    """What of LoopConfig this reads (a protocol: LoopConfig imports this module)."""

    @property
    def pause_abort_below_start_weight_version(self) -> bool: ...

    @property
    def max_weight_staleness(self) -> int | None: ...


def check_pause_filter(on: bool, pause_mode: PauseMode, max_weight_staleness: int | None) -> None:
    """Refuse the flag where SGLang would refuse the field, or where it has no threshold."""
    if not isinstance(on, bool):
        raise ConfigError(
            "pause_abort_below_start_weight_version", f"got {on!r}", "pass true or false"
        )
    if not on:
        return
    if pause_mode is PauseMode.ABORT:
        raise ConfigError(
            "pause_abort_below_start_weight_version",
            f"{FLAG} with --pause-generation-mode abort: that pause aborts every request "
            "already, and SGLang rejects abort_below_start_weight_version there (sglang #34185)",
            "use --pause-generation-mode retract or in_place, or leave the flag off",
        )
    if max_weight_staleness is None:
        raise ConfigError(
            "pause_abort_below_start_weight_version",
            f"{FLAG} sets the threshold from --max-weight-staleness, which is unset",
            f"pass --max-weight-staleness N with {FLAG}, or leave the flag off",
        )


def abort_below(publishes: int, max_weight_staleness: int) -> int:
    """The pause's threshold: a request declared strictly below it is beyond the bound once
    ``publishes`` is the consumer's version."""
    return publishes - max_weight_staleness


def pause_threshold(config: Flags, version: int) -> int | None:
    """The threshold an update to ``version`` pauses with; None with the flag off."""
    bound = config.max_weight_staleness
    if not config.pause_abort_below_start_weight_version or bound is None:
        return None
    return abort_below(version, bound)


def declared_start(config: Flags, published: int | None) -> int | None:
    """The ``start_weight_version`` a request sent now declares; None with the flag off."""
    if not config.pause_abort_below_start_weight_version:
        return None
    return start_weight_version(published)


def start_weight_version(published: int | None) -> int:
    """What a request declares: the version published when it was sent (before the first
    update, the initial weights, counted as the buffer counts them)."""
    return INITIAL_WEIGHTS_VERSION if published is None else published


__all__ = [
    "FLAG",
    "abort_below",
    "check_pause_filter",
    "declared_start",
    "pause_threshold",
    "start_weight_version",
]
