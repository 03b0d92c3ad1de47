"""The /generate body our client sends, as miles builds it, per ``--miles-profile``.

- ``aug2026`` (radixark/miles at 31f1ca9): ``rollout/sglang_rollout.py``
  ``GenerateState.__init__``'s sampling params (``skip_special_tokens`` True there) and
  ``generate``'s payload ``{input_ids, sampling_params, return_logprob: true}``.
- ``today``: ``inference_rollout_common.compute_sampling_params`` (0100aa82):
  ``temperature, top_p, top_k, max_new_tokens, stop, stop_token_ids, skip_special_tokens,
  no_stop_trim: true, spaces_between_special_tokens: false`` with miles' defaults
  (``configs/rollout.py`` 3c07fcdd: temperature 1.0, top_p 1.0, top_k -1,
  ``--rollout-skip-special-tokens`` off); then ``generate_endpoint_utils.compute_request_payload``
  (02aa8e78): ``max_new_tokens`` clipped to ``--rollout-max-context-len`` less the prompt
  (none left: the sample is TRUNCATED and nothing is sent), ``return_logprob: true``,
  ``return_routed_experts`` (``--use-rollout-routing-replay``, off),
  ``return_indexer_topk`` (``--use-rollout-indexer-replay``, off), and ``extra_key`` with
  the sample's prefix-cache namespace under ``--namespaced-radix-cache``.

Under both, ``sampling_seed`` goes with every request: the testbed runs as miles does under
``--sglang-enable-deterministic-inference`` (``generate_and_rm_group``), so that a run
replays. ``rid`` is the testbed's (it finds its request to abort it).
"""

from __future__ import annotations

from typing import Any, Final

from backends.common.sglang.api import OMIT, GenerateReqInput

AUG2026_SAMPLING: Final[dict[str, Any]] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "stop": None,
    "stop_token_ids": None,
    "skip_special_tokens": True,
    "no_stop_trim": True,
    "spaces_between_special_tokens": False,
}
"""31f1ca9's sampling params, ``max_new_tokens`` aside (sglang_rollout.py ``GenerateState``)."""

TODAY_SAMPLING: Final[dict[str, Any]] = {
    **AUG2026_SAMPLING,
    "skip_special_tokens": False,
}
"""``compute_sampling_params`` with miles' defaults today (``--rollout-skip-special-tokens``
is off by default in configs/rollout.py 3c07fcdd)."""


def generate_request(
    *,
    today: bool,
    rid: str,
    input_ids: list[int],
    max_new_tokens: int,
    seed: int,
    kv_namespace: str | None = None,
    max_context_len: int | None = None,
    start_weight_version: int | None = None,
) -> GenerateReqInput | None:
    """The request miles would send for this sample, or None where today's miles sends none
    (``max_new_tokens`` clipped to nothing by ``max_context_len``: TRUNCATED)."""
    if not today:
        sampling = {**AUG2026_SAMPLING, "max_new_tokens": max_new_tokens, "sampling_seed": seed}
        return GenerateReqInput(
            rid=rid,
            input_ids=input_ids,
            sampling_params=sampling,
            start_weight_version=OMIT if start_weight_version is None else start_weight_version,
        )
    if max_context_len is not None:  # miles' --rollout-max-context-len (unset by default)
        max_new_tokens = min(max_new_tokens, max_context_len - len(input_ids))
        if max_new_tokens <= 0:
            return None
    # in miles' order: the seed added per sample, max_new_tokens popped and put back last
    sampling = {**TODAY_SAMPLING, "sampling_seed": seed, "max_new_tokens": max_new_tokens}
    return GenerateReqInput(
        rid=rid,
        input_ids=input_ids,
        sampling_params=sampling,
        return_logprob=True,
        return_routed_experts=False,
        return_indexer_topk=False,
        extra_key=OMIT if kv_namespace is None else kv_namespace,
        start_weight_version=OMIT if start_weight_version is None else start_weight_version,
    )
