"""An inference engine as a Ray actor serving SGLang's HTTP worker API for what RL uses.

Endpoint names and payloads follow SGLang 0.5.23 (python/sglang/srt/entrypoints/
http_server.py, managers/io_struct.py), and each body miles sends is honoured as
SGLang honours it, or refused with a 4xx naming the field before any weight
changes: /generate (engine_generate: SGLang's sampling parameters, length limits
and finish reasons), /pause_generation (mode abort, retract or in_place),
/continue_generation, /abort_request, /flush_cache, /health, /health_generate,
/begin_weight_update and /end_weight_update (the session every load runs in),
/init_weights_update_group, /update_weights_from_distributed (tensor by tensor,
or ``flattened_bucket``), /update_weights_from_tensor (tensor handles from a
colocated trainer, loopback only; engine_handles), /destroy_weights_update_group,
/update_weight_version, /model_info (where SGLang reports weight_version; it has no
/get_weight_version), /server_info and /get_server_info (engine_info),
/weights_checker (engine_checker). meta_info also carries ``weight_versions``
(the version of each span of the response) and, named as the testbed's own,
``testbed_kept_kv``; so does /testbed/weights_checksum, so the oracles can
compare weights bitwise.

SGLang's behaviour where the control plane depends on it: a pause with mode
``abort`` ends the requests in flight (finish_reason abort), ``retract``
frees their KV and requeues them, ``in_place`` freezes them on their KV (see
decoding.py); new requests wait while paused; /update_weight_version aborts
every request in flight unless the body says ``abort_all_requests: false``;
/flush_cache answers 400 while a request holds KV pages; a load outside a
session, a second /begin_weight_update, or an /end_weight_update with none open
is refused (managers/scheduler_components/weight_updater.py); a receive that
fails answers 400 "Failed to receive weights" as SGLang does.

Every body is checked field by field before the engine acts (engine_requests):
a bad one gets a 4xx naming the field and changes nothing. Bound to loopback by
default; bound elsewhere, it needs SGLang's ``api_key`` (``Authorization:
Bearer KEY``) on every request, as SGLang's server does when given one.

Generation runs the tiny policy token by token on the actor's event loop,
yielding between tokens, so a pause or abort lands on a token boundary; the
response is built as the last token is, so it reports the version that token was
generated under. A receive blocks in a worker thread, so the server keeps
answering while weights stream in. Fault hooks: the header
``X-Testbed-Die-Midway`` makes the process exit halfway through that request (a
mid-generation crash); the actor's ``hang`` makes it stop answering anything
while staying alive.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ray
from aiohttp import web

from backends.common import engine_generate as gen
from backends.common.decoding import Decoding, health_token
from backends.common.devices import prepare_process
from backends.common.engine_checker import WeightChecker
from backends.common.engine_info import EngineInfo
from backends.common.engine_requests import BadRequest, parse
from backends.common.engine_weights import EngineWeights
from backends.common.policy import PolicyConfig, build_model, checksum
from backends.common.ray_session import LOOPBACK, LOOPBACK_NAMES
from backends.common.wire import GLOO_TIMEOUT

DIE_MIDWAY = "X-Testbed-Die-Midway"


MAX_BODY_BYTES = 64 * 1024**2
"""A bucket's metadata for a large MoE model runs to megabytes (aiohttp's default is 1 MiB)."""


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
        collective_timeout: float = GLOO_TIMEOUT.total_seconds(),
    ) -> None:
        """``token_seconds``: a floor on each token's time (a real engine's decode time; the
        tiny policy takes about a millisecond), so requests live long enough to be paused.
        ``collective_timeout``: how long a broadcast of an update group waits for a member
        that never takes part (SGLang's groups take torch's default)."""
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
        timeout = datetime.timedelta(seconds=collective_timeout)
        self.weights = EngineWeights(self.model, device, timeout)
        self.weight_version = "default"  # SGLang's value before any update
        self.context_len: int = self.model.config.max_position_embeddings
        self.checker = WeightChecker(self.model)
        self.info: EngineInfo | None = None
        """Set once the server listens (its port is part of it)."""
        self.paused = False
        self.hung = False
        self.session_open = False
        """Between /begin_weight_update and /end_weight_update: loads are taken only then."""
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
                web.get("/server_info", self.server_info),
                web.get("/get_server_info", self.server_info),
                web.route("*", "/weights_checker", self.weights_checker),
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

    def _require_session(self, route: str) -> None:
        """Weights load only inside an update session (SGLang refuses a load outside one:
        scheduler_components/weight_updater.py), and, here, only while generation is paused
        (miles' sequence pauses first; SGLang would serve half-loaded weights)."""
        if not self.session_open:
            raise BadRequest(
                "session",
                f"{route} must run between begin_weight_update() and end_weight_update()",
            )
        if not self.paused:
            raise BadRequest("paused", "weights change only while paused: POST /pause_generation")

    async def start(self) -> int:
        # stopping waits at most a second for handlers still running (a hung engine's never end)
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        device = str(next(self.model.parameters()).device.type)
        self.info = EngineInfo(
            self.engine_id, self.host, port, self.context_len, device, dtype, time.time()
        )
        return port

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
        job = gen.job_of(await self._body(request), self.model.config, self.context_len)
        die_midway = request.headers.get(DIE_MIDWAY) == "1"
        created = time.monotonic()
        self._jobs[job.rid] = job
        try:
            while not job.done and await self._may_go_on(job):
                if die_midway and len(job.tokens) == job.max_new_tokens // 2:
                    os._exit(1)
                job.step(self.model, self.weight_version)
                if job.done:  # answered as the last token is: its version, no later one
                    break
                await asyncio.sleep(self.token_seconds)  # pause/abort land between tokens
        finally:
            self._jobs.pop(job.rid, None)
        meta = {
            "id": job.rid,
            "finish_reason": gen.finish_reason(job),
            "weight_version": self.weight_version,
            "weight_versions": job.spans,
            "testbed_kept_kv": job.kept_kv,
            "prompt_tokens": len(job.prompt),
            "completion_tokens": len(job.tokens),
            "cached_tokens": 0,  # no prefix cache here
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
        """Join the trainer's group; a join that fails (the store unreachable, a member that
        never came) answers SGLang's 400, naming why."""
        body = await self._body(request)
        try:
            await self.weights.join(body)
        except BadRequest:
            raise
        except Exception as error:  # torch's store and rendezvous errors, socket errors
            message = f"Failed to initialize custom process group: {str(error)[:200]}."
            return _refused(message)
        return _ok()

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """One bucket by broadcast, tensor by tensor or packed (``load_format``); miles sends
        weight_version with each bucket, and it is the engine's version once the bucket loads."""
        body = await self._body(request)
        self._require_session("update_weights_from_distributed")
        group = self.weights.group_of(body)
        if body["abort_all_requests"]:
            self._abort_all()
        try:
            await self.weights.receive(group, body)
        except RuntimeError as error:  # the collective failed: a peer died, or it timed out
            return _refused(f"Failed to receive weights: {str(error)[:200]}")
        return self._loaded(body)

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        """One bucket (or one dtype's part of it) by tensor handles from a colocated trainer
        (loopback only)."""
        body = await self._body(request)
        self._require_session("update_weights_from_tensor")
        named = self.weights.handles(body, request.remote)
        if body["abort_all_requests"]:
            self._abort_all()
        self.weights.load(named)
        return self._loaded(body)

    def _loaded(self, body: dict[str, Any]) -> web.Response:
        """After a load: its version, and the flush the body asked for (SGLang's
        ``flush_cache_after_weight_update``: refused while requests hold KV, the weights
        loaded all the same)."""
        if body["weight_version"] is not None:
            self.weight_version = body["weight_version"]
        holding = sum(job.holds_pages for job in self._jobs.values())
        if body["flush_cache"] and holding:
            return _refused(
                "Weights were updated, but the cache was not flushed because requests are "
                "still running or queued. Retract or finish them, then call /flush_cache."
            )
        return _ok()

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        self.weights.leave((await self._body(request))["group_name"])
        return _ok()

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        """Opens the session (SGLang restores packed weights here; an unquantized fp32 model
        has nothing to restore). A second one while open is refused, as SGLang refuses it."""
        await self._body(request)
        if self.session_open:
            raise BadRequest(
                "session", "a weight-update session is already open; call end_weight_update() first"
            )
        self.session_open = True
        return _ok()

    async def end_weight_update(self, request: web.Request) -> web.Response:
        """Closes it (SGLang's post-load processing; nothing to post-process here)."""
        await self._body(request)
        if not self.session_open:
            raise BadRequest(
                "session", "no weight-update session is open; call begin_weight_update() first"
            )
        self.session_open = False
        return _ok()

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightVersionReqInput: abort_all_requests defaults to true."""
        body = await self._body(request)
        if body["abort_all_requests"]:
            self._abort_all()
        self.weight_version = body["new_version"]
        return _ok()

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /model_info (engine_info)."""
        assert self.info is not None
        return web.json_response(self.info.model_info(self.weight_version))

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's /server_info and its deprecated alias /get_server_info (engine_info)."""
        assert self.info is not None
        return web.json_response(self.info.server_info(len(self._jobs), self.paused))

    async def weights_checker(self, request: web.Request) -> web.Response:
        """SGLang's /weights_checker: a failed action is 400 with success false."""
        body = await self._body(request)
        extra = self.checker.handle(body["action"], body["skip_tensor_list"])
        return _ok(**extra)

    async def weights_checksum(self, request: web.Request) -> web.Response:
        return web.json_response({"checksum": checksum(self.model)})


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts one EngineServer; ``start`` gives its port on loopback."""

    def __init__(
        self,
        engine_id: str,
        policy: PolicyConfig,
        token_seconds: float = 0.0,
        device: str = "cpu",
        collective_timeout: float = GLOO_TIMEOUT.total_seconds(),
    ) -> None:
        self.server = EngineServer(
            engine_id, policy, token_seconds, device=device, collective_timeout=collective_timeout
        )

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
