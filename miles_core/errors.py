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


class RetriesExhaustedError(MilesCoreError):
    """A step or a routed operation failed on every attempt it was allowed."""


class TransitionError(MilesCoreError):
    """A state machine was asked for a transition its table does not allow."""


def int_at_least(value: object, minimum: int) -> bool:
    """True for an int (not a bool, not a float) >= minimum: the check behind every count flag."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
