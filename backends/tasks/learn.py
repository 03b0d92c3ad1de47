"""GRPO on a task directory in one process: the proof that the real-training blocks learn.

``learn`` loads DIR/checkpoint and DIR/train.jsonl (as ``arith_task.write_task`` wrote
them; any checkpoint and JSONL with ``input``/``label`` keys do), and runs
``local_grpo.grpo_step`` with the ``math`` reward for ``steps`` steps. ``evaluate``
is the greedy accuracy on a JSONL file (DIR/test.jsonl), the number a person checks
after training.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from backends.common.training.grpo_settings import GrpoSettings
from backends.common.training.hf_checkpoint import load_checkpoint
from backends.common.training.local_grpo import StepResult, grpo_step, make_optimizer
from backends.common.training.loss_config import LossConfig
from backends.common.training.prompt_data import Prompt, PromptFlags, load_prompts
from backends.common.training.prompt_source import PromptSource
from backends.common.training.rewards import math_reward, resolve_reward


def flags(task: Path, name: str, chat: bool) -> PromptFlags:
    return PromptFlags(str(task / name), "input", "label", apply_chat_template=chat)


def learn(
    task: Path | str,
    steps: int,
    settings: GrpoSettings,
    config: LossConfig,
    chat: bool = False,
    on_step: Callable[[StepResult], None] | None = None,
) -> tuple[list[StepResult], PreTrainedModel, PreTrainedTokenizerBase]:
    """``steps`` GRPO steps from the task's checkpoint; the steps' results and the model."""
    folder = Path(task)
    model, tokenizer, _ = load_checkpoint(folder / "checkpoint")
    prompts = load_prompts(flags(folder, "train.jsonl", chat), tokenizer)
    source = PromptSource(prompts, shuffle=True, seed=settings.seed)
    reward = resolve_reward("math")
    optimizer = make_optimizer(model, settings)
    ref_model = load_checkpoint(folder / "checkpoint")[0].eval() if config.use_kl_loss else None
    results = []
    for step in range(steps):
        drawn = source.take(settings.rollout_batch_size)
        result = grpo_step(
            model, optimizer, tokenizer, drawn, reward, config, settings, step, ref_model
        )
        results.append(result)
        if on_step is not None:
            on_step(result)
    return results, model, tokenizer


@torch.no_grad()
def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: tuple[Prompt, ...],
    max_new_tokens: int = 8,
) -> float:
    """The share of prompts whose greedy answer the ``math`` reward scores 1."""
    model.eval()
    right = 0
    for prompt in prompts:
        ids = tokenizer(prompt.text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        right += math_reward(text, prompt.label)
    return right / len(prompts)
