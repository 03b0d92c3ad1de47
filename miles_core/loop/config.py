"""LoopConfig: the loop's flags, with miles' names where the concept is the same, checked once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from miles_core.buffer import BufferConfig, UnusedHandler
from miles_core.errors import ConfigError, int_at_least
from miles_core.transfer import DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE, TransferMode

MODES = ("fully_async", "one_step_off")


@dataclass(frozen=True)
class LoopConfig:
    """The loop's flags. Each field's miles flag, where there is one, is in ``FLAGS``."""

    steps: int
    rollout_batch_size: int = 4
    n_samples_per_prompt: int = 2
    max_weight_staleness: int | None = None
    unused_samples_handler: UnusedHandler = UnusedHandler.RETRY
    capacity_factor: float = 2.0
    in_flight_groups: int | None = None
    """Producer budget in groups; defaults to rollout_batch_size (miles)."""
    update_weight_buffer_size: int = DEFAULT_UPDATE_WEIGHT_BUFFER_SIZE
    transfer_mode: TransferMode = TransferMode.BROADCAST
    max_step_attempts: int = 30
    max_route_attempts: int = 30
    lora_adapter: str | None = None
    """Train and push only this LoRA adapter (one atomic unit, unload-then-load)."""
    mode: str = "fully_async"
    """fully_async (a producer keeps generating, updates abort what is in flight) or
    one_step_off (batch k+1 is generated during step k and weights are updated when
    both are done: staleness 1, no aborts)."""
    heartbeat_interval: float | None = None
    """--trainer-heartbeat-checker-interval; None turns the monitor off."""
    heartbeat_timeout: float = 10.0
    """--trainer-heartbeat-checker-timeout: seconds a cell has to answer."""
    heartbeat_failure_threshold: int = 3
    """--trainer-heartbeat-checker-failure-threshold: misses in a row that fail a cell."""
    scenario: str = "custom"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "max_step_attempts", "max_route_attempts"):
            if not int_at_least(getattr(self, name), 1):
                raise ConfigError(name, f"got {getattr(self, name)!r}", "pass an integer >= 1")
        if not int_at_least(self.heartbeat_failure_threshold, 1):
            raise ConfigError(
                "heartbeat_failure_threshold",
                f"got {self.heartbeat_failure_threshold!r}",
                "pass an integer >= 1",
            )
        budget = self.in_flight_groups
        if budget is not None and not int_at_least(budget, 1):
            raise ConfigError("in_flight_groups", f"got {budget!r}", "pass an integer >= 1")
        if not int_at_least(self.update_weight_buffer_size, 1):
            raise ConfigError(
                "update_weight_buffer_size",
                f"got {self.update_weight_buffer_size!r}",
                "pass a bucket size in bytes >= 1",
            )
        for name in ("heartbeat_interval", "heartbeat_timeout"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ConfigError(name, f"got {value!r}", "pass seconds > 0")
        if self.mode not in MODES:
            raise ConfigError("mode", f"got {self.mode!r}", f"choose one of {MODES}")
        if self.mode == "one_step_off" and self.capacity_factor < 1:
            raise ConfigError(
                "capacity_factor",
                f"{self.capacity_factor} holds less than one batch, but one_step_off puts a "
                "whole batch before it is drained",
                "use --async-data-buffer-capacity-factor >= 1 with one_step_off",
            )
        self.buffer_config()  # the buffer's own checks, before anything runs

    def buffer_config(self) -> BufferConfig:
        return BufferConfig(
            rollout_batch_size=self.rollout_batch_size,
            capacity_factor=self.capacity_factor,
            max_weight_staleness=self.max_weight_staleness,
            unused_samples_handler=self.unused_samples_handler,
            n_samples_per_prompt=self.n_samples_per_prompt,
        )


FLAGS: Mapping[str, str] = {
    "rollout_batch_size": "--rollout-batch-size",
    "n_samples_per_prompt": "--n-samples-per-prompt",
    "max_weight_staleness": "--max-weight-staleness",
    "unused_samples_handler": "--async-unused-samples-handler",
    "capacity_factor": "--async-data-buffer-capacity-factor",
    "update_weight_buffer_size": "--update-weight-buffer-size",
    "transfer_mode": "--update-weight-transfer-mode",
    "heartbeat_interval": "--trainer-heartbeat-checker-interval",
    "heartbeat_timeout": "--trainer-heartbeat-checker-timeout",
    "heartbeat_failure_threshold": "--trainer-heartbeat-checker-failure-threshold",
}
"""LoopConfig field -> the miles flag it stands for."""

FIELD_OF_FLAG: Mapping[str, str] = {flag: name for name, flag in FLAGS.items()}


def field_name(name_or_flag: str) -> str:
    """The LoopConfig field behind a field name or a miles flag (as errors may name it)."""
    return FIELD_OF_FLAG.get(name_or_flag, name_or_flag)
