"""The tiny policy, its verifiable task and the GRPO objective, shared by trainers and engines.

The task ("climb"): a prompt is BOS, three digits, SEP; the policy answers with
RESPONSE_TOKENS tokens, and the reward is the fraction of them that are digits
strictly greater than the prompt's last digit. A random policy earns about
0.4; a trained one close to 0.95 (answering mostly 9s is the shortcut it finds,
which is fine: the point is a reward the reader can verify and watch rise).

The model is a two-layer Llama built from a transformers config with a fixed
init seed (no download), so every trainer cell and engine starts bitwise equal.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)

from backends.common.training.loss_config import LossConfig
from miles_core.scenario.seeds import derive_seed
from miles_core.transfer import Bucket, ParamSpec, UpdateUnit, units_of

DIGITS = 10
BOS, SEP = 10, 11
VOCAB = 12
PROMPT_DIGITS = 3
RESPONSE_TOKENS = 4
INIT_SEED = 1234
CONTEXT_LENGTH = 4096
"""The model's context (its max_position_embeddings: what SGLang's engine limits a prompt
plus max_new_tokens to). It creates no parameter, so the weights do not depend on it."""


@dataclass(frozen=True)
class PolicyConfig:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    lr: float = 1e-2

    def hf_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=self.hidden_size,
            intermediate_size=2 * self.hidden_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=max(1, self.heads // 2),
            max_position_embeddings=CONTEXT_LENGTH,
            tie_word_embeddings=True,
            bos_token_id=BOS,
            eos_token_id=None,
            pad_token_id=None,
        )


@dataclass(frozen=True)
class HFPolicy:
    """A policy from an HF checkpoint (``--hf-checkpoint DIR``: config.json, safetensors and a
    tokenizer), trained with miles' loss flags. Every process loads the same files, so every
    trainer cell and engine starts bitwise equal, as with the tiny policy."""

    checkpoint: str
    lr: float = 1e-3
    loss: LossConfig = field(default_factory=LossConfig)

    def hf_config(self) -> PretrainedConfig:
        return AutoConfig.from_pretrained(self.checkpoint)


AnyPolicy = PolicyConfig | HFPolicy


def build_model(config: AnyPolicy) -> PreTrainedModel:
    """The same weights in every process: the checkpoint's, or an init under a fixed seed
    (the RNG restored after)."""
    torch.set_num_threads(1)
    if isinstance(config, HFPolicy):
        return AutoModelForCausalLM.from_pretrained(config.checkpoint, dtype=torch.float32).float()
    with torch.random.fork_rng():
        torch.manual_seed(INIT_SEED)
        model = LlamaForCausalLM(config.hf_config())
    return model.float()


def prompt_tokens(seed: int, prompt_id: int) -> list[int]:
    rng = random.Random(derive_seed(seed, f"prompt-{prompt_id}"))
    return [BOS, *(rng.randrange(DIGITS) for _ in range(PROMPT_DIGITS)), SEP]


def reward(prompt: Sequence[int], response: Sequence[int]) -> float:
    """The verifier: the share of response tokens that are digits above the last prompt digit."""
    if not response:
        return 0.0
    last = prompt[-2]
    return sum(1 for t in response if t < DIGITS and t > last) / len(response)


def param_specs(model: torch.nn.Module) -> tuple[ParamSpec, ...]:
    return tuple(
        ParamSpec.of(name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in model.named_parameters()
    )


def update_units(model: torch.nn.Module) -> tuple[UpdateUnit, ...]:
    """Each layer's q/k/v projections travel together (a fused-QKV unit, as in miles)."""

    def atomic(name: str) -> str | None:
        if "self_attn" in name and any(f".{p}_proj." in name for p in "qkv"):
            return name.split(".self_attn.")[0] + ".qkv"
        return None

    return units_of(param_specs(model), atomic)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: an FSDP2 shard (DTensor) is gathered across its cell, so every
    rank of the cell must call this for the same tensors in the same order."""
    gather = getattr(tensor, "full_tensor", None)
    return (gather() if gather is not None else tensor).detach()


def checksum(model: torch.nn.Module) -> str:
    """sha256 over every parameter's bytes in name order: bitwise equality, not closeness.

    On a sharded model it is a collective of the cell (see ``full``)."""
    return checksum_of(model.named_parameters())


def checksum_of(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """``checksum`` of (name, tensor) pairs: a trainer whose parameters are not the engines'
    (Megatron's) sums what it converts to their names."""
    digest = hashlib.sha256()
    for name, p in sorted(named, key=lambda pair: pair[0]):
        digest.update(name.encode())
        digest.update(full(p).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def bucket_tensors(model: torch.nn.Module, bucket: Bucket) -> dict[str, torch.Tensor]:
    """The bucket's tensors, whole (a collective of the cell on a sharded model)."""
    params = dict(model.named_parameters())
    return {span.name: full(params[span.name]) for span in bucket.spans}


@torch.no_grad()
def sample(
    model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int, seed: int
) -> tuple[list[int], list[float]]:
    """Sample at temperature 1; returns the tokens and their logprobs."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([list(prompt)])
    tokens, logprobs = [], []
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids).logits[0, -1].float()
        probs = torch.softmax(logits, -1)
        token = int(torch.multinomial(probs, 1, generator=generator))
        tokens.append(token)
        logprobs.append(float(torch.log(probs[token])))
        ids = torch.cat([ids, torch.tensor([[token]])], 1)
    return tokens, logprobs


@dataclass(frozen=True)
class Trajectory:
    """One sample as the trainer needs it (the Sample's payload)."""

    prompt: tuple[int, ...]
    response: tuple[int, ...]
    reward: float


def grpo_loss(model: torch.nn.Module, groups: Sequence[Sequence[Trajectory]]) -> torch.Tensor:
    """Policy gradient with group-normalised advantages (GRPO without the KL term).

    Advantages are (r - mean) / (std + eps) within each prompt's group; a group
    whose rewards are all equal teaches nothing and contributes zero.
    """
    rows, advantages = [], []
    for group in groups:
        rewards = torch.tensor([t.reward for t in group])
        std = rewards.std() if len(group) > 1 else torch.tensor(0.0)
        adv = (rewards - rewards.mean()) / (std + 1e-6)
        rows += list(group)
        advantages.append(adv)
    device = next(model.parameters()).device
    if not rows:  # still run the model: a sharded cell's ranks all take part in its collectives
        return model(input_ids=torch.tensor([[BOS]], device=device)).logits.sum() * 0.0
    prompt_len = len(rows[0].prompt)
    ids = torch.tensor([[*t.prompt, *t.response] for t in rows], device=device)
    logits = model(input_ids=ids[:, :-1]).logits[:, prompt_len - 1 :, :].float()
    response = ids[:, prompt_len:]
    logp = torch.log_softmax(logits, -1).gather(-1, response[..., None]).squeeze(-1)
    adv = torch.cat(advantages).to(device)
    return -(adv[:, None] * logp).mean()
