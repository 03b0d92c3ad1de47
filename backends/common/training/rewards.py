"""Rule-based rewards as miles' ``--rm-type``, and a user's reward via ``--custom-rm-path``.

miles' ``miles/rollout/rm_hub/__init__.py`` (``async_rm``, ``batched_async_rm``)
scores a sample's response against its label:

- ``math``: 1 if the last ``\\boxed{...}`` of the response equals the label, else 0
  (``grade_answer_verl``);
- ``deepscaler``: the same on the text after ``</think>`` (or ``###Response``), 0
  without either (``get_deepscaler_rule_based_reward``);
- ``dapo``: the last ``Answer: ...`` line against an integer label, a dict
  ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}`` (``math_dapo_utils.compute_score``),
  whose number ``--reward-key score`` picks (``Sample.get_reward_value``).

Answers are compared by ``math_grading`` (miles' normalisation, without its sympy
step). miles' other types (``f1``, ``gpqa``, ``ifbench``, ``remote_rm``, ``random``,
...) are refused with a ConfigError naming ``--rm-type``.

``--custom-rm-path module.function`` replaces the rule: loaded as miles'
``load_function`` does (the path split at its last dot, the module imported, the name
looked up), and awaited as miles awaits it: ``await fn(args, sample)`` for each
sample, or ``await fn(args, samples)`` with the group's list under ``--group-rm``. A
path that does not import, a missing name, something not callable or not ``async``
is refused here, when the reward is resolved, before any rollout.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.common.training.math_grading import (
    as_number,
    label_answer,
    last_answer_line,
    last_boxed,
    normalize,
    same_answer,
)
from miles_core.errors import ConfigError

RewardValue = float | dict[str, Any]


@dataclass(frozen=True)
class RewardSample:
    """What a reward function reads of miles' ``Sample``: the same attribute names."""

    prompt: str
    response: str
    label: Any = None
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)
    index: int = 0


def math_reward(response: str, label: Any) -> int:
    """miles' ``math``: 1 when the response's last \\boxed{} answer equals the label."""
    truth = label_answer(label)
    given = last_boxed(response)
    return int(truth is not None and given is not None and same_answer(given, truth))


def deepscaler_reward(response: str, label: Any) -> int:
    """miles' ``deepscaler``: ``math`` on the text after the reasoning, 0 without one."""
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0
    return math_reward(solution, label)


def dapo_reward(response: str, label: Any) -> dict[str, Any]:
    """miles' ``dapo``: the last ``Answer:`` line against an integer label, +1 / -1."""
    truth = as_number(normalize(str(label)))
    if truth is None:
        raise ConfigError(
            "--rm-type", f"dapo needs numeric labels, got {label!r}", "use --rm-type math"
        )
    found = last_answer_line(response[-300:])
    pred = "[INVALID]" if found is None else normalize(found.split("=")[-1])
    pred = last_boxed(pred) or pred
    correct = pred == str(int(truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


RULES: dict[str, Callable[[str, Any], RewardValue]] = {
    "math": math_reward,
    "deepscaler": deepscaler_reward,
    "dapo": dapo_reward,
}
DICT_RULES = {"dapo": ("score", "acc", "pred")}
"""Rules that return a dict, and its keys: --reward-key must name one of them."""


def load_custom_reward(path: str) -> Callable[..., Awaitable[RewardValue]]:
    """The function ``--custom-rm-path`` names, checked as miles will call it."""
    flag = "--custom-rm-path"
    module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise ConfigError(flag, f"{path!r} is not module.function", "pass e.g. my_rm.reward")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any failure of the user's module is its own to fix
        raise ConfigError(
            flag,
            f"module {module_name!r} does not import ({type(error).__name__}: {error})",
            "put the module on PYTHONPATH and fix its import",
        ) from error
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(
            flag, f"module {module_name!r} has no {name!r}", "name a function it defines"
        )
    if not callable(fn):
        raise ConfigError(
            flag, f"{path!r} is a {type(fn).__name__}, not callable", "name a function"
        )
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)):
        raise ConfigError(
            flag,
            f"{path!r} is not async: miles awaits it (`await fn(args, sample)`)",
            "declare it `async def`",
        )
    return fn


@dataclass(frozen=True)
class Reward:
    """A resolved reward: ``score`` gives one value per sample, as miles' rollout does."""

    rm_type: str | None
    custom: Callable[..., Awaitable[Any]] | None = None
    group_rm: bool = False
    reward_key: str | None = None

    async def score(self, args: Any, samples: Sequence[RewardSample]) -> list[RewardValue]:
        """A group's rewards: one await of the custom function under --group-rm, else
        one per sample, concurrently (miles' ``batched_async_rm``)."""
        if self.custom is not None and self.group_rm:
            values = await self.custom(args, list(samples))
            if not isinstance(values, list) or len(values) != len(samples):
                raise ValueError(
                    f"--custom-rm-path with --group-rm returned {values!r}: "
                    f"return a list of {len(samples)} rewards"
                )
            return values
        return list(await asyncio.gather(*(self._one(args, s) for s in samples)))

    async def _one(self, args: Any, sample: RewardSample) -> RewardValue:
        if self.custom is not None:
            return await self.custom(args, sample)
        return RULES[self.rm_type](sample.response, sample.label)  # type: ignore[index]

    def value(self, reward: RewardValue) -> float:
        """The number a reward stands for: a dict's ``--reward-key`` entry (miles'
        ``Sample.get_reward_value``)."""
        if isinstance(reward, dict):
            if self.reward_key is None or self.reward_key not in reward:
                raise ConfigError(
                    "--reward-key",
                    f"the reward is a dict with keys {sorted(reward)}",
                    "pass --reward-key naming the number to train on (dapo: score)",
                )
            return float(reward[self.reward_key])
        return float(reward)

    def score_sync(self, args: Any, samples: Sequence[RewardSample]) -> list[float]:
        """The values of ``score`` for callers outside an event loop (tests, tools)."""
        return [self.value(r) for r in asyncio.run(self.score(args, samples))]


def resolve_reward(
    rm_type: str | None,
    custom_rm_path: str | None = None,
    group_rm: bool = False,
    reward_key: str | None = None,
) -> Reward:
    """The reward the flags ask for; a custom path wins over --rm-type, as in miles."""
    if custom_rm_path is not None:
        return Reward(rm_type, load_custom_reward(custom_rm_path), group_rm, reward_key)
    kind = (rm_type or "").strip()
    if kind not in RULES:
        raise ConfigError(
            "--rm-type",
            f"{rm_type!r} is not a rule this testbed implements",
            f"pass one of {', '.join(RULES)}, or --custom-rm-path module.function",
        )
    if kind in DICT_RULES and reward_key not in DICT_RULES[kind]:
        raise ConfigError(
            "--reward-key",
            f"--rm-type {kind} gives a dict of {sorted(DICT_RULES[kind])}, got {reward_key!r}",
            "pass --reward-key score",
        )
    return Reward(kind, None, group_rm, reward_key)
