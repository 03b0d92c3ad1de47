"""An inference engine as a Ray actor serving SGLang's HTTP worker API for what RL uses.

Endpoint names and payloads follow SGLang (python/sglang/srt/entrypoints/
http_server.py, managers/io_struct.py): /generate (meta_info with
weight_version and finish_reason), /pause_generation, /continue_generation,
/abort_request, /health, /init_weights_update_group,
/update_weights_from_distributed (load_format "flattened_bucket": one uint8
buffer laid out by miles_core's staging spans), /destroy_weights_update_group,
/update_weight_version, /get_weight_version. One addition, named as such:
/testbed/weights_checksum, so the oracles can compare weights bitwise.

Generation samples the same tiny policy token by token on the actor's event
loop (microseconds per token on CPU), checking between tokens whether it was
paused or aborted. A receive blocks in a worker thread, so the server keeps
answering while weights stream in. The fault hook ``X-Testbed-Die-Midway``
makes the process exit halfway through that request (a mid-generation crash).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import ray
from aiohttp import web

from backends.common.ray_session import LOOPBACK
from backends.cpu.policy import PolicyConfig, build_model, checksum, sample
from backends.cpu.wire import BucketViews, broadcast, gloo_group

DIE_MIDWAY = "X-Testbed-Die-Midway"


def _logprob_triples(logprobs: list[float], tokens: list[int]) -> list[list[Any]]:
    """SGLang's output_token_logprobs: [logprob, token_id, text] (no text here)."""
    return [[lp, t, None] for lp, t in zip(logprobs, tokens, strict=True)]


def _ok(**extra: Any) -> web.Response:
    return web.json_response({"success": True, "message": "", **extra})


class EngineServer:
    def __init__(self, engine_id: str, policy: PolicyConfig) -> None:
        self.engine_id = engine_id
        self.model = build_model(policy)
        self._views = BucketViews(self.model)
        self.weight_version = "default"  # SGLang's value before any update
        self.paused = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._aborted: set[str] = set()
        self._in_flight: set[str] = set()
        self._groups: dict[str, Any] = {}
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/health", self.health),
                web.post("/generate", self.generate),
                web.post("/pause_generation", self.pause_generation),
                web.post("/continue_generation", self.continue_generation),
                web.post("/abort_request", self.abort_request),
                web.post("/init_weights_update_group", self.init_weights_update_group),
                web.post("/update_weights_from_distributed", self.update_weights_from_distributed),
                web.post("/destroy_weights_update_group", self.destroy_weights_update_group),
                web.post("/update_weight_version", self.update_weight_version),
                web.get("/get_weight_version", self.get_weight_version),
                web.get("/testbed/weights_checksum", self.weights_checksum),
            ]
        )
        return app

    async def start(self) -> int:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- generation ----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        params = body.get("sampling_params", {})
        rid = str(body.get("rid") or id(body))
        prompt = [int(t) for t in body["input_ids"]]
        max_new = int(params.get("max_new_tokens", 4))
        seed = int(params.get("sampling_seed", 0))
        die_midway = request.headers.get(DIE_MIDWAY) == "1"
        created = time.monotonic()
        await self._resumed.wait()  # a paused engine holds new requests until continue
        self._in_flight.add(rid)
        tokens: list[int] = []
        logprobs: list[float] = []
        version = self.weight_version
        finish = {"type": "length", "length": max_new}
        try:
            for i in range(max_new):
                if rid in self._aborted:
                    finish = {"type": "abort", "message": "aborted"}
                    break
                if die_midway and i == max_new // 2:
                    os._exit(1)
                step_tokens, step_logprobs = sample(self.model, prompt + tokens, 1, seed + i)
                tokens += step_tokens
                logprobs += step_logprobs
                await asyncio.sleep(0)  # let pause/abort requests in between tokens
        finally:
            self._in_flight.discard(rid)
            self._aborted.discard(rid)
        meta = {
            "id": rid,
            "finish_reason": finish,
            "weight_version": version,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(tokens),
            "e2e_latency": time.monotonic() - created,  # SGLang's: arrival to finish, seconds
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(logprobs, tokens, strict=True)
            ],
        }
        return web.json_response({"text": "", "output_ids": tokens, "meta_info": meta})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """mode 'abort' (miles' choice): in-flight requests end with finish_reason abort."""
        body = await request.json() if request.can_read_body else {}
        self.paused = True
        self._resumed.clear()
        if body.get("mode", "abort") == "abort":
            self._aborted |= self._in_flight
        return _ok()

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.paused = False
        self._resumed.set()
        return _ok()

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("abort_all"):
            self._aborted |= self._in_flight
        elif body.get("rid") in self._in_flight:
            self._aborted.add(body["rid"])
        return _ok()

    # -- weights ---------------------------------------------------------------------

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("backend", "gloo") != "gloo":
            return web.json_response(
                {"success": False, "message": "the CPU engine speaks gloo only"}, status=400
            )
        store = (body["master_address"], int(body["master_port"]))
        rank, world = int(body["rank_offset"]), int(body["world_size"])
        name = body.get("group_name", "weight_update_group")
        loop = asyncio.get_running_loop()
        self._groups[name] = await loop.run_in_executor(None, gloo_group, store, name, rank, world)
        return _ok()

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body.get("group_name", "weight_update_group")
        if body.get("load_format") != "flattened_bucket":
            return web.json_response(
                {"success": False, "message": "send load_format 'flattened_bucket'"}, status=400
            )
        try:
            # the weights themselves are the receive buffer (wire.BucketViews): no unpack
            buffer = self._views.buffer_for(body["names"], body["dtypes"], body["shapes"])
        except ValueError as error:
            return web.json_response({"success": False, "message": str(error)[:200]}, status=400)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, broadcast, self._groups[name], buffer)
        except (RuntimeError, KeyError) as error:
            return web.json_response({"success": False, "message": str(error)[:200]}, status=500)
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return _ok()

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._groups.pop(body.get("group_name", "weight_update_group"), None)
        return _ok()

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("abort_all_requests"):
            self._aborted |= self._in_flight
        self.weight_version = str(body["new_version"])
        return _ok()

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def weights_checksum(self, request: web.Request) -> web.Response:
        return web.json_response({"checksum": checksum(self.model)})


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts one EngineServer; ``start`` gives its port on loopback."""

    def __init__(self, engine_id: str, policy: PolicyConfig) -> None:
        self.server = EngineServer(engine_id, policy)

    async def start(self) -> int:
        return await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def wait_forever(self) -> None:
        """Never returns: a call left pending here fails when the actor dies, which is how
        the world learns of an engine's death without waiting for a request to fail."""
        await asyncio.Event().wait()
