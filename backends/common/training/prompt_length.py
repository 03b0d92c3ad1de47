"""Prompts longer than the engines take, dropped by length before they cost memory.

miles drops them as it loads the data: ``Dataset._load_and_filter_dataset`` filters every
row with ``_filter_func``, whose ``_should_skip_prompt`` tokenizes the formatted prompt
(``add_special_tokens=False``) and skips it when it is longer than ``max_length``, which
miles' rollout data source passes as ``--rollout-max-prompt-len`` (miles/utils/data.py;
None there: no filter). SGLang refuses a request whose input is at or over the context
length, or whose input plus ``max_new_tokens`` is over it, with a 400
(srt/managers/tokenizer_manager.py ``_validate_one_request``; the CPU engine keeps the same
rule, backends/common/engine/generate.py ``sampling_of``). So a prompt longer than the
context less ``--rollout-max-response-len`` would only ever be refused: it is dropped here
as miles drops one over ``--rollout-max-prompt-len``, which may only lower that bound.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.common.training.prompt_data import Prompt
from miles_core.errors import ConfigError

DEFAULT_CONTEXT = 2048
"""transformers' ``PretrainedConfig`` default ``max_position_embeddings`` for a config.json
without one (LlamaConfig's)."""


@dataclass(frozen=True)
class Kept:
    """The prompts the engines can take, and how many were dropped for their length."""

    prompts: tuple[Prompt, ...]
    dropped: int
    bound: int
    """The longest prompt kept, in tokens."""

    def note(self) -> str:
        return (
            f"--prompt-data: dropped {self.dropped} of {self.dropped + len(self.prompts)} "
            f"prompts longer than {self.bound} tokens (as miles' Dataset filters them)"
        )


def context_length(directory: str) -> int:
    """The engines' context: the checkpoint's ``max_position_embeddings`` (what the CPU
    engine and SGLang take as ``context_len``)."""
    config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    value = config.get("max_position_embeddings", DEFAULT_CONTEXT)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError(
            "--hf-checkpoint",
            f"its config.json's max_position_embeddings is {value!r}",
            "give the model's context length in tokens (>= 2)",
        )
    return value


def prompt_bound(context: int, max_response_len: int, max_prompt_len: int | None) -> int:
    """The longest prompt an engine takes with room for the response, or the lower
    ``--rollout-max-prompt-len``; an error names the flag that leaves no room."""
    room = context - max_response_len
    if room < 1:
        raise ConfigError(
            "--rollout-max-response-len",
            f"{max_response_len} tokens leave no room for a prompt in the model's context of "
            f"{context} tokens (the engine refuses prompt plus max_new_tokens over it)",
            f"pass at most {context - 1}",
        )
    if max_prompt_len is None:
        return room
    if max_prompt_len < 1 or max_prompt_len > room:
        raise ConfigError(
            "--rollout-max-prompt-len",
            f"got {max_prompt_len}: a prompt takes 1 to {room} tokens here (the context of "
            f"{context} less --rollout-max-response-len {max_response_len})",
            f"pass an integer from 1 to {room}, or leave it out to keep every prompt that fits",
        )
    return max_prompt_len


def keep_fitting(prompts: tuple[Prompt, ...], tokenizer: Any, bound: int) -> Kept:
    """The prompts of at most ``bound`` tokens (each line is bounded as read, so each
    tokenization is too); none left is an error naming --prompt-data."""
    fitting = [p for p in prompts if _tokens(tokenizer, p.text) <= bound]
    kept = tuple(dataclasses.replace(p, row=i) for i, p in enumerate(fitting))  # miles' index
    if not kept:
        raise ConfigError(
            "--prompt-data",
            f"every one of its {len(prompts)} prompts is longer than {bound} tokens, the most "
            "an engine takes with room for --rollout-max-response-len",
            "use shorter prompts, or a lower --rollout-max-response-len",
        )
    return Kept(kept, len(prompts) - len(kept), bound)


def _tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])
