"""miles' loss flags as one checked value, without torch: the command lines that take them
(``python -m backends.tasks learn``, the CPU backend's flags) parse and check them before
torch is imported. The loss itself is ``losses.py``'s."""

from __future__ import annotations

from dataclasses import dataclass

from miles_core.errors import ConfigError

ESTIMATORS = ("grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


@dataclass(frozen=True)
class LossConfig:
    """miles' loss flags, their names and defaults as ``miles/utils/arguments.py`` has them."""

    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None  # None: eps_clip
    eps_clip_c: float | None = None
    kl_coef: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    normalize_advantages: bool = False
    grpo_std_normalization: bool = True  # --disable-grpo-std-normalization
    rewards_normalization: bool = True  # --disable-rewards-normalization
    calculate_per_token_loss: bool = False
    gamma: float = 1.0

    def __post_init__(self) -> None:
        _check(self)

    @property
    def clip_high(self) -> float:
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high


def _check(c: LossConfig) -> None:
    """miles' asserts on these flags (``arguments.py``, ``compute_policy_loss``) as
    ConfigErrors, and a flag that would silently do nothing refused."""
    if c.advantage_estimator not in ESTIMATORS:
        raise ConfigError(
            "--advantage-estimator",
            f"{c.advantage_estimator!r} is not implemented here (miles also has gspo, ppo)",
            f"pass one of {', '.join(ESTIMATORS)}",
        )
    if c.kl_loss_type not in KL_TYPES:
        raise ConfigError(
            "--kl-loss-type", f"{c.kl_loss_type!r}", f"pass one of {', '.join(KL_TYPES)}"
        )
    if c.eps_clip < 0 or c.clip_high < 0:
        raise ConfigError("--eps-clip", f"got {c.eps_clip}, high {c.clip_high}", "pass values >= 0")
    if c.eps_clip_c is not None and c.eps_clip_c <= 1.0:
        raise ConfigError("--eps-clip-c", f"got {c.eps_clip_c}", "dual-clip needs a value > 1")
    if c.kl_coef != 0 and c.kl_loss_coef != 0:
        raise ConfigError("--kl-coef", "and --kl-loss-coef are both set", "set only one of them")
    if c.kl_coef != 0 and c.advantage_estimator == "grpo":
        raise ConfigError(
            "--kl-coef",
            "has no effect with grpo (miles broadcasts the reward, ignoring the KL)",
            "use --use-kl-loss --kl-loss-coef for a KL term with grpo",
        )
    if c.kl_loss_coef != 0 and not c.use_kl_loss:
        raise ConfigError(
            "--kl-loss-coef", "has no effect without --use-kl-loss", "add --use-kl-loss"
        )
    if c.advantage_estimator.startswith("reinforce") and not c.normalize_advantages:
        raise ConfigError(
            "--advantage-estimator",
            f"{c.advantage_estimator} requires advantage normalization (miles asserts it)",
            "add --normalize-advantages",
        )
