"""The control calls an update makes to each engine, each bound to its arguments.

The updater calls every engine of an update the same way (at once, each within the health
check's timeout under fault tolerance, failures collected); what differs is the call. Each
one here names the RolloutEngine method it makes (miles_core.backend), so a reader follows
the protocol from the updater to a world's engine handle; ``name`` is how task names and
failure reasons say it ("no answer to stamp within 30s"), as miles' method names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from miles_core.backend import RolloutEngine
from miles_core.kinds import PauseMode


@dataclass(frozen=True, slots=True)
class EngineCall:
    name: str
    make: Callable[[RolloutEngine], Awaitable[str | None]]
    """The call on one engine process; what it answers (only a stamp answers something: the
    engine's weights checksum, where its world can read weights)."""


def pause(mode: PauseMode, abort_below: int | None = None) -> EngineCall:
    """/pause_generation; ``abort_below`` only when set (sglang #34185's field, which the
    pause sends under --pause-abort-below-start-weight-version alone)."""
    if abort_below is None:
        return EngineCall("pause", lambda engine: engine.pause(mode))
    return EngineCall("pause", lambda engine: engine.pause(mode, abort_below))


FLUSH_CACHE = EngineCall("flush_cache", lambda engine: engine.flush_cache())
BEGIN_UPDATE = EngineCall("begin_update", lambda engine: engine.begin_update())
END_UPDATE = EngineCall("end_update", lambda engine: engine.end_update())
RESUME = EngineCall("resume", lambda engine: engine.resume())


def unload_adapter(adapter: str) -> EngineCall:
    return EngineCall("unload_adapter", lambda engine: engine.unload_adapter(adapter))


def stamp(version: int, abort_all_requests: bool) -> EngineCall:
    """/update_weight_version. The updater sends ``abort_all_requests=False``: SGLang aborts
    every request in flight unless told not to (miles #2589, #2296)."""
    return EngineCall("stamp", lambda engine: engine.stamp(version, abort_all_requests))
