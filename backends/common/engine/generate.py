"""SGLang's /generate as the CPU engine honours it: the body checked, the response built.

What miles sends (miles/rollout/sglang_rollout.py: ``GenerateState.__init__``'s
``sampling_params`` and ``generate``'s payload): ``input_ids``, ``return_logprob``
and sampling parameters ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``
(``--rollout-max-response-len``: thousands), ``stop``, ``stop_token_ids``,
``skip_special_tokens``, ``no_stop_trim``, ``spaces_between_special_tokens``, and
``sampling_seed`` under deterministic inference. What it reads back
(``generate``, ``Sample.update_from_meta_info`` in miles/utils/types.py):
``text``, ``meta_info.output_token_logprobs`` (token ids and logprobs),
``finish_reason.type`` (``length`` marks the sample truncated, ``stop`` completed,
``abort`` aborted), ``weight_version``, ``prompt_tokens``, ``completion_tokens``,
``cached_tokens`` and ``e2e_latency``.

SGLang's rules kept here (sampling/sampling_params.py ``SamplingParams``:
field names, defaults, ``verify``; managers/tokenizer_manager.py
``_validate_one_request``: a prompt at or over the context length, or prompt plus
``max_new_tokens`` over it, is refused). A sampling parameter this engine cannot
honour (grammars, penalties, beams, stop strings: it has no tokenizer) is refused
with a 400 naming it, unless it has SGLang's default; a name SGLang does not know
is refused too (SGLang builds ``SamplingParams(**sampling_params)``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from backends.common.engine.decoding import Decoding, Sampling
from backends.common.engine.requests import UNHONOURED_GENERATE, BadRequest

FIELD: Final = "sampling_params"

TEXT_ONLY: Final = frozenset(
    {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"}
)
"""Parameters that shape the text or the streaming only: accepted (this engine's text is
empty and it does not stream), checked for their type."""

UNSUPPORTED: Final[Mapping[str, Any]] = {
    "stop": None,
    "stop_regex": None,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "n": 1,
    "beam_width": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
    "watermark": None,
}
"""Parameters this engine cannot honour, each with the SGLang default it accepts."""

HONOURED: Final = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "min_new_tokens",
        "stop_token_ids",
        "ignore_eos",
        "logit_bias",
        "sampling_seed",
    }
)

UNSUPPORTED_TOP: Final[Mapping[str, Any]] = {
    "lora_path": None,
    "image_data": None,
    "audio_data": None,
    "return_routed_experts": False,
    "return_indexer_topk": False,
    "top_logprobs_num": None,
    "stream": False,
}
assert set(UNSUPPORTED_TOP) == set(UNHONOURED_GENERATE)
"""Top-level /generate fields miles may send that this engine cannot honour, with the value
it accepts (miles sends ``lora_path`` with LoRA rollouts, ``return_routed_experts`` with
routing replay, ``top_logprobs_num`` with on-policy distillation)."""


def _number(name: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise BadRequest(f"{FIELD}.{name}", f"a number in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def _integer(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{FIELD}.{name}", f"an integer in [{low}, {high}], got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{FIELD}.{name}", f"true or false, got {json.dumps(value)[:40]}")
    return value


def _tokens(name: str, value: Any, vocab: int) -> frozenset[int]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or len(value) > vocab:
        raise BadRequest(f"{FIELD}.{name}", f"a list of at most {vocab} token ids")
    return frozenset(_integer(f"{name}[{i}]", t, 0, vocab - 1) for i, t in enumerate(value))


def _bias(value: Any, vocab: int) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > vocab:
        raise BadRequest(f"{FIELD}.logit_bias", "an object of token id -> bias")
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocab):
            raise BadRequest(f"{FIELD}.logit_bias", f"{key!r} is no token id below {vocab}")
        out.append((int(key), _number(f"logit_bias.{key}", bias, -1e4, 1e4)))
    return tuple(sorted(out))


def _unsupported(params: Mapping[str, Any]) -> None:
    for name, value in params.items():
        if name in UNSUPPORTED:
            if value is not None and value != UNSUPPORTED[name]:
                raise BadRequest(
                    f"{FIELD}.{name}",
                    f"this engine cannot honour {value!r} (no tokenizer, grammar, penalty or "
                    f"beam search): leave it out or send {UNSUPPORTED[name]!r}",
                )
        elif name in TEXT_ONLY:
            if value is not None and not (name == "stream_interval" or isinstance(value, bool)):
                raise BadRequest(f"{FIELD}.{name}", f"true or false, got {value!r}")
        elif name not in HONOURED:
            raise BadRequest(f"{FIELD}.{name}", "not a sampling parameter SGLang knows")


def sampling_of(
    params: Mapping[str, Any], prompt_len: int, context_len: int, vocab: int
) -> Sampling:
    """The checked sampling parameters (SGLang's defaults where absent or null)."""
    _unsupported(params)
    get = {k: v for k, v in params.items() if v is not None}.get
    if prompt_len >= context_len:
        raise BadRequest(
            "input_ids",
            f"the input ({prompt_len} tokens) is longer than the model's context length "
            f"({context_len} tokens)",
        )
    room = context_len - prompt_len
    max_new = _integer("max_new_tokens", get("max_new_tokens", 128), 0, 2**31)
    if max_new > room:
        raise BadRequest(
            f"{FIELD}.max_new_tokens",
            f"requested token count exceeds the model's maximum context length of "
            f"{context_len} tokens: {prompt_len} from the input and {max_new} for the "
            f"completion; ask for at most {room}",
        )
    min_new = _integer("min_new_tokens", get("min_new_tokens", 0), 0, max_new)
    top_k = get("top_k", -1)
    if top_k != -1:
        top_k = _integer("top_k", top_k, 1, 2**31)
    return Sampling(
        max_new_tokens=max_new,
        temperature=_number("temperature", get("temperature", 1.0), 0.0, 1e6),
        top_p=_number("top_p", get("top_p", 1.0), 0.0, 1.0, low_open=True),
        top_k=top_k,
        min_p=_number("min_p", get("min_p", 0.0), 0.0, 1.0),
        min_new_tokens=min_new,
        stop_token_ids=_tokens("stop_token_ids", get("stop_token_ids"), vocab),
        logit_bias=_bias(get("logit_bias"), vocab),
    )


def refuse_unsupported_fields(body: Mapping[str, Any]) -> None:
    """A top-level field this engine cannot honour is refused before anything runs."""
    for name, accepted in UNSUPPORTED_TOP.items():
        value = body.get(name)
        if value is not None and value != accepted:
            raise BadRequest(name, f"this engine cannot honour {value!r}: leave it out")


def stop_tokens(sampling: Sampling, params: Mapping[str, Any], eos: int | None) -> frozenset[int]:
    """What finishes a request early: its stop_token_ids, and the EOS unless ``ignore_eos``."""
    ignore_eos = params.get("ignore_eos")
    if ignore_eos is not None:
        _flag("ignore_eos", ignore_eos)
    tokens = set(sampling.stop_token_ids)
    if eos is not None and not ignore_eos:
        tokens.add(eos)
    return frozenset(tokens)


def finish_reason(job: Decoding) -> dict[str, Any]:
    """SGLang's finish_reason (managers/schedule_batch.py: FINISH_ABORT, FINISH_MATCHED_TOKEN,
    FINISH_LENGTH ``to_json``)."""
    if job.aborted:
        return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    if job.stopped_on is not None:
        return {"type": "stop", "matched": job.stopped_on}
    return {"type": "length", "length": job.max_new_tokens}


def job_of(body: Mapping[str, Any], config: Any, context_len: int) -> Decoding:
    """A checked /generate body as a decoding job, for a model of this HF ``config``."""
    refuse_unsupported_fields(body)
    vocab = config.vocab_size
    prompt = body["input_ids"]
    if not prompt or max(prompt) >= vocab:
        raise BadRequest("input_ids", f"one or more token ids, each below the vocab {vocab}")
    params = body["sampling_params"]
    sampling = sampling_of(params, len(prompt), context_len, vocab)
    seed = params.get("sampling_seed")
    seed = 0 if seed is None else seed
    top = 2**63 - 1 - context_len  # token i samples under seed + i (decoding.py)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= top:
        raise BadRequest(f"{FIELD}.sampling_seed", f"an integer in [0, {top}]")
    eos = config.eos_token_id
    return Decoding(
        extra_key=body["extra_key"],
        start_weight_version=body["start_weight_version"],
        rid=body["rid"] or str(id(body)),
        prompt=prompt,
        max_new_tokens=sampling.max_new_tokens,
        seed=seed,
        sampling=sampling,
        stop_tokens=stop_tokens(sampling, params, eos if isinstance(eos, int) else None),
    )
