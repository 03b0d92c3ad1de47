"""The rollout's shape as miles' flags size it, one checked value without torch: the command
lines that take it parse and check it before torch is imported. The loop is
``local_grpo.py``'s."""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.errors import ConfigError, int_at_least

MAX_SAMPLES = 65_536
"""Samples a step (rollout batch x samples per prompt) one process generates and trains
on: the default of a scenario's ``[limits] samples``."""
MAX_RESPONSE_LEN = 65_536
"""--rollout-max-response-len here: tokens generated per sample, one forward pass each."""


@dataclass(frozen=True)
class GrpoSettings:
    """The rollout's shape, as miles' flags size it."""

    rollout_batch_size: int = 16  # prompts per step
    n_samples_per_prompt: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    lr: float = 1e-3
    optimizer: str = "adam"  # Megatron's --optimizer: adam or sgd
    clip_grad: float = 1.0  # miles' default --clip-grad; 0 turns clipping off
    seed: int = 0

    def _check_samples(self) -> None:
        batch, n = self.rollout_batch_size, self.n_samples_per_prompt
        if batch * n > MAX_SAMPLES:
            flag = "--rollout-batch-size" if batch >= n else "--n-samples-per-prompt"
            raise ConfigError(
                flag,
                f"{batch} x {n} = {batch * n} samples a step, more than the {MAX_SAMPLES} "
                "one process generates",
                f"pass a batch and samples per prompt whose product is at most {MAX_SAMPLES} "
                "(fixed: for more, train with python -m backends.cpu run)",
            )
        if self.max_new_tokens > MAX_RESPONSE_LEN:
            raise ConfigError(
                "--rollout-max-response-len",
                f"{self.max_new_tokens} tokens",
                f"pass at most {MAX_RESPONSE_LEN} (fixed)",
            )

    def __post_init__(self) -> None:
        for flag, value in (
            ("--rollout-batch-size", self.rollout_batch_size),
            ("--n-samples-per-prompt", self.n_samples_per_prompt),
            ("--rollout-max-response-len", self.max_new_tokens),
        ):
            if not int_at_least(value, 1):
                raise ConfigError(flag, f"got {value!r}", "pass an integer >= 1")
        self._check_samples()
        for flag, value, ok in (
            ("--rollout-temperature", self.temperature, self.temperature > 0),
            ("--lr", self.lr, self.lr > 0),
            ("--clip-grad", self.clip_grad, self.clip_grad >= 0),
            ("--optimizer", self.optimizer, self.optimizer in ("adam", "sgd")),
        ):
            if not ok:
                raise ConfigError(flag, f"got {value!r}", "see --help for the values it takes")
