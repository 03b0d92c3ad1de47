"""Errors the control logic raises; each message names the field and the fix."""

from __future__ import annotations


class MilesCoreError(Exception):
    """Base class for every error raised by miles_core."""


class ConfigError(MilesCoreError, ValueError):
    """A configuration value is invalid: the message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")


class LayoutError(ConfigError):
    """A placement layout cannot be built from the requested GPU counts."""


class VersionRegressionError(MilesCoreError):
    """A weight version would go backwards (or an update is out of sequence)."""


class NoAliveCellError(MilesCoreError):
    """Every trainer cell is dead: nothing can train, update weights, save or heal."""


class NoLiveEngineError(MilesCoreError):
    """Every rollout engine is down and nothing will bring one back (no fault tolerance)."""


class RetriesExhaustedError(MilesCoreError):
    """A step or a routed operation failed on every attempt it was allowed."""


class RequestFailedError(RetriesExhaustedError):
    """A generate request failed at the router on every try --request-max-retries allows:
    miles' ``_post`` re-raises its last error, which ends the fully-async worker and with
    it the step (``FullyAsyncRolloutFn._next_group``)."""


class FlushTimeoutError(MilesCoreError, TimeoutError):
    """An engine refused /flush_cache on every try --flush-cache-max-retries allows (miles'
    ``SGLangEngine.flush_cache`` raises TimeoutError then, failing the weight update)."""


class UpdateWindowTimeoutError(MilesCoreError, TimeoutError):
    """Today's miles: an update window waited its whole bound for engines still initializing
    (``InferenceController._ensure_cells_ready`` raises TimeoutError after 3600 s)."""


class TransitionError(MilesCoreError):
    """A state machine was asked for a transition its table does not allow."""


def int_at_least(value: object, minimum: int) -> bool:
    """True for an int (not a bool, not a float) >= minimum: the check behind every count flag."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


_PACKAGES = ("miles_core", "sim", "backends", "tests", "scenarios", "benchmarks")
"""Paths in a traceback are cut to start at one of these, so that the same failure gives
the same text (and history hash) in any checkout."""


def _where(filename: str) -> str:
    parts = filename.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _PACKAGES:
            return "/".join(parts[i:])
    return parts[-1]


def format_traceback(error: BaseException, limit: int = 12) -> str:
    """An exception and its causes as ``Type: message`` plus ``path:line in function`` frames.

    Built from the frames alone (no source files are read), innermost frames last, at
    most ``limit`` per exception; a cause follows its effect, as "caused by".
    """
    blocks: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = []
        tb = current.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            frames.append(f"  {_where(code.co_filename)}:{tb.tb_lineno} in {code.co_name}")
            tb = tb.tb_next
        head = f"{type(current).__name__}: {current}"
        blocks.append("\n".join([head, *frames[-limit:]]))
        current = current.__cause__
    return "\ncaused by ".join(blocks)
