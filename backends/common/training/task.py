"""What the router asks of a task: a prompt's token ids, how long a response may be, and
a response's reward. The loop numbers prompts 0, 1, 2, ... as it draws them (recycled ones
keep their number), so a prompt's number is the data cursor: the same number is the same
row in every process and across a resume, and nothing else needs saving.

- ``ClimbTask``: the tiny policy's task (policy.py), a prompt made from the seed;
- ``DataTask``: miles' prompt data (``--prompt-data``, prompt_data.py) in miles' epoch
  order (``--rollout-shuffle``: a fresh order each epoch, prompt_source.epoch_order),
  tokenized as the engine gets it, scored by ``--rm-type`` or ``--custom-rm-path``
  (rewards.py) on the decoded response.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from backends.common.training.policy import RESPONSE_TOKENS, prompt_tokens, reward
from backends.common.training.prompt_data import Prompt
from backends.common.training.prompt_source import epoch_order
from backends.common.training.rewards import Reward, RewardSample


class Task(Protocol):
    max_new_tokens: int

    def prompt(self, prompt_id: int) -> list[int]: ...

    async def score(
        self, prompt_id: int, prompt: Sequence[int], response: Sequence[int]
    ) -> float: ...


@dataclass(frozen=True)
class ClimbTask:
    seed: int
    max_new_tokens: int = RESPONSE_TOKENS

    def prompt(self, prompt_id: int) -> list[int]:
        return prompt_tokens(self.seed, prompt_id)

    async def score(self, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> float:
        return reward(prompt, response)


@dataclass(frozen=True)
class DataTask:
    """Prompts already read and checked (``load_prompts``, chat template applied)."""

    prompts: tuple[Prompt, ...]
    tokenizer_dir: str
    rule: Reward
    max_new_tokens: int
    shuffle: bool = False
    seed: int = 42
    _cache: dict[int, list[int]] = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def row(self, prompt_id: int) -> Prompt:
        """The prompt the number stands for: epoch ``id // size``, in that epoch's order."""
        size = len(self.prompts)
        epoch, offset = divmod(prompt_id, size)
        return self.prompts[_order(size, epoch, self.seed, self.shuffle)[offset]]

    def prompt(self, prompt_id: int) -> list[int]:
        if prompt_id not in self._cache:
            encoded = self.tokenizer(self.row(prompt_id).text, add_special_tokens=False)
            self._cache[prompt_id] = list(encoded["input_ids"])
        return list(self._cache[prompt_id])

    async def score(self, prompt_id: int, prompt: Sequence[int], response: Sequence[int]) -> float:
        row = self.row(prompt_id)
        text = self.tokenizer.decode(list(response), skip_special_tokens=True)
        sample = RewardSample(row.text, text, row.label, row.metadata, prompt_id)
        (value,) = await self.rule.score(None, [sample])
        return self.rule.value(value)


@functools.lru_cache(maxsize=8)
def _order(size: int, epoch: int, seed: int, shuffle: bool) -> tuple[int, ...]:
    return epoch_order(size, epoch, seed, shuffle)
