"""The arithmetic task's settings and the learning settings checked by hand, without torch:
``python -m backends.tasks`` builds its flags' defaults and choices from them, and refuses a
wrong flag before torch and transformers are imported (4 s here). The task itself is
``arith_task.py``'s, the learning ``learn.py``'s."""

from __future__ import annotations

from dataclasses import dataclass

from backends.common.training.grpo_settings import GrpoSettings
from backends.common.training.loss_config import LossConfig
from miles_core.errors import ConfigError, int_at_least

BOUNDS = {
    "--max-operand": 1000,
    "--prompts": 1_000_000,
    "--hidden-size": 1024,
    "--layers": 32,
    "--heads": 64,
    "--warmup-steps": 100_000,
}
"""How large a task ``make`` writes: the test set holds (max_operand + 1)**2 sums (a million
at the bound); a million rows of train.jsonl are about 30 MB; 1,024 wide and 32 layers is a
model of about 400M parameters, 1.6 GB in float32 (its warm-up runs on the CPU)."""


@dataclass(frozen=True)
class ArithSpec:
    """The task and the checkpoint that goes with it."""

    max_operand: int = 2
    prompts: int = 512
    seed: int = 0
    arch: str = "llama"
    hidden_size: int = 128
    layers: int = 2
    heads: int = 8
    warmup_steps: int = 100

    def __post_init__(self) -> None:
        for flag, value, least in (
            ("--max-operand", self.max_operand, 1),
            ("--prompts", self.prompts, 1),
            ("--hidden-size", self.hidden_size, 8),
            ("--layers", self.layers, 1),
            ("--heads", self.heads, 1),
            ("--warmup-steps", self.warmup_steps, 0),
        ):
            if not int_at_least(value, least):
                raise ConfigError(flag, f"got {value!r}", f"pass an integer >= {least}")
            if value > BOUNDS[flag]:
                raise ConfigError(
                    flag,
                    f"{value} is more than the {BOUNDS[flag]} a task of this command may have",
                    f"pass at most {BOUNDS[flag]} (fixed: make writes a small task that a CPU "
                    "learns; bring a larger checkpoint and data to --hf-checkpoint and "
                    "--prompt-data instead)",
                )

    def answers(self) -> range:
        return range(2 * self.max_operand + 1)


LEARNING_SPEC = ArithSpec(max_operand=2, seed=1, hidden_size=128, heads=8, warmup_steps=100)
"""The task the learning test makes: sums of 0..2 (nine prompts, five answers, chance 0.2)."""
LEARNING_STEPS = 100
MAX_LEARN_STEPS = 100_000
"""``learn --steps``' bound, a scenario's default ``[limits] steps``: a step of the default
settings takes about a second here, so the bound is a day of CPU."""


def tuned(seed: int) -> tuple[GrpoSettings, LossConfig]:
    """The settings checked by hand on several seeds (see tests/test_arith_task.py): 32
    prompts x 8 samples a step (fewer prompts a step left the policy guessing for hundreds
    of steps), Adam at 1e-3, and a small low_var_kl term to the checkpoint, without which
    one seed in four lost the answer format and with it every reward."""
    settings = GrpoSettings(rollout_batch_size=32, n_samples_per_prompt=8, lr=1e-3, seed=seed)
    config = LossConfig(use_kl_loss=True, kl_loss_coef=0.05, kl_loss_type="low_var_kl")
    return settings, config
