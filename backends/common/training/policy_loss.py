"""A trainer rank's loss on its share of a batch of groups, for a policy from a checkpoint.

The tiny policy's ``grpo_loss`` (policy.py) assumes one prompt length and one response
length; a data set's prompts and EOS-ended responses vary, so this one pads and masks,
and speaks miles' loss flags (``--advantage-estimator``, ``--eps-clip``, ``--use-kl-loss``
...: losses.py). Rewards are normalised within each prompt's group, as miles'
``_normalize_rewards_by_rollout`` does; the old log-probs are the trainer's own before
its one optimizer step per rollout (miles computes them with the actor unless
``--use-rollout-logprobs``), so the PPO ratio starts at 1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from backends.common.training.losses import (
    LossConfig,
    compute_advantages,
    normalize_group_rewards,
    policy_loss_function,
)
from backends.common.training.policy import Trajectory

PAD = 0
"""Fills a response out to its batch's longest: after the response, so no real token's
logits see it, and masked out of the loss."""


def response_log_probs(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
) -> list[torch.Tensor]:
    """Each response token's log-prob under ``model`` (with grad); batched per prompt length."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(prompts)
    device = next(model.parameters()).device
    for length, rows in by_length.items():
        width = max(len(responses[i]) for i in rows)
        ids = torch.tensor(
            [[*prompts[i], *responses[i], *[pad_id] * (width - len(responses[i]))] for i in rows],
            device=device,
        )
        logits = model(input_ids=ids[:, :-1]).logits[:, length - 1 :].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, length:, None])[..., 0]
        for j, i in enumerate(rows):
            out[i] = logp[j, : len(responses[i])]
    return out


def checkpoint_loss(
    model: torch.nn.Module,
    groups: Sequence[Sequence[Trajectory]],
    config: LossConfig,
    ref_model: torch.nn.Module | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to backpropagate and miles' metrics; an empty share still runs the model
    (a sharded cell's ranks all take part in its collectives)."""
    rows = [t for group in groups for t in group if t.response]
    if not rows:
        device = next(model.parameters()).device
        zero = model(input_ids=torch.tensor([[PAD]], device=device)).logits.sum() * 0.0
        return zero, {}
    rewards = [
        value
        for group in groups
        for value in normalize_group_rewards(config, [t.reward for t in group if t.response])
    ]
    prompts = [t.prompt for t in rows]
    responses = [t.response for t in rows]
    log_probs = response_log_probs(model, prompts, responses, PAD)
    masks = [
        torch.ones(len(r), device=lp.device) for r, lp in zip(responses, log_probs, strict=True)
    ]
    ref = None
    if config.use_kl_loss:
        if ref_model is None:
            raise ValueError("--use-kl-loss needs a reference model (the initial weights)")
        with torch.no_grad():
            ref = response_log_probs(ref_model, prompts, responses, PAD)
    advantages = [
        a.to(m.device)
        for a, m in zip(compute_advantages(config, rewards, masks), masks, strict=True)
    ]
    old = [lp.detach() for lp in log_probs]
    return policy_loss_function(config, log_probs, old, advantages, masks, ref)
