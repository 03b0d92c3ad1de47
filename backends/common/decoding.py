"""One generate request inside a CPU engine: its tokens, its KV cache, the weights behind them.

This is the part of SGLang's scheduler that pause modes change, run for real on
the tiny policy with transformers' KV cache:

- a fresh request is prefilled (its prompt goes through the model once, filling
  the cache), then decoded one token at a time on that cache;
- ``retract`` frees the cache (``release``): when generation continues, the
  prompt and every token so far are prefilled again, on the weights loaded
  meanwhile;
- ``in_place`` keeps it: later tokens come from the new weights attending to
  keys and values the old weights computed (``kept_kv``, miles #2782);
- every token is generated under the engine's current weight version, and the
  response reports the versions of its spans (``spans``).

Sampling is seeded per token (``seed + i``), so a request's tokens depend on
the weights it saw, not on when it was paused.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from backends.common.policy import BOS, SEP


@functools.cache
def _cache_keyword(model_type: type) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache``; take what the model accepts."""
    parameters = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def forward(model: torch.nn.Module, ids: list[int], cache: Any) -> tuple[torch.Tensor, Any]:
    """The logits after ``ids`` and the cache extended by them."""
    keyword = _cache_keyword(type(model))
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([ids], device=device), use_cache=True, **{keyword: cache})
    return out.logits, out[keyword]


@dataclass
class Decoding:
    """A request's state between tokens (one per rid, owned by the engine's event loop)."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    seed: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cache: Any = None
    """The KV of prompt + tokens[:-1] (the last token is fed next); None: holds no pages."""
    cache_version: str | None = None
    """The weight version the cache was computed under."""
    spans: list[str] = field(default_factory=list)
    """The weight version of each run of tokens, in order (meta_info weight_versions)."""
    kept_kv: bool = False
    """A token came from newer weights than the KV it attended to (in_place)."""
    aborted: bool = False

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.max_new_tokens

    @property
    def holds_pages(self) -> bool:
        return self.cache is not None

    def release(self) -> None:
        """Retract: free the KV; the next token recomputes it on the weights of then."""
        self.cache = None
        self.cache_version = None

    @torch.no_grad()
    def step(self, model: torch.nn.Module, version: str) -> None:
        """Generate one token under ``version`` (prefilling first if the request holds no KV)."""
        if self.cache is None:
            ids, self.cache_version = [*self.prompt, *self.tokens], version
        else:
            ids = self.tokens[-1:]
            if self.cache_version != version:
                self.kept_kv = True
        logits, self.cache = forward(model, ids, self.cache)
        probs = torch.softmax(logits[0, -1].float(), -1).cpu()  # sampled on CPU, any device
        generator = torch.Generator().manual_seed(self.seed + len(self.tokens))
        token = int(torch.multinomial(probs, 1, generator=generator))
        self.tokens.append(token)
        self.logprobs.append(float(torch.log(probs[token])))
        if not self.spans or self.spans[-1] != version:
            self.spans.append(version)


@torch.no_grad()
def health_token(model: torch.nn.Module) -> int:
    """One token of a throwaway request (SGLang's /health_generate)."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([[BOS, SEP]], device=device)).logits
    return int(logits[0, -1].argmax())
