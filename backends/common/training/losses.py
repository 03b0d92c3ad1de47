"""GRPO / REINFORCE++ advantages and the PPO-clip policy loss with KL, as miles computes them.

Pure torch on per-sample lists of response tokens (log-probs, masks), modelled on miles:

- rewards normalised per prompt group: ``miles/ray/rollout/train_data_conversion.py``,
  ``_normalize_rewards_by_rollout`` (``r - mean``, then ``/ (std + 1e-6)`` for grpo unless
  ``--disable-grpo-std-normalization``; only for grpo and reinforce_plus_plus_baseline,
  unless ``--disable-rewards-normalization``);
- advantages: ``miles/backends/training_utils/loss_hub/advantages.py``,
  ``compute_advantages``, and ``loss_hub/math_utils.py``: ``get_grpo_returns`` (the
  reward on every token; grpo ignores ``--kl-coef``), ``get_reinforce_plus_plus_returns``
  (``-kl_coef * kl`` per token, the reward on the last one, discounted by ``--gamma``),
  ``get_reinforce_plus_plus_baseline_advantages`` (``reward - kl_coef * kl``); then
  ``--normalize-advantages`` whitens them over all tokens (``normalize_advantages``,
  ``miles/utils/distributed_utils.py``, ``distributed_masked_whiten``);
- KL estimators: ``math_utils.compute_approx_kl`` (k1, k2, k3, low_var_kl);
- the loss: ``loss_hub/losses.py``, ``policy_loss_function``, and
  ``math_utils.compute_policy_loss``: ``ratio = exp(logp - old_logp)``, the larger of
  ``-ratio*A`` and ``-clip(ratio, 1-eps_clip, 1+eps_clip_high)*A`` (dual clip with
  ``--eps-clip-c``), plus ``kl_loss_coef * KL(policy || ref)`` under ``--use-kl-loss``;
- aggregation: ``miles/backends/training_utils/cp_utils.py``, ``get_sum_of_sample_mean``,
  and ``loss.py``, ``loss_function``: by default each sample's token mean, averaged over
  samples; with ``--calculate-per-token-loss`` the mean over all tokens of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from backends.common.training.loss_config import LossConfig

_LOG_RATIO_CLAMP = 20.0


def compute_approx_kl(
    log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_loss_type: str
) -> torch.Tensor:
    """Per-token KL(policy || base) estimates (Schulman's k1, k2, k3); low_var_kl is k3
    with the log-ratio clamped to +-20 and the result to [-10, 10]."""
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_loss_type == "k1":
        return log_ratio
    if kl_loss_type == "k2":
        return log_ratio**2 / 2.0
    if kl_loss_type not in ("k3", "low_var_kl"):
        raise ValueError(f"unknown kl_loss_type {kl_loss_type!r}")
    neg = -log_ratio
    if kl_loss_type == "low_var_kl":
        neg = neg.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    kl = neg.exp() - 1 - neg
    return kl.clamp(-10, 10) if kl_loss_type == "low_var_kl" else kl


def normalize_group_rewards(config: LossConfig, rewards: Sequence[float]) -> list[float]:
    """One prompt group's rewards as the advantage estimator gets them."""
    values = torch.tensor(list(rewards), dtype=torch.float32)
    if not config.rewards_normalization or config.advantage_estimator == "reinforce_plus_plus":
        return values.tolist()
    centred = values - values.mean()
    if config.advantage_estimator == "grpo" and config.grpo_std_normalization and len(values) > 1:
        std = values.std()
        if std > 0:
            centred = centred / (std + 1e-6)
    return centred.tolist()


def whiten(advantages: list[torch.Tensor], masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """--normalize-advantages: (a - mean) / sqrt(var + 1e-8) over every unmasked token,
    the variance with Bessel's correction."""
    flat, mask = torch.cat(advantages), torch.cat(masks).float()
    count = mask.sum()
    if count == 0:
        raise ValueError("whiten: every token is masked")
    mean = (flat * mask).sum() / count
    var = (flat**2 * mask).sum() / count - mean**2
    if count >= 2:
        var = var * count / (count - 1)
    out = (flat - mean) * torch.rsqrt(var + 1e-8)
    return list(out.split([len(a) for a in advantages]))


def compute_advantages(
    config: LossConfig,
    rewards: Sequence[float],
    loss_masks: Sequence[torch.Tensor],
    kl: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Per-token advantages of each sample from its (group-normalised) reward."""
    kls = list(kl) if kl is not None else [torch.zeros(len(m), device=m.device) for m in loss_masks]
    if config.advantage_estimator == "grpo":
        out = [
            torch.full((len(m),), float(r), device=m.device)
            for r, m in zip(rewards, loss_masks, strict=True)
        ]
    elif config.advantage_estimator == "reinforce_plus_plus_baseline":
        out = [float(r) - config.kl_coef * k for r, k in zip(rewards, kls, strict=True)]
    else:
        out = [
            reinforce_plus_plus_returns(float(r), k, m, config)
            for r, k, m in zip(rewards, kls, loss_masks, strict=True)
        ]
    if config.normalize_advantages:
        out = whiten(out, [m.float() for m in loss_masks])
    return out


def reinforce_plus_plus_returns(
    reward: float, kl: torch.Tensor, mask: torch.Tensor, c: LossConfig
) -> torch.Tensor:
    """REINFORCE++ returns: G_t = r_t + gamma * G_{t+1}, r_t = -kl_coef * kl_t, the reward
    added on the last unmasked token."""
    token_rewards = -c.kl_coef * kl.float()
    active = mask.nonzero()
    if len(active) == 0:
        raise ValueError("reinforce_plus_plus: a sample is fully masked")
    token_rewards[int(active[-1])] += reward
    returns = torch.zeros_like(token_rewards)
    running = 0.0
    for t in range(len(token_rewards) - 1, -1, -1):
        running = token_rewards[t] + c.gamma * running
        returns[t] = running
    return returns


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip losses and whether the clip engaged (miles' compute_policy_loss)."""
    log_ratio = torch.nan_to_num(log_probs - old_log_probs, nan=0.0)
    ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - config.eps_clip, 1 + config.clip_high) * advantages
    losses = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if config.eps_clip_c is not None:
        floor = torch.minimum(-config.eps_clip_c * advantages, losses)
        losses = torch.where(advantages < 0, floor, losses)
    return losses, clipfrac


def aggregate(values: torch.Tensor, masks: Sequence[torch.Tensor], per_token: bool) -> torch.Tensor:
    """A batch's per-token values to one number: the mean of each sample's token mean, or
    with ``per_token`` (--calculate-per-token-loss) the mean over all unmasked tokens."""
    mask = torch.cat(list(masks)).to(device=values.device, dtype=values.dtype)
    if per_token:
        return (values * mask).sum() / mask.sum().clamp_min(1)
    lengths = torch.tensor([len(m) for m in masks], device=values.device)
    sample = torch.repeat_interleave(torch.arange(len(masks), device=values.device), lengths)
    sums = values.new_zeros(len(masks)).index_add(0, sample, values * mask)
    counts = values.new_zeros(len(masks)).index_add(0, sample, mask)
    return (sums / counts.clamp_min(1)).mean()


def policy_loss_function(
    config: LossConfig,
    log_probs: Sequence[torch.Tensor],
    old_log_probs: Sequence[torch.Tensor],
    advantages: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    ref_log_probs: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss to backpropagate, and miles' metrics (pg_loss, pg_clipfrac,
    ppo_kl, kl_loss); every list holds one 1-D tensor per sample's response."""
    masks = [m.float() for m in loss_masks]
    new = torch.cat(list(log_probs))
    old = torch.cat([o.detach() for o in old_log_probs])
    adv = torch.cat([a.detach() for a in advantages])
    losses, clipfrac = policy_loss(new, old, adv, config)
    per_token = config.calculate_per_token_loss
    loss = aggregate(losses, masks, per_token)
    metrics = {
        "pg_loss": float(loss.detach()),
        "pg_clipfrac": float(aggregate(clipfrac, masks, per_token)),
        "ppo_kl": float(aggregate((old - new).detach(), masks, per_token)),
    }
    if config.use_kl_loss:
        if ref_log_probs is None:
            raise ValueError("--use-kl-loss needs the reference model's log-probs")
        ref = torch.cat([r.detach() for r in ref_log_probs])
        kl_loss = aggregate(compute_approx_kl(new, ref, config.kl_loss_type), masks, per_token)
        metrics["kl_loss"] = float(kl_loss.detach())
        loss = loss + config.kl_loss_coef * kl_loss
    return loss, metrics
