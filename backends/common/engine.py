"""An inference engine as a Ray actor serving SGLang's HTTP worker API for what RL uses.

Endpoint names and payloads follow SGLang (python/sglang/srt/entrypoints/
http_server.py, managers/io_struct.py): /generate (meta_info with
weight_version and finish_reason), /pause_generation (mode abort, retract or
in_place), /continue_generation, /abort_request, /flush_cache, /health,
/health_generate, /begin_weight_update, /end_weight_update,
/init_weights_update_group, /update_weights_from_distributed (load_format
"flattened_bucket": SGLang's packed uint8 buffer), /update_weights_from_tensor
(tensor handles from a colocated trainer, loopback only),
/destroy_weights_update_group, /update_weight_version, /model_info (where
SGLang reports weight_version; it has no /get_weight_version).
meta_info also carries ``weight_versions`` (the version of each span of the
response) and, named as the testbed's own, ``testbed_kept_kv``; so does
/testbed/weights_checksum, so the oracles can compare weights bitwise.

SGLang's behaviour where the control plane depends on it: a pause with mode
``abort`` ends the requests in flight (finish_reason abort), ``retract``
frees their KV and requeues them, ``in_place`` freezes them on their KV (see
decoding.py); new requests wait while paused; /update_weight_version aborts
every request in flight unless the body says ``abort_all_requests: false``;
/flush_cache answers 400 while a request holds KV pages.

Every body is checked field by field before the engine acts (engine_requests):
a bad one gets a 4xx naming the field and changes nothing. Bound to loopback by
default; bound elsewhere, it needs SGLang's ``api_key`` (``Authorization:
Bearer KEY``) on every request, as SGLang's server does when given one.

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
from backends.common.devices import prepare_process
from backends.common.engine_requests import BadRequest, parse
from backends.common.engine_weights import EngineWeights
from backends.common.policy import PolicyConfig, build_model, checksum
from backends.common.ray_session import LOOPBACK, LOOPBACK_NAMES

DIE_MIDWAY = "X-Testbed-Die-Midway"


MAX_NEW_TOKENS = 64
MAX_SEED = 2**63 - 1 - MAX_NEW_TOKENS
MAX_BODY_BYTES = 64 * 1024**2
"""A bucket's metadata for a large MoE model runs to megabytes (aiohttp's default is 1 MiB)."""


def _integer_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _ok(**extra: Any) -> web.Response:
    return web.json_response({"success": True, "message": "", **extra})


def _refused(message: str, status: int = 400) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=status)


async def _forever() -> None:
    await asyncio.Event().wait()


class EngineServer:
    def __init__(
        self,
        engine_id: str,
        policy: PolicyConfig,
        token_seconds: float = 0.0,
        *,
        device: str = "cpu",
        host: str = LOOPBACK,
        api_key: str | None = None,
    ) -> None:
        """``token_seconds``: a floor on each token's time (a real engine's decode time; the
        tiny policy takes about a millisecond), so requests live long enough to be paused."""
        if host not in LOOPBACK_NAMES and not api_key:
            raise ValueError(
                f"host: binding {host!r} (not loopback) needs api_key, as SGLang's --api-key: "
                "pass one, or bind 127.0.0.1"
            )
        self.engine_id = engine_id
        self.token_seconds = token_seconds
        self.host, self.api_key = host, api_key
        prepare_process(device)
        self.model = build_model(policy).to(device)
        self.weights = EngineWeights(self.model, device)
        self.weight_version = "default"  # SGLang's value before any update
        self.paused = False
        self.hung = False
        self._jobs: dict[str, Decoding] = {}
        self._changed = asyncio.Event()
        """Set (and replaced) whenever pause, abort or hang state changes: waiters re-check."""
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self._unless_hung, self._authorized, self._refusals],
            client_max_size=MAX_BODY_BYTES,
        )
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
                web.post("/update_weights_from_tensor", self.update_weights_from_tensor),
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

    @web.middleware
    async def _authorized(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """SGLang's api_key: every request carries ``Authorization: Bearer KEY``."""
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _refused("Authorization: missing or wrong api key", status=401)
        return await handler(request)

    @web.middleware
    async def _refusals(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A BadRequest from any handler is its 4xx, naming the field; nothing was changed."""
        try:
            return await handler(request)
        except BadRequest as error:
            return _refused(str(error), status=error.status)
        except web.HTTPRequestEntityTooLarge:
            return _refused(f"body: larger than {MAX_BODY_BYTES} bytes", status=413)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return parse(request.path, await request.read())

    def _require_paused(self) -> None:
        """Weights change only while generation is paused (miles' sequence pauses first)."""
        if not self.paused:
            raise BadRequest("paused", "weights change only while paused: POST /pause_generation")

    async def start(self) -> int:
        # stopping waits at most a second for handlers still running (a hung engine's never end)
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
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
        body = await self._body(request)
        params = body["sampling_params"]
        vocab = self.model.config.vocab_size
        if not body["input_ids"] or max(body["input_ids"]) >= vocab:
            raise BadRequest("input_ids", f"one or more token ids, each below the vocab {vocab}")
        new_tokens = params.get("max_new_tokens", 4)
        if not _integer_in(new_tokens, 0, MAX_NEW_TOKENS):
            raise BadRequest(
                "sampling_params.max_new_tokens", f"an integer in [0, {MAX_NEW_TOKENS}]"
            )
        seed = params.get("sampling_seed", 0)
        if not _integer_in(seed, 0, MAX_SEED):  # token i samples under seed + i (decoding.py)
            raise BadRequest("sampling_params.sampling_seed", f"an integer in [0, {MAX_SEED}]")
        job = Decoding(
            rid=body["rid"] or str(id(body)),
            prompt=body["input_ids"],
            max_new_tokens=new_tokens,
            seed=seed,
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
        mode = (await self._body(request))["mode"]
        self.paused = True
        for job in self._jobs.values():
            if mode == "abort":
                job.aborted = True
            elif mode == "retract":
                job.release()
        self._notify()
        return _ok()

    async def continue_generation(self, request: web.Request) -> web.Response:
        await self._body(request)
        self.paused = False
        self._notify()
        return _ok()

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if body["abort_all"]:
            self._abort_all()
        elif body["rid"] in self._jobs:
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
        await self.weights.join(await self._body(request))
        return _ok()

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """One packed bucket by broadcast; miles sends weight_version with each bucket."""
        body = await self._body(request)
        self._require_paused()
        try:
            await self.weights.receive(body)
        except RuntimeError as error:  # the collective failed: a peer died
            return _refused(str(error)[:200], status=500)
        self._loaded(body)
        return _ok()

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        """One packed bucket by tensor handles from a colocated trainer (loopback only)."""
        body = await self._body(request)
        self._require_paused()
        self.weights.load_handles(body, request.remote)
        self._loaded(body)
        return _ok()

    def _loaded(self, body: dict[str, Any]) -> None:
        if body["weight_version"] is not None:
            self.weight_version = body["weight_version"]

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        self.weights.leave((await self._body(request))["group_name"])
        return _ok()

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        """Opens the session (SGLang restores packed weights here); an unquantized fp32
        model has nothing to restore, so it only answers."""
        await self._body(request)
        return _ok()

    async def end_weight_update(self, request: web.Request) -> web.Response:
        """Closes it (SGLang's post-load processing); nothing to post-process here."""
        await self._body(request)
        return _ok()

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightVersionReqInput: abort_all_requests defaults to true."""
        body = await self._body(request)
        if body["abort_all_requests"]:
            self._abort_all()
        self.weight_version = body["new_version"]
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

    def __init__(
        self, engine_id: str, policy: PolicyConfig, token_seconds: float = 0.0, device: str = "cpu"
    ) -> None:
        self.server = EngineServer(engine_id, policy, token_seconds, device=device)

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
