"""One process, torch only: sample groups, score them, take a GRPO step. No Ray, no engines.

The smallest loop that joins the real-training blocks (a checkpoint from
``hf_checkpoint``, prompts from ``prompt_source``, a reward from ``rewards``, the loss
of ``losses``), so that their sum can be shown to learn before it is wired into the
distributed run. Its shape is miles' synchronous step (``train.py``: generate a
rollout of ``--rollout-batch-size`` prompts x ``--n-samples-per-prompt``, score it,
normalise rewards per group, compute advantages, one optimizer step per rollout here);
the old log-probs are the trainer's own before its step, as miles' actor computes them
without ``--use-rollout-logprobs``, so the PPO ratio starts at 1.

Sampling draws from a ``torch.Generator`` seeded from (seed, step), so a run is a
function of its seed, and a step's draws do not depend on the steps before it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from backends.common.training.grpo_settings import GrpoSettings
from backends.common.training.losses import LossConfig
from backends.common.training.policy import Trajectory
from backends.common.training.policy_loss import checkpoint_loss
from backends.common.training.prompt_source import Drawn
from backends.common.training.rewards import Reward, RewardSample
from miles_core.scenario.seeds import derive_seed


@dataclass(frozen=True)
class StepResult:
    step: int
    mean_reward: float
    loss: float
    pg_clipfrac: float
    first_index: int  # global index of the step's first prompt


def make_optimizer(model: PreTrainedModel, settings: GrpoSettings) -> torch.optim.Optimizer:
    """Megatron's --optimizer choices (miles trains with adam)."""
    if settings.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=settings.lr)
    return torch.optim.Adam(model.parameters(), lr=settings.lr)


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> list[list[int]]:
    """One response per prompt, up to and including EOS; prompts of one length batched."""
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(prompts):
        by_length[len(p)].append(i)
    out: list[list[int]] = [[] for _ in prompts]
    device = next(model.parameters()).device
    for rows in by_length.values():
        ids = torch.tensor([list(prompts[i]) for i in rows], device=device)
        step = model(input_ids=ids, use_cache=True)
        finished = [False] * len(rows)
        for _ in range(max_new_tokens):
            probs = torch.softmax(step.logits[:, -1].float() / temperature, -1)
            token = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0]
            for j, (i, t) in enumerate(zip(rows, token.tolist(), strict=True)):
                if not finished[j]:
                    out[i].append(t)
                    finished[j] = t == eos_id
            if all(finished):
                break
            step = model(input_ids=token[:, None].to(device), use_cache=True, **_cache_of(step))
    return out


def _cache_of(output: Any) -> dict[str, Any]:
    """The KV cache to pass on: transformers 5 names it ``cache``, 4.x ``past_key_values``."""
    if "cache" in output:
        return {"cache": output["cache"]}
    return {"past_key_values": output["past_key_values"]}


def rollout(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    drawn: Sequence[Drawn],
    reward: Reward,
    settings: GrpoSettings,
    step: int,
) -> tuple[list[list[int]], list[list[int]], list[float]]:
    """Prompt ids, response ids and rewards, ``n_samples_per_prompt`` per prompt in a row."""
    n = settings.n_samples_per_prompt
    generator = torch.Generator().manual_seed(derive_seed(settings.seed, f"rollout-{step}"))
    # the text is what the engine gets (chat template already applied by load_prompts)
    prompts = [tokenizer(d.prompt.text, add_special_tokens=False)["input_ids"] for d in drawn]
    repeated = [p for p in prompts for _ in range(n)]
    model.eval()
    responses = sample(
        model,
        repeated,
        settings.max_new_tokens,
        tokenizer.eos_token_id,
        generator,
        settings.temperature,
    )
    samples = [
        RewardSample(
            prompt=d.prompt.text,
            response=tokenizer.decode(responses[k * n + j], skip_special_tokens=True),
            label=d.prompt.label,
            metadata=d.prompt.metadata,
            index=d.index * n + j,
        )
        for k, d in enumerate(drawn)
        for j in range(n)
    ]
    return repeated, responses, reward.score_sync(None, samples)


def _chunks(values: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [values[k : k + size] for k in range(0, len(values), size)]


def grpo_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    tokenizer: PreTrainedTokenizerBase,
    drawn: Sequence[Drawn],
    reward: Reward,
    config: LossConfig,
    settings: GrpoSettings,
    step: int,
    ref_model: PreTrainedModel | None = None,
) -> StepResult:
    """Sample, score, and one optimizer step on the policy loss (with ``ref_model``'s
    log-probs for the KL term under --use-kl-loss)."""
    prompts, responses, rewards = rollout(model, tokenizer, drawn, reward, settings, step)
    n = settings.n_samples_per_prompt
    groups = [
        [Trajectory(tuple(p), tuple(r), score) for p, r, score in zip(*rows, strict=True)]
        for rows in zip(*(_chunks(x, n) for x in (prompts, responses, rewards)), strict=True)
    ]
    model.train()  # one update per rollout: the trainer's own loss, on-policy
    loss, metrics = checkpoint_loss(model, groups, config, ref_model)
    optimizer.zero_grad()
    loss.backward()
    if settings.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_grad)
    optimizer.step()
    return StepResult(
        step=step,
        mean_reward=sum(rewards) / len(rewards),
        loss=float(loss.detach()),
        pg_clipfrac=metrics["pg_clipfrac"],
        first_index=drawn[0].index,
    )
