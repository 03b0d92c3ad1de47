"""An inference engine as a Ray actor serving SGLang's HTTP worker API for what RL uses.

Endpoint names and payloads follow SGLang (python/sglang/srt/entrypoints/
http_server.py, managers/io_struct.py): /generate (meta_info with
weight_version and finish_reason), /pause_generation (mode abort, retract or
in_place), /continue_generation, /abort_request, /flush_cache, /health,
/health_generate, /begin_weight_update, /end_weight_update,
/init_weights_update_group, /update_weights_from_distributed (load_format
"flattened_bucket": one uint8 buffer laid out by miles_core's staging spans),
/destroy_weights_update_group, /update_weight_version, /model_info (where SGLang
reports weight_version; it has no /get_weight_version).
meta_info also carries ``weight_versions`` (the version of each span of the
response) and, named as the testbed's own, ``testbed_kept_kv``; so does
/testbed/weights_checksum, so the oracles can compare weights bitwise.

SGLang's behaviour where the control plane depends on it: a pause with mode
``abort`` ends the requests in flight (finish_reason abort), ``retract``
frees their KV and requeues them, ``in_place`` freezes them on their KV (see
decoding.py); new requests wait while paused; /update_weight_version aborts
every request in flight unless the body says ``abort_all_requests: false``;
/flush_cache answers 400 while a request holds KV pages.

Generation runs the tiny policy token by token on the actor's event loop,
yielding between tokens, so a pause or abort lands on a token boundary. A
receive blocks in a worker thread, so the server keeps answering while weights
stream in. Fault hooks: the header ``X-Testbed-Die-Midway`` makes the process
exit halfway through that request (a mid-generation crash); the actor's
``hang`` makes it stop answering anything while staying alive.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from aiohttp import web

from backends.common.decoding import Decoding, health_token
from backends.common.policy import PolicyConfig, build_model, checksum
from backends.common.ray_session import LOOPBACK
from backends.common.wire import BucketViews, broadcast, gloo_group

DIE_MIDWAY = "X-Testbed-Die-Midway"
PAUSE_MODES = ("abort", "retract", "in_place")


def _ok(**extra: Any) -> web.Response:
    return web.json_response({"success": True, "message": "", **extra})


def _refused(message: str, status: int = 400) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=status)


async def _forever() -> None:
    await asyncio.Event().wait()


class EngineServer:
    def __init__(self, engine_id: str, policy: PolicyConfig, token_seconds: float = 0.0) -> None:
        """``token_seconds``: a floor on each token's time (a real engine's decode time; the
        tiny policy takes about a millisecond), so requests live long enough to be paused."""
        self.engine_id = engine_id
        self.token_seconds = token_seconds
        self.model = build_model(policy)
        self._views = BucketViews(self.model)
        self.weight_version = "default"  # SGLang's value before any update
        self.paused = False
        self.hung = False
        self._jobs: dict[str, Decoding] = {}
        self._changed = asyncio.Event()
        """Set (and replaced) whenever pause, abort or hang state changes: waiters re-check."""
        self._groups: dict[str, Any] = {}
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._unless_hung])
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/health_generate", self.health_generate),
                web.post("/generate", self.generate),
                web.post("/pause_generation", self.pause_generation),
                web.post("/continue_generation", self.continue_generation),
                web.post("/abort_request", self.abort_request),
                web.route("*", "/flush_cache", self.flush_cache),
                web.post("/begin_weight_update", self.begin_weight_update),
                web.post("/end_weight_update", self.end_weight_update),
                web.post("/init_weights_update_group", self.init_weights_update_group),
                web.post("/update_weights_from_distributed", self.update_weights_from_distributed),
                web.post("/destroy_weights_update_group", self.destroy_weights_update_group),
                web.post("/update_weight_version", self.update_weight_version),
                web.get("/model_info", self.model_info),
                web.get("/testbed/weights_checksum", self.weights_checksum),
            ]
        )
        return app

    @web.middleware
    async def _unless_hung(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A hung engine accepts connections and never answers (the client times out)."""
        if self.hung:
            await _forever()
        return await handler(request)

    async def start(self) -> int:
        # stopping waits at most a second for handlers still running (a hung engine's never end)
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def hang(self) -> None:
        self.hung = True
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _abort_all(self) -> None:
        for job in self._jobs.values():
            job.aborted = True
        self._notify()

    # -- generation ----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        health_token(self.model)
        return web.Response(text="")

    async def _may_go_on(self, job: Decoding) -> bool:
        """Wait while paused (queued, retracted or frozen) or hung; False once aborted."""
        while (self.paused or self.hung) and not job.aborted:
            await self._changed.wait()
        return not job.aborted

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        params = body.get("sampling_params", {})
        job = Decoding(
            rid=str(body.get("rid") or id(body)),
            prompt=[int(t) for t in body["input_ids"]],
            max_new_tokens=int(params.get("max_new_tokens", 4)),
            seed=int(params.get("sampling_seed", 0)),
        )
        die_midway = request.headers.get(DIE_MIDWAY) == "1"
        created = time.monotonic()
        self._jobs[job.rid] = job
        try:
            while not job.done and await self._may_go_on(job):
                if die_midway and len(job.tokens) == job.max_new_tokens // 2:
                    os._exit(1)
                job.step(self.model, self.weight_version)
                await asyncio.sleep(self.token_seconds)  # pause/abort land between tokens
        finally:
            self._jobs.pop(job.rid, None)
        finish = (
            {"type": "abort", "message": "aborted"}
            if job.aborted
            else {"type": "length", "length": job.max_new_tokens}
        )
        meta = {
            "id": job.rid,
            "finish_reason": finish,
            "weight_version": self.weight_version,
            "weight_versions": job.spans,
            "testbed_kept_kv": job.kept_kv,
            "prompt_tokens": len(job.prompt),
            "completion_tokens": len(job.tokens),
            "e2e_latency": time.monotonic() - created,  # SGLang's: arrival to finish, seconds
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(job.logprobs, job.tokens, strict=True)
            ],
        }
        return web.json_response({"text": "", "output_ids": job.tokens, "meta_info": meta})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's default mode is abort; miles sends its --pause-generation-mode."""
        body = await request.json() if request.can_read_body else {}
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            return _refused(f"mode must be one of {list(PAUSE_MODES)}, got {mode!r}")
        self.paused = True
        for job in self._jobs.values():
            if mode == "abort":
                job.aborted = True
            elif mode == "retract":
                job.release()
        self._notify()
        return _ok()

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.paused = False
        self._notify()
        return _ok()

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("abort_all"):
            self._abort_all()
        elif body.get("rid") in self._jobs:
            self._jobs[body["rid"]].aborted = True
            self._notify()
        return _ok()

    async def flush_cache(self, request: web.Request) -> web.Response:
        holding = sum(job.holds_pages for job in self._jobs.values())
        if holding:
            return _refused(f"Cache not flushed: {holding} requests hold KV pages")
        return web.Response(text="Cache flushed.")

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

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        """Opens the session (SGLang restores packed weights here); an unquantized fp32
        model has nothing to restore, so it only answers."""
        return _ok()

    async def end_weight_update(self, request: web.Request) -> web.Response:
        """Closes it (SGLang's post-load processing); nothing to post-process here."""
        return _ok()

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightVersionReqInput: abort_all_requests defaults to true."""
        body = await request.json()
        if body.get("abort_all_requests", True):
            self._abort_all()
        self.weight_version = str(body["new_version"])
        return _ok()

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /model_info, the fields a control plane reads."""
        return web.json_response(
            {
                "model_path": self.engine_id,
                "is_generation": True,
                "weight_version": self.weight_version,
            }
        )

    async def weights_checksum(self, request: web.Request) -> web.Response:
        return web.json_response({"checksum": checksum(self.model)})


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts one EngineServer; ``start`` gives its port on loopback."""

    def __init__(self, engine_id: str, policy: PolicyConfig, token_seconds: float = 0.0) -> None:
        self.server = EngineServer(engine_id, policy, token_seconds)

    async def start(self) -> int:
        return await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def hang(self) -> None:
        self.server.hang()

    async def wait_forever(self) -> None:
        """Never returns: a call left pending here fails when the actor dies, which is how
        the world learns of an engine's death without waiting for a request to fail."""
        await asyncio.Event().wait()
