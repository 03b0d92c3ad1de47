"""A CPU engine's prefix cache: a prompt's real KV, kept and handed to later requests for it.

SGLang's radix cache keeps the keys and values a request computed and gives them
to any later request that shares the prefix, whatever weights computed them,
until ``/flush_cache`` drops the tree (miles #2782: under in_place no flush comes
between updates). Here the unit is a whole prompt but its last token (that token
is always run, so the first logits come from the weights of the moment, as
SGLang keeps one token to compute). Policies, as ``[sim] prefix_cache``:

- ``off``: nothing kept (SGLang's ``--disable-radix-cache``);
- ``shared``: reused whatever weights computed it (SGLang's radix cache);
- ``by_version``: reused only under the weights that computed it; a prompt met
  under newer weights is computed again and replaces the entry.

A request's ``extra_key`` (SGLang's, miles' ``--namespaced-radix-cache``: the train call's
namespace) is part of the key under every policy: KV is reused only within one namespace.

Entries live until a flush or the process's end (no eviction: the tiny policy's
prompts are a few tokens). Used only from the engine's decoding thread.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from miles_core.scenario.world import PREFIX_CACHES


@dataclass(frozen=True)
class PrefixHit:
    """KV a request may start from: a copy (decoding extends it in place)."""

    cache: Any
    tokens: int
    version: str
    """The weight version that computed it."""


class PrefixCache:
    def __init__(self, policy: str = "off") -> None:
        if policy not in PREFIX_CACHES:
            raise ValueError(
                f"prefix_cache: got {policy!r}; pass one of {', '.join(PREFIX_CACHES)}"
            )
        self.policy = policy
        self._entries: dict[tuple[str | None, tuple[int, ...]], tuple[Any, str]] = {}

    @property
    def on(self) -> bool:
        return self.policy != "off"

    def lookup(
        self, prompt: list[int], version: str, namespace: str | None = None
    ) -> PrefixHit | None:
        """The prompt's cached KV in ``namespace`` if the policy lets a request under
        ``version`` reuse it."""
        key = tuple(prompt[:-1])
        entry = self._entries.get((namespace, key)) if self.on and key else None
        if entry is None:
            return None
        cache, computed_by = entry
        if self.policy == "by_version" and computed_by != version:
            return None
        return PrefixHit(copy.deepcopy(cache), len(key), computed_by)

    def store(
        self, prompt: list[int], cache: Any, version: str, namespace: str | None = None
    ) -> None:
        """Keep a copy of the KV of ``prompt[:-1]``, computed under ``version``, in
        ``namespace``."""
        if self.on and len(prompt) > 1:
            self._entries[(namespace, tuple(prompt[:-1]))] = (copy.deepcopy(cache), version)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
