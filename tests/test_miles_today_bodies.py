"""Today's miles' request bodies against our client's and our engine (issue 50, item 10).

Each miles body below is transcribed from radixark/miles, not from our client, and pinned:

- /generate: ``inference_rollout_common.compute_sampling_params`` and
  ``generate_and_rm_group`` (0100aa82), ``generate_endpoint_utils.compute_request_payload``
  (02aa8e78), with miles' defaults (``configs/rollout.py`` 3c07fcdd) and
  ``--sglang-enable-deterministic-inference`` (``sampling_seed``, which the testbed always
  sends); ``rid`` is the testbed's;
- /update_weights_from_tensor: ``SGLangApiClient.update_weights_from_tensor`` (05265435),
  ``weight_version`` included when there is one.

Under ``--miles-profile aug2026`` our client sends 31f1ca9's /generate body instead
(as tests/test_miles_client.py's MILES_SAMPLING). The CPU engine takes today's bodies, honours
``extra_key`` in its prefix cache, and still refuses a bad field with a 400 naming it.
"""

from __future__ import annotations

import asyncio
from copy import deepcopy
from typing import Any

import pytest

from backends.common.sglang import api
from backends.common.sglang.generate_body import generate_request

MILES_TODAY = "radixark/miles 0100aa82 (compute_sampling_params), 02aa8e78 (payload), 05265435"
ROLLOUT_DEFAULTS = {  # configs/rollout.py 3c07fcdd
    "rollout_temperature": 1.0,
    "rollout_top_p": 1.0,
    "rollout_top_k": -1,
    "rollout_stop": None,
    "rollout_stop_token_ids": None,
    "rollout_skip_special_tokens": False,
}


def miles_sampling_params(max_new_tokens: int) -> dict[str, Any]:
    """``compute_sampling_params`` (0100aa82) as ``GenerateState`` calls it."""
    a = ROLLOUT_DEFAULTS
    return dict(
        temperature=a["rollout_temperature"],
        top_p=a["rollout_top_p"],
        top_k=a["rollout_top_k"],
        max_new_tokens=max_new_tokens,
        stop=a["rollout_stop"],
        stop_token_ids=a["rollout_stop_token_ids"],
        skip_special_tokens=a["rollout_skip_special_tokens"],
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )


def miles_payload(
    input_ids: list[int],
    sampling_params: dict[str, Any],
    kv_cache_namespace: str | None,
    rollout_max_context_len: int | None,
) -> dict[str, Any] | None:
    """``compute_request_payload`` (02aa8e78): no routing or indexer replay, no LoRA, no
    images, no sampling mask (miles' defaults); None where the sample is TRUNCATED."""
    sampling_params = deepcopy(sampling_params)
    max_new_tokens = sampling_params.pop("max_new_tokens")
    if x := rollout_max_context_len:
        max_new_tokens = min(max_new_tokens, x - len(input_ids))
    if max_new_tokens <= 0:
        return None
    payload = {
        "input_ids": input_ids,
        "sampling_params": {**sampling_params, "max_new_tokens": max_new_tokens},
        "return_logprob": True,
        "return_routed_experts": False,
        "return_indexer_topk": False,
    }
    if kv_cache_namespace is not None:
        payload["extra_key"] = kv_cache_namespace
    return payload


@pytest.mark.parametrize("namespace", [None, "train:-:7"])
@pytest.mark.parametrize("context", [None, 64, 8])
def test_our_generate_body_is_miles_todays_field_for_field(
    namespace: str | None, context: int | None
) -> None:
    prompt, seed = [1, 5, 9, 2], 1234
    params = miles_sampling_params(2048)
    params["sampling_seed"] = seed  # generate_and_rm_group, deterministic inference
    theirs = miles_payload(prompt, params, namespace, context)
    ours = generate_request(
        today=True,
        rid="g0-s0",
        input_ids=prompt,
        max_new_tokens=2048,
        seed=seed,
        kv_namespace=namespace,
        max_context_len=context,
    )
    if theirs is None:
        assert ours is None
        return
    assert ours is not None
    body = api.body(ours)
    assert body.pop("rid") == "g0-s0"  # the testbed's own, to abort the request by
    assert body == theirs
    assert list(body["sampling_params"]) == list(theirs["sampling_params"])


def test_under_aug2026_our_generate_body_is_31f1ca9s() -> None:
    """31f1ca9: ``GenerateState.__init__``'s params (skip_special_tokens True) and the payload
    ``{sampling_params, return_logprob, input_ids}``: no replay flags, no extra_key."""
    ours = generate_request(
        today=False, rid="r", input_ids=[1, 2], max_new_tokens=40, seed=3, kv_namespace=None
    )
    assert ours is not None
    body = api.body(ours)
    expected = {  # rollout/sglang_rollout.py GenerateState.__init__ (31f1ca9): its defaults
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 40,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": True,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
        "sampling_seed": 3,
    }
    assert body == {
        "rid": "r",
        "input_ids": [1, 2],
        "sampling_params": expected,
        "return_logprob": True,
    }


def test_update_weights_from_tensor_carries_weight_version_as_miles_sends_it() -> None:
    """``SGLangApiClient.update_weights_from_tensor`` (05265435), as the colocated path calls
    it (load_format flattened_bucket): weight_version only when there is one."""

    def miles(handles: list[str], weight_version: str | None) -> dict[str, Any]:
        payload = {
            "serialized_named_tensors": handles,
            "load_format": "flattened_bucket",
            "flush_cache": False,
            "selector": "all",
        }
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return payload

    for version in ("3", None):
        ours = api.UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=["h"], weight_version=api.OMIT if version is None else version
        )
        assert api.body(ours) == miles(["h"], version)
    assert api.MILES_SENDS["/update_weights_from_tensor"] == set(miles(["h"], "3"))


# -- the engine takes them ---------------------------------------------------------------------

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")


def _with_engine(body: Any, prefix_cache: str = "shared") -> None:
    import aiohttp

    from backends.common.engine.server import EngineServer
    from backends.common.training.policy import PolicyConfig

    async def main() -> None:
        server = EngineServer("today", PolicyConfig(), token_seconds=0.0, prefix_cache=prefix_cache)
        port = await server.start()
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
                await body(http, f"http://127.0.0.1:{port}/generate")
        finally:
            await server.stop()

    asyncio.run(main())


def _body(rid: str, namespace: str | None, **extra: Any) -> dict[str, Any]:
    from backends.common.training.policy import BOS, SEP

    request = generate_request(
        today=True, rid=rid, input_ids=[BOS, 3, 1, 4, 1, SEP], max_new_tokens=4, seed=1,
        kv_namespace=namespace,
    )  # fmt: skip
    assert request is not None
    return {**api.body(request), **extra}


def test_the_engine_takes_todays_body_and_keys_its_prefix_cache_by_extra_key() -> None:
    async def body(http: Any, url: str) -> None:
        async def cached(payload: dict[str, Any]) -> int:
            async with http.post(url, json=payload) as reply:
                assert reply.status == 200, await reply.text()
                return (await reply.json())["meta_info"]["cached_tokens"]

        assert await cached(_body("a", "train:-:0")) == 0
        assert await cached(_body("b", "train:-:0")) > 0  # same namespace: reused
        assert await cached(_body("c", "train:-:1")) == 0  # the next train call's: not
        assert await cached(_body("d", None)) == 0  # no namespace is a namespace of its own

    _with_engine(body)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"extra_key": 5}, "extra_key"),
        ({"return_routed_experts": True}, "return_routed_experts"),
        ({"return_indexer_topk": True}, "return_indexer_topk"),
        ({"return_logprob": "yes"}, "return_logprob"),
    ],
)
def test_the_engine_still_refuses_a_bad_field_naming_it(extra: dict[str, Any], field: str) -> None:
    async def body(http: Any, url: str) -> None:
        async with http.post(url, json=_body("x", "train:-:0", **extra)) as reply:
            assert reply.status == 400
            assert (await reply.text()).find(field) >= 0

    _with_engine(body, prefix_cache="off")
