"""GRPO / REINFORCE++ advantages, KL estimators and the PPO-clip loss against hand-computed
numbers (backends/common/training/losses.py, modelled on miles' loss_hub)."""

from __future__ import annotations

import math

import pytest
import torch

from backends.common.training.losses import (
    LossConfig,
    aggregate,
    compute_advantages,
    compute_approx_kl,
    normalize_group_rewards,
    policy_loss,
    policy_loss_function,
    reinforce_plus_plus_returns,
    whiten,
)
from miles_core.errors import ConfigError

GRPO = LossConfig()


def close(a: torch.Tensor | list[float], b: list[float], tol: float = 1e-5) -> bool:
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.tensor(b), atol=tol)


def test_grpo_group_with_equal_rewards_has_zero_advantages() -> None:
    for rewards in ([1.0, 1.0, 1.0, 1.0], [0.0] * 8, [0.3, 0.3]):
        normalized = normalize_group_rewards(GRPO, rewards)
        assert normalized == [0.0] * len(rewards)
        masks = [torch.ones(3) for _ in rewards]
        for adv in compute_advantages(GRPO, normalized, masks):
            assert torch.equal(adv, torch.zeros(3))


def test_grpo_normalizes_by_mean_and_sample_std() -> None:
    # [1, 0, 0, 0]: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    std = 0.5 + 1e-6
    assert close(normalize_group_rewards(GRPO, [1, 0, 0, 0]), [0.75 / std] + [-0.25 / std] * 3)
    no_std = LossConfig(grpo_std_normalization=False)
    assert close(normalize_group_rewards(no_std, [1, 0, 0, 0]), [0.75, -0.25, -0.25, -0.25])
    raw = LossConfig(rewards_normalization=False)
    assert normalize_group_rewards(raw, [1.0, 0.0]) == [1.0, 0.0]


def test_grpo_advantage_is_the_reward_on_every_token() -> None:
    advantages = compute_advantages(GRPO, [1.5, -0.5], [torch.ones(3), torch.ones(2)])
    assert close(advantages[0], [1.5, 1.5, 1.5]) and close(advantages[1], [-0.5, -0.5])


def test_reinforce_plus_plus_returns_by_hand() -> None:
    # kl_coef 0.1, kl 1 per token, reward 1 on the last unmasked token (index 1), gamma 0.5:
    # token rewards [-0.1, 0.9, -0.1]; G2 = -0.1, G1 = 0.9 - 0.05, G0 = -0.1 + 0.425
    config = LossConfig("reinforce_plus_plus", kl_coef=0.1, normalize_advantages=True, gamma=0.5)
    got = reinforce_plus_plus_returns(1.0, torch.ones(3), torch.tensor([1, 1, 0]), config)
    assert close(got, [0.325, 0.85, -0.1])


def test_reinforce_baseline_subtracts_scaled_kl_then_whitens() -> None:
    config = LossConfig("reinforce_plus_plus_baseline", kl_coef=0.5, normalize_advantages=True)
    masks = [torch.ones(2), torch.ones(2)]
    kl = [torch.tensor([0.0, 2.0]), torch.tensor([0.0, 0.0])]
    got = compute_advantages(config, [1.0, -1.0], masks, kl)
    assert close(
        torch.cat(got),
        torch.cat(whiten([torch.tensor([1.0, 0.0]), torch.tensor([-1.0, -1.0])], masks)).tolist(),
    )
    assert normalize_group_rewards(config, [1.0, 0.0]) == [0.5, -0.5]  # centred, no std


def test_whiten_gives_zero_mean_unit_sample_std_over_unmasked_tokens() -> None:
    values = [torch.tensor([1.0, 2.0, 100.0]), torch.tensor([3.0, 4.0])]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.ones(2)]
    out = torch.cat(whiten(values, masks))
    kept = out[torch.cat(masks).bool()]
    assert abs(float(kept.mean())) < 1e-5
    assert abs(float(kept.std()) - 1.0) < 1e-4  # torch's std is Bessel-corrected, as miles'


def test_kl_estimators_by_hand() -> None:
    new, base = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    r = math.log(2.0)  # log(new / base)
    assert close(compute_approx_kl(new, base, "k1"), [r])
    assert close(compute_approx_kl(new, base, "k2"), [r * r / 2])
    k3 = math.exp(-r) - 1 + r  # 0.5 - 1 + log 2
    assert close(compute_approx_kl(new, base, "k3"), [k3])
    assert close(compute_approx_kl(new, base, "low_var_kl"), [k3])


def test_kl_of_equal_distributions_is_zero_and_low_var_kl_is_clamped() -> None:
    logp = torch.log(torch.tensor([0.1, 0.5, 0.9]))
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert torch.equal(compute_approx_kl(logp, logp, kind), torch.zeros(3))
    far_new, far_base = torch.tensor([-40.0]), torch.tensor([0.0])
    assert float(compute_approx_kl(far_new, far_base, "low_var_kl")) == 10.0
    assert float(compute_approx_kl(far_new, far_base, "k3")) > 1e10


def _loss(ratio: float, advantage: float, config: LossConfig = GRPO) -> tuple[float, float]:
    losses, clipfrac = policy_loss(
        torch.tensor([math.log(ratio)]), torch.zeros(1), torch.tensor([advantage]), config
    )
    return float(losses), float(clipfrac)


def test_clip_engages_at_one_plus_eps() -> None:
    assert _loss(1.1, 2.0) == pytest.approx((-2.2, 0.0))  # inside the range: -ratio * A
    assert _loss(1.5, 2.0) == pytest.approx((-2.4, 1.0))  # clipped to 1.2
    assert _loss(0.5, 2.0) == pytest.approx((-1.0, 0.0))  # A > 0, ratio low: not clipped
    assert _loss(0.5, -2.0) == pytest.approx((1.6, 1.0))  # A < 0, ratio low: clipped to 0.8
    high = LossConfig(eps_clip_high=0.28)
    assert _loss(1.25, 1.0, high) == pytest.approx((-1.25, 0.0))
    assert _loss(1.5, 1.0, high) == pytest.approx((-1.28, 1.0))


def test_dual_clip_bounds_a_negative_advantage_loss() -> None:
    assert _loss(10.0, -1.0) == pytest.approx((10.0, 0.0))
    assert _loss(10.0, -1.0, LossConfig(eps_clip_c=3.0))[0] == pytest.approx(3.0)
    assert _loss(10.0, 1.0, LossConfig(eps_clip_c=3.0))[0] == pytest.approx(-1.2)


def test_clipped_tokens_carry_no_gradient() -> None:
    logp = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    losses, _ = policy_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), GRPO)
    losses.sum().backward()
    assert logp.grad is not None
    assert float(logp.grad[0]) == 0.0 and float(logp.grad[1]) == pytest.approx(-1.1)


def test_sample_mean_and_token_mean_aggregation() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 7.0, 9.0])
    masks = [torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0, 0.0])]
    assert float(aggregate(values, masks, per_token=False)) == pytest.approx((1.5 + 3.0) / 2)
    assert float(aggregate(values, masks, per_token=True)) == pytest.approx((1 + 2 + 3) / 3)


def test_policy_loss_function_adds_the_kl_term() -> None:
    new = [torch.log(torch.tensor([0.5, 0.5]))]
    ref = [torch.log(torch.tensor([0.25, 0.25]))]
    adv, masks = [torch.tensor([1.0, 1.0])], [torch.ones(2)]
    plain, metrics = policy_loss_function(GRPO, new, new, adv, masks)
    assert float(plain) == pytest.approx(-1.0) and metrics["pg_clipfrac"] == 0.0
    config = LossConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    with_kl, metrics = policy_loss_function(config, new, new, adv, masks, ref)
    assert metrics["kl_loss"] == pytest.approx(math.log(2.0))
    assert float(with_kl) == pytest.approx(-1.0 + 0.5 * math.log(2.0))
    with pytest.raises(ValueError, match="reference"):
        policy_loss_function(config, new, new, adv, masks)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"advantage_estimator": "ppo"}, "--advantage-estimator"),
        ({"kl_loss_type": "k4"}, "--kl-loss-type"),
        ({"eps_clip": -0.1}, "--eps-clip"),
        ({"eps_clip_c": 0.5}, "--eps-clip-c"),
        ({"kl_coef": 0.1}, "--kl-coef"),  # grpo ignores it
        ({"kl_loss_coef": 0.1}, "--kl-loss-coef"),  # without --use-kl-loss
        (
            {
                "advantage_estimator": "reinforce_plus_plus",
                "normalize_advantages": True,
                "kl_coef": 0.1,
                "use_kl_loss": True,
                "kl_loss_coef": 0.1,
            },
            "--kl-coef",
        ),
        ({"advantage_estimator": "reinforce_plus_plus"}, "--advantage-estimator"),
    ],
)
def test_bad_loss_flags_name_the_flag(flags: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as error:
        LossConfig(**flags)  # type: ignore[arg-type]
    assert error.value.field == field
    assert error.value.fix
