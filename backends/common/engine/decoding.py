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
the weights it saw, not on when it was paused. SGLang's sampling parameters that
change which token is drawn (temperature, top_k, top_p, min_p, logit_bias) filter
the distribution before the draw, as SGLang's sampler does; a request ends on
``max_new_tokens`` (finish reason "length") or on a stop token (its
``stop_token_ids``, or the model's EOS unless ``ignore_eos``: finish reason "stop",
the token kept in the output as SGLang keeps it), never before ``min_new_tokens``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from backends.common.engine.prefix_cache import PrefixCache
from backends.common.training.policy import BOS, SEP


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


SAMPLING_EPS: Final = 1e-6
"""A temperature below this is greedy (SGLang's ``_SAMPLING_EPS``: top_k becomes 1)."""


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters a request was checked into (generate.py, sampling_of)."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1: the whole vocabulary (SGLang's TOP_K_ALL)."""
    min_p: float = 0.0
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    """Tokens that end the request (with the model's EOS, unless ``ignore_eos``)."""
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def plain(self) -> bool:
        """Nothing filters the distribution: the draw is softmax at temperature 1."""
        return (
            self.temperature == 1.0
            and self.top_p == 1.0
            and self.top_k == -1
            and self.min_p == 0.0
            and not self.logit_bias
        )

    def probabilities(self, logits: torch.Tensor, banned: frozenset[int]) -> torch.Tensor:
        """The distribution to draw from, after SGLang's filters (1-D, on CPU); ``banned``
        tokens cannot be drawn (stop tokens before ``min_new_tokens``, as SGLang masks them)."""
        logits = logits.float().cpu()
        if self.plain and not banned:  # bit for bit the draw of every run before these existed
            return torch.softmax(logits, -1)
        for token, bias in self.logit_bias:
            logits[token] += bias
        for token in banned:
            logits[token] = -torch.inf
        top_k = 1 if self.temperature < SAMPLING_EPS else self.top_k
        temperature = 1.0 if self.temperature < SAMPLING_EPS else self.temperature
        probs = torch.softmax(logits / temperature, -1)
        if 0 < top_k < probs.numel():
            kept = torch.topk(probs, top_k).indices
            probs = torch.zeros_like(probs).index_copy_(0, kept, probs[kept])
        if self.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            before = torch.cumsum(ordered, 0) - ordered  # mass ahead of each token
            ordered[before > self.top_p] = 0.0
            probs = torch.zeros_like(probs).index_copy_(0, order, ordered)
        if self.min_p > 0.0:
            probs[probs < self.min_p * probs.max()] = 0.0
        return probs / probs.sum()


@dataclass
class Decoding:
    """A request's state between tokens (one per rid, owned by the engine's event loop)."""

    rid: str
    prompt: list[int]
    max_new_tokens: int
    seed: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_tokens: frozenset[int] = frozenset()
    """Tokens that finish the request ("stop"): stop_token_ids and the EOS, unless ignored."""
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
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (SGLang's ``cached_tokens``)."""
    cached_versions: list[str] = field(default_factory=list)
    """The weight versions that computed the KV it reused from the prefix cache."""
    extra_key: str | None = None
    """Its prefix-cache namespace (SGLang's ``extra_key``; miles' --namespaced-radix-cache):
    prompt KV is reused only between requests with the same one."""
    start_weight_version: int | None = None
    """The version its caller declared it started under (sglang #34185's draft field): a
    pause's ``abort_below_start_weight_version`` aborts it when this is below that."""
    aborted: bool = False
    stopped_on: int | None = None
    """The stop token that finished the request (finish reason "stop"), if one did."""

    @property
    def done(self) -> bool:
        return self.stopped_on is not None or len(self.tokens) >= self.max_new_tokens

    @property
    def holds_pages(self) -> bool:
        return self.cache is not None

    def release(self) -> None:
        """Retract: free the KV; the next token recomputes it on the weights of then."""
        self.cache = None
        self.cache_version = None

    @torch.no_grad()
    def step(
        self, model: torch.nn.Module, version: str, prefixes: PrefixCache | None = None
    ) -> None:
        """Generate one token under ``version`` (prefilling first if the request holds no KV:
        its prompt's from the prefix cache where ``prefixes`` allows)."""
        if self.cache is None:
            ids, self.cache_version = [*self.prompt, *self.tokens], version
            if prefixes is not None and prefixes.on:
                ids = self._prompt_kv(model, version, prefixes)
        else:
            ids = self.tokens[-1:]
            if self.cache_version != version:
                self.kept_kv = True
        logits, self.cache = forward(model, ids, self.cache)
        early = len(self.tokens) < self.sampling.min_new_tokens
        banned = self.stop_tokens if early else frozenset()
        probs = self.sampling.probabilities(logits[0, -1], banned)  # sampled on CPU, any device
        generator = torch.Generator().manual_seed(self.seed + len(self.tokens))
        token = int(torch.multinomial(probs, 1, generator=generator))
        self.tokens.append(token)
        self.logprobs.append(float(torch.log(probs[token])))
        if not self.spans or self.spans[-1] != version:
            self.spans.append(version)
        if token in self.stop_tokens:
            self.stopped_on = token

    def _prompt_kv(self, model: torch.nn.Module, version: str, prefixes: PrefixCache) -> list[int]:
        """Fill ``cache`` with the prompt's KV but its last token, from the prefix cache or
        computed (and cached) now; the ids left to prefill."""
        rest = [*self.prompt[-1:], *self.tokens]
        hit = prefixes.lookup(self.prompt, version, self.extra_key)
        if hit is not None:
            self.cache = hit.cache
            self.cached_tokens += hit.tokens
            self.cached_versions.append(hit.version)
            return rest
        if len(self.prompt) < 2:
            return [*self.prompt, *self.tokens]
        _, self.cache = forward(model, self.prompt[:-1], None)
        prefixes.store(self.prompt, self.cache, version, self.extra_key)
        return rest


@torch.no_grad()
def health_token(model: torch.nn.Module) -> int:
    """One token of a throwaway request (SGLang's /health_generate)."""
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([[BOS, SEP]], device=device)).logits
    return int(logits[0, -1].argmax())
