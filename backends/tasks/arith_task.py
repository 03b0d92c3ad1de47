"""A generated arithmetic task a small model learns on CPU in minutes, scored by ``math``.

The data are sums ``a+b=`` of operands in ``0..max_operand``, written in miles' JSONL
shape (``{"input": "3+4=", "label": "7"}``: ``--input-key input --label-key label``),
so ``--prompt-data train.jsonl --rm-type math`` trains on them; ``--apply-chat-template``
works too (the tokenizer of ``char_tokenizer`` has a template). train.jsonl holds
``prompts`` sums, each total equally often, so that no constant answer beats chance and
a rising reward means the model reads its operands; test.jsonl holds every pair once.
The default size (operands 0..2, a 128-wide two-layer model) is the one the learning
test trains; ``--max-operand 3`` was checked to learn too, in about 150 steps.

The checkpoint is ``hf_checkpoint.write_random_checkpoint``'s random model after a short
*format* warm-up: miles' ``math`` reward gives 1 only to a response with a
``\\boxed{answer}`` (``grade_answer_verl``), which a random model never writes, so RL
from it would see no reward at all. The warm-up teaches the shape
``\\boxed{N}<|end|>`` with N drawn at random from the possible sums, independent of the
prompt: afterwards the model answers in format but at chance
(``1 / (2 * max_operand + 1)``), and only RL can teach it which sum is right. It plays
the part of the instruct checkpoint a miles user starts from.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from backends.common.training.hf_checkpoint import (
    CheckpointInfo,
    inspect_checkpoint,
    load_checkpoint,
    write_random_checkpoint,
)
from backends.tasks.spec import ArithSpec

INPUT_KEY, LABEL_KEY = "input", "label"


def make_rows(spec: ArithSpec) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(train rows, test rows): ``prompts`` sums, each total equally likely (then its
    operands at random), so answering one number always earns exactly chance; and every
    pair of operands once."""
    rng = random.Random(spec.seed)
    top = spec.max_operand
    span = range(top + 1)
    train = []
    for _ in range(spec.prompts):
        total = rng.choice(spec.answers())  # every sum equally often: no constant answer wins
        a = rng.randint(max(0, total - top), min(top, total))
        train.append({INPUT_KEY: f"{a}+{total - a}=", LABEL_KEY: str(total)})
    test = [{INPUT_KEY: f"{a}+{b}=", LABEL_KEY: str(a + b)} for a in span for b in span]
    return train, test


def answer_text(answer: int | str) -> str:
    """A response in the format the ``math`` reward reads."""
    return f"\\boxed{{{answer}}}"


def prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str, chat: bool) -> list[int]:
    """The token ids the engine gets for a prompt, raw or through the chat template."""
    if chat:
        messages = [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _format_batch(
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, str]],
    spec: ArithSpec,
    rng: random.Random,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts (half raw, half chat-templated) followed by a boxed answer drawn at random
    (not the sum) and EOS; labels mask the prompt out."""
    sequences, targets = [], []
    for i, row in enumerate(rows):
        prompt = prompt_ids(tokenizer, row[INPUT_KEY], chat=i % 2 == 1)
        guess = rng.choice(spec.answers())
        answer = tokenizer(answer_text(guess), add_special_tokens=False)["input_ids"]
        answer.append(tokenizer.eos_token_id)
        sequences.append(prompt + answer)
        targets.append([-100] * len(prompt) + answer)
    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in sequences])
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    return ids, labels


def warm_up_format(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict[str, str]],
    spec: ArithSpec,
    batch_size: int = 64,
    lr: float = 3e-3,
) -> float:
    """Supervised steps on the answer format only (random answers); the last loss."""
    rng = random.Random(spec.seed + 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(spec.warmup_steps):
        ids, labels = _format_batch(tokenizer, rng.choices(rows, k=batch_size), spec, rng)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def write_task(out: Path | str, spec: ArithSpec) -> CheckpointInfo:
    """DIR/checkpoint (random, then format warm-up), DIR/train.jsonl, DIR/test.jsonl."""
    folder = Path(out)
    checkpoint = folder / "checkpoint"
    write_random_checkpoint(
        checkpoint, spec.arch, spec.hidden_size, spec.layers, spec.heads, spec.seed
    )
    train, test = make_rows(spec)
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if spec.warmup_steps:
        model, tokenizer, _ = load_checkpoint(checkpoint)
        warm_up_format(model, tokenizer, train, spec)
        model.save_pretrained(checkpoint, safe_serialization=True)
    return inspect_checkpoint(checkpoint)
