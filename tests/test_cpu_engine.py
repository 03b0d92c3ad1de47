"""The CPU engine keeps SGLang's semantics where the control plane depends on them, over HTTP.

Each test runs one EngineServer on loopback in this process (no Ray) and drives
it as miles does: a request in flight, a pause with a mode, new weights loaded,
the version set, generation continued. Expected tokens come from decoding.py run
by hand on the same weights, so "continued on the new weights with its KV
recomputed" is checked token for token, not assumed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import torch

pytest.importorskip("ray", reason="the CPU backend needs the cpu extra (see the README)")

from backends.common.engine.decoding import Decoding
from backends.common.engine.server import EngineServer
from backends.common.training.policy import BOS, SEP, PolicyConfig, build_model

PROMPT = [BOS, 3, 1, 4, SEP]
MAX_NEW = 8
SEED = 11
TOKEN_SECONDS = 0.05
"""Each request lives 0.4 s: long enough for the pause to land mid-request."""


class Engine:
    """A running EngineServer and an HTTP session to it."""

    def __init__(self, server: EngineServer, port: int, http: aiohttp.ClientSession) -> None:
        self.server = server
        self.url = f"http://127.0.0.1:{port}"
        self.http = http

    async def post(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        async with self.http.post(self.url + path, json=body or {}) as reply:
            text = await reply.text()
            return reply.status, text

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path) as reply:
            return reply.status, await reply.text()

    async def generate(self) -> dict[str, Any]:
        body = {
            "rid": "r0",
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": MAX_NEW, "sampling_seed": SEED},
        }
        async with self.http.post(self.url + "/generate", json=body) as reply:
            assert reply.status == 200
            return await reply.json()

    async def tokens_done(self, rid: str, at_least: int) -> int:
        """Wait until the request has generated ``at_least`` tokens; how many it has."""
        for _ in range(1000):
            job = self.server._jobs.get(rid)
            if job is not None and len(job.tokens) >= at_least:
                return len(job.tokens)
            await asyncio.sleep(TOKEN_SECONDS / 10)
        raise AssertionError(f"request {rid} never reached {at_least} tokens")

    async def set_version(self, version: str, **extra: Any) -> None:
        status, _ = await self.post("/update_weight_version", {"new_version": version, **extra})
        assert status == 200


def engine_test(body: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """A test whose first argument is a fresh engine on loopback (stopped after); the rest
    are its parameters, as pytest sees them."""

    @functools.wraps(body)
    def test(**params: Any) -> None:
        async def main() -> None:
            server = EngineServer("engine-0", PolicyConfig(), token_seconds=TOKEN_SECONDS)
            port = await server.start()
            try:
                timeout = aiohttp.ClientTimeout(total=30)
                async with aiohttp.ClientSession(timeout=timeout) as http:
                    await body(Engine(server, port, http), **params)
            finally:
                await server.stop()

        asyncio.run(main())

    signature = inspect.signature(body)
    test.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=list(signature.parameters.values())[1:]
    )
    return test


def _perturb(model: torch.nn.Module) -> None:
    """New weights, as a bucket load would leave them."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))


def _expected(k: int, mode: str) -> Decoding:
    """The request decoded by hand: k tokens on the initial weights, the rest on new ones,
    its KV released in between under retract, kept under in_place."""
    model = build_model(PolicyConfig())
    job = Decoding("r0", PROMPT, MAX_NEW, SEED)
    for _ in range(k):
        job.step(model, "1")
    if mode == "retract":
        job.release()
    _perturb(model)
    while not job.done:
        job.step(model, "2")
    return job


async def _update_mid_request(engine: Engine, mode: str) -> tuple[dict[str, Any], int]:
    """miles' sequence around one in-flight request; its response and tokens before the pause."""
    await engine.set_version("1", abort_all_requests=False)
    request = asyncio.ensure_future(engine.generate())
    k = await engine.tokens_done("r0", 2)
    assert (await engine.post("/pause_generation", {"mode": mode}))[0] == 200
    if mode != "in_place":
        assert (await engine.get("/flush_cache"))[0] == 200
    _perturb(engine.server.model)
    await engine.set_version("2", abort_all_requests=False)
    assert (await engine.post("/continue_generation"))[0] == 200
    return await request, k


@pytest.mark.parametrize("mode", ["retract", "in_place"])
@engine_test
async def test_a_paused_request_continues_on_the_new_weights(engine: Engine, mode: str) -> None:
    reply, k = await _update_mid_request(engine, mode)
    meta = reply["meta_info"]
    assert meta["finish_reason"]["type"] == "length"  # not aborted
    assert meta["weight_versions"] == ["1", "2"] and meta["weight_version"] == "2"
    expected = _expected(k, mode)
    assert reply["output_ids"] == expected.tokens  # token for token...
    assert [lp for lp, _, _ in meta["output_token_logprobs"]] == expected.logprobs  # ...bitwise
    # retract recomputed the KV on the new weights; in_place attended to the old KV, which
    # gives other probabilities for the tokens after the update
    assert meta["testbed_kept_kv"] is (mode == "in_place") is expected.kept_kv
    other = _expected(k, "in_place" if mode == "retract" else "retract")
    assert other.logprobs[:k] == expected.logprobs[:k]
    assert other.logprobs[k + 1 :] != expected.logprobs[k + 1 :]


@engine_test
async def test_abort_mode_ends_the_request_in_flight(engine: Engine) -> None:
    request = asyncio.ensure_future(engine.generate())
    await engine.tokens_done("r0", 2)
    await engine.post("/pause_generation", {"mode": "abort"})
    meta = (await request)["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["completion_tokens"] < MAX_NEW


@pytest.mark.parametrize(("body", "aborted"), [({}, True), ({"abort_all_requests": False}, False)])
@engine_test
async def test_a_version_update_aborts_everything_unless_told_not_to(
    engine: Engine, body: dict[str, Any], aborted: bool
) -> None:
    """SGLang's UpdateWeightVersionReqInput.abort_all_requests defaults to true."""
    request = asyncio.ensure_future(engine.generate())
    await engine.tokens_done("r0", 2)
    await engine.post("/pause_generation", {"mode": "retract"})
    await engine.set_version("1", **body)
    await engine.post("/continue_generation")
    meta = (await request)["meta_info"]
    assert (meta["finish_reason"]["type"] == "abort") is aborted


@pytest.mark.parametrize(("mode", "refused"), [("retract", False), ("in_place", True)])
@engine_test
async def test_flush_cache_is_refused_while_a_request_holds_kv(
    engine: Engine, mode: str, refused: bool
) -> None:
    """A frozen (in_place) request holds its pages, a retracted one none (miles #1497)."""
    request = asyncio.ensure_future(engine.generate())
    await engine.tokens_done("r0", 2)
    await engine.post("/pause_generation", {"mode": mode})
    status, text = await engine.get("/flush_cache")
    assert (status == 400) is refused, text
    if refused:
        assert "hold KV pages" in text
    await engine.post("/continue_generation")
    await request
    assert (await engine.get("/flush_cache"))[0] == 200  # nothing in flight: flushed


@engine_test
async def test_new_requests_wait_while_paused(engine: Engine) -> None:
    await engine.post("/pause_generation", {"mode": "retract"})
    request = asyncio.ensure_future(engine.generate())
    for _ in range(200):
        await asyncio.sleep(0)
    assert not request.done() and len(engine.server._jobs["r0"].tokens) == 0
    await engine.post("/continue_generation")
    assert (await request)["meta_info"]["completion_tokens"] == MAX_NEW


@engine_test
async def test_the_version_is_read_where_sglang_reports_it(engine: Engine) -> None:
    await engine.set_version("7", abort_all_requests=False)
    status, text = await engine.get("/model_info")
    assert status == 200 and json.loads(text)["weight_version"] == "7"
    assert (await engine.get("/get_weight_version"))[0] == 404  # not an SGLang route


@engine_test
async def test_an_unknown_pause_mode_is_refused(engine: Engine) -> None:
    status, text = await engine.post("/pause_generation", {"mode": "freeze"})
    assert status == 400 and "freeze" in text and "in_place" in text


@engine_test
async def test_a_hung_engine_answers_nothing_not_even_health(engine: Engine) -> None:
    assert (await engine.get("/health_generate"))[0] == 200
    engine.server.hang()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(engine.get("/health_generate"), timeout=0.5)
