"""The CPU engine's control states and which routes each admits: one table, no I/O.

SGLang refuses a load outside a weight-update session and a second begin (those
refusals keep SGLang's 400 and words, in the engine). This table adds what a
testbed engine must also refuse, with a 409 naming its state, because answering
would serve or change weights that are half-loaded or in use:

- ``serving``: generating; weights do not change here (pause first);
- ``paused``: requests wait (queued, retracted or frozen); no session open;
- ``updating``: paused, a weight-update session open: loads are taken;
- ``receiving``: a load in progress on the newest group (a broadcast being
  received) or by handles: nothing that would resume generation, stamp a version
  or end the session until it ends; one load at a time on a group, and the group
  in use cannot be destroyed (both checked by the handlers, per group);
- ``stopping``: the server is shutting down: nothing new is taken (503).

``state_of`` derives the state from the engine's flags; ``refusal`` says why a
route's control is not admitted in it (None: admitted).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class EngineState(StrEnum):
    SERVING = "serving"
    PAUSED = "paused"
    UPDATING = "updating"
    RECEIVING = "receiving"
    STOPPING = "stopping"


class Control(StrEnum):
    """What a route asks of the engine's state."""

    READ = "read"
    """Health, info, checksums: answered in every state but stopping."""
    GENERATE = "generate"
    PAUSE = "pause"
    CONTINUE = "continue"
    ABORT = "abort"
    FLUSH = "flush"
    BEGIN = "begin"
    END = "end"
    LOAD = "load"
    VERSION = "version"
    JOIN = "join"
    LEAVE = "leave"
    CHECK_WEIGHTS = "check_weights"
    PULL = "pull"
    """disk-delta's /pull_weights: changes the local checkpoint, not the weights served, so
    it is taken in every state but stopping (miles pulls before the pause)."""


ROUTES: Final[dict[str, Control]] = {
    "/health": Control.READ,
    "/health_generate": Control.READ,
    "/model_info": Control.READ,
    "/server_info": Control.READ,
    "/get_server_info": Control.READ,
    "/testbed/weights_checksum": Control.READ,
    "/generate": Control.GENERATE,
    "/pause_generation": Control.PAUSE,
    "/continue_generation": Control.CONTINUE,
    "/abort_request": Control.ABORT,
    "/flush_cache": Control.FLUSH,
    "/begin_weight_update": Control.BEGIN,
    "/end_weight_update": Control.END,
    "/update_weights_from_distributed": Control.LOAD,
    "/update_weights_from_tensor": Control.LOAD,
    "/update_weight_version": Control.VERSION,
    "/init_weights_update_group": Control.JOIN,
    "/destroy_weights_update_group": Control.LEAVE,
    "/weights_checker": Control.CHECK_WEIGHTS,
    "/pull_weights": Control.PULL,
    "/update_weights_from_disk": Control.LOAD,
}
"""Every route the engine serves, by what it asks (a route missing here is refused)."""

_PAUSE_FIRST = "weights change only while generation is paused: POST /pause_generation first"
_LOADING = "a load is in progress: wait for its answer"

REFUSED: Final[dict[tuple[EngineState, Control], str]] = {
    (EngineState.SERVING, Control.BEGIN): _PAUSE_FIRST,
    (EngineState.SERVING, Control.LOAD): _PAUSE_FIRST,
    (EngineState.UPDATING, Control.CONTINUE): (
        "a weight-update session is open, its weights half-loaded: "
        "POST /end_weight_update before /continue_generation"
    ),
    (EngineState.RECEIVING, Control.CONTINUE): _LOADING,
    (EngineState.RECEIVING, Control.END): _LOADING,
    (EngineState.RECEIVING, Control.VERSION): _LOADING,
    (EngineState.RECEIVING, Control.CHECK_WEIGHTS): _LOADING,
}
"""(state, control) -> why it is refused; every pair absent here is admitted, but in
``stopping``, which admits nothing."""


def state_of(*, stopping: bool, receiving: bool, session_open: bool, paused: bool) -> EngineState:
    if stopping:
        return EngineState.STOPPING
    if receiving:
        return EngineState.RECEIVING
    if session_open:
        return EngineState.UPDATING
    return EngineState.PAUSED if paused else EngineState.SERVING


def refusal(state: EngineState, control: Control) -> str | None:
    """Why ``control`` is not admitted in ``state``; None if it is."""
    if state is EngineState.STOPPING:
        return "the engine is stopping"
    return REFUSED.get((state, control))
