"""An inference engine as a Ray actor serving SGLang's HTTP worker API for what RL uses.

Endpoint names and payloads follow SGLang 0.5.23 (python/sglang/srt/entrypoints/
http_server.py, managers/io_struct.py), and each body miles sends is honoured as
SGLang honours it, or refused with a 4xx naming the field before any weight
changes: /generate (generate.py: SGLang's sampling parameters, length limits
and finish reasons), /pause_generation (mode abort, retract or in_place),
/continue_generation, /abort_request, /flush_cache, /health, /health_generate,
/begin_weight_update and /end_weight_update (the session every load runs in),
/init_weights_update_group, /update_weights_from_distributed (tensor by tensor,
or ``flattened_bucket``), /update_weights_from_tensor (tensor handles from a
colocated trainer, loopback only; handles.py), /destroy_weights_update_group,
/update_weight_version, /model_info (where SGLang reports weight_version; it has no
/get_weight_version), /server_info and /get_server_info (info.py),
/weights_checker (checker.py). meta_info also carries ``weight_versions``
(the version of each span of the response) and, named as the testbed's own,
``testbed_kept_kv`` and ``testbed_cached_versions`` (the weights that computed the
prompt KV a request took from the prefix cache, beside SGLang's ``cached_tokens``); so
does /testbed/weights_checksum, so the oracles can compare weights bitwise.

SGLang's behaviour where the control plane depends on it: a pause with mode
``abort`` ends the requests in flight (finish_reason abort), ``retract``
frees their KV and requeues them, ``in_place`` freezes them on their KV (see
decoding.py); new requests wait while paused; /update_weight_version aborts
every request in flight unless the body says ``abort_all_requests: false``;
/flush_cache answers 400 while a request holds KV pages; a load outside a
session, a second /begin_weight_update, or an /end_weight_update with none open
is refused (managers/scheduler_components/weight_updater.py); a receive that
fails answers 400 "Failed to receive weights" as SGLang does.

Every body is checked field by field before the engine acts (requests.py):
a bad one gets a 4xx naming the field and changes nothing. Bound to loopback by
default; bound elsewhere, it needs SGLang's ``api_key`` (``Authorization:
Bearer KEY``) on every request, as SGLang's server does when given one.

Its control state (serving, paused, updating, receiving, stopping: state.py)
gates every route, and its HTTP edge (http.py) bounds what clients can hold:
bodies in flight, connections, idle and slow requests.

Generation runs the tiny policy token by token in a thread of its own, so health
and control calls answer while it runs; a pause waits for the token being made,
so it lands on a token boundary; the response is built as the last token is, so
it reports the version that token was generated under. A receive blocks in a
worker thread, so the server keeps answering while weights stream in. Fault hooks
are the actor's methods, not reachable over HTTP: ``die_midway(rid)`` makes the
process exit halfway through that request (a mid-generation crash), ``hang``
makes it stop answering anything while staying alive, ``lie`` makes every load answer
success and load nothing (tokenspeed #1373).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from aiohttp import web

from backends.common.engine import generate as gen
from backends.common.engine.checker import WeightChecker
from backends.common.engine.decoding import Decoding, health_token
from backends.common.engine.delta_routes import DeltaRoutes
from backends.common.engine.http import MAX_BODY_BYTES, middlewares, ok, read_body, refused, serve
from backends.common.engine.info import EngineInfo
from backends.common.engine.prefix_cache import PrefixCache
from backends.common.engine.requests import BadRequest, parse
from backends.common.engine.state import EngineState, state_of
from backends.common.engine.updates import UpdateRoutes
from backends.common.engine.weights import EngineWeights
from backends.common.session.ray_session import LOOPBACK, LOOPBACK_NAMES
from backends.common.training.policy import AnyPolicy, build_model
from backends.common.wire.devices import prepare_process
from backends.common.wire.groups import GLOO_TIMEOUT

__all__ = ["MAX_BODY_BYTES", "EngineActor", "EngineServer"]

HEALTH_CHECK_TIMEOUT = 20.0
"""SGLang's SGLANG_HEALTH_CHECK_TIMEOUT default: a /health_generate that produced no token in
that time answers 503."""


class EngineServer(UpdateRoutes, DeltaRoutes):
    def __init__(
        self,
        engine_id: str,
        policy: AnyPolicy,
        token_seconds: float = 0.0,
        *,
        device: str = "cpu",
        host: str = LOOPBACK,
        api_key: str | None = None,
        collective_timeout: float = GLOO_TIMEOUT.total_seconds(),
        flush_refuses_while_queued: bool = False,
        prefix_cache: str = "off",
    ) -> None:
        """``token_seconds``: a floor on each token's time (a real engine's decode time; the
        tiny policy takes about a millisecond), so requests live long enough to be paused.
        ``collective_timeout``: how long a broadcast of an update group waits for a member
        that never takes part (SGLang's groups take torch's default).
        ``flush_refuses_while_queued``: /flush_cache as an SGLang before #31962 answers it,
        refused while any request waits (a retract pause puts them all back in the queue).
        ``prefix_cache``: the prefix cache's policy ([sim] prefix_cache; prefix_cache.py)."""
        if host not in LOOPBACK_NAMES and not api_key:
            raise ValueError(
                f"host: binding {host!r} (not loopback) needs api_key, as SGLang's --api-key: "
                "pass one, or bind 127.0.0.1"
            )
        self.engine_id = engine_id
        self.token_seconds = token_seconds
        self.flush_refuses_while_queued = flush_refuses_while_queued
        self.prefixes = PrefixCache(prefix_cache)
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
        self.unanswered: frozenset[str] = frozenset()
        """Routes accepted and never answered (the hang_call fault's)."""
        self.stopping = False
        self.session_open = False
        """Between /begin_weight_update and /end_weight_update: loads are taken only then."""
        self._receiving: dict[str, int] = {}
        """The groups (or "tensor handles") a load is in progress on -> its number."""
        self._loads = 0
        """Loads begun (the newest one's number)."""
        self._jobs: dict[str, Decoding] = {}
        self._doomed: set[str] = set()
        """Requests that end the process halfway (die_midway: the fault hook)."""
        self._changed = asyncio.Event()
        """Set (and replaced) whenever pause, abort or hang state changes: waiters re-check."""
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix=f"{engine_id}-decode")
        """Every token is made here, one at a time, off the event loop."""
        self._stepping = 0
        self._stepped = asyncio.Event()
        """Set (and replaced) whenever a token is made: a pause waits for the one in hand."""
        self._runner: web.AppRunner | None = None

    @property
    def state(self) -> EngineState:
        """Receiving while the newest load begun is in progress: a receive left behind (an
        update the client abandoned, its receive waiting out the group's timeout) does not
        hold the engine once a newer load began."""
        receiving = self._loads in self._receiving.values()
        return state_of(
            stopping=self.stopping,
            receiving=receiving,
            session_open=self.session_open,
            paused=self.paused,
        )

    def app(self) -> web.Application:
        app = web.Application(middlewares=middlewares(self), client_max_size=MAX_BODY_BYTES)
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
                web.post("/pull_weights", self.pull_weights),  # disk-delta (delta_routes.py)
                web.post("/update_weights_from_disk", self.update_weights_from_disk),
            ]
        )
        return app

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return parse(request.path, await read_body(request))

    async def start(self) -> int:
        self._runner, port = await serve(self.app(), self.host)
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        device = str(next(self.model.parameters()).device.type)
        self.info = EngineInfo(
            self.engine_id, self.host, port, self.context_len, device, dtype, time.time()
        )
        return port

    async def stop(self) -> None:
        self.stopping = True
        self._abort_all()
        if self._runner is not None:
            await self._runner.cleanup()
        self._decoder.shutdown(wait=False, cancel_futures=True)

    def hang(self) -> None:
        self.hung = True
        self._notify()

    def hang_route(self, route: str) -> None:
        """The hang_call fault: ``route`` is accepted and never answered from now on."""
        self.unanswered = self.unanswered | {route}

    def lie(self) -> None:
        """The lying_engine fault: every load from now on answers success and loads nothing
        (weights.py ``EngineWeights.lying``). An actor call, not a route: no HTTP client
        can turn it on."""
        self.weights.lying = True

    def die_midway(self, rid: str) -> None:
        """The fault hook: the process exits halfway through request ``rid``."""
        self._doomed.add(rid)

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
        """One token, scheduled as any request is: not while paused (SGLang's /health_generate
        then answers 503 after its HEALTH_CHECK_TIMEOUT, 20 s, unless the pause ends)."""
        try:
            await asyncio.wait_for(self._until_unpaused(), HEALTH_CHECK_TIMEOUT)
        except TimeoutError:
            return web.Response(status=503, text="no token generated while paused")
        await asyncio.get_running_loop().run_in_executor(None, health_token, self.model)
        return web.Response(text="")

    async def _until_unpaused(self) -> None:
        while self.paused:
            await self._changed.wait()

    async def _may_go_on(self, job: Decoding) -> bool:
        """Wait while paused (queued, retracted or frozen) or hung; False once aborted."""
        while (self.paused or self.hung) and not job.aborted:
            await self._changed.wait()
        return not job.aborted

    async def _step(self, job: Decoding) -> None:
        """One token of ``job``, made in the decoding thread."""
        self._stepping += 1
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                self._decoder, job.step, self.model, self.weight_version, self.prefixes
            )
        finally:
            self._stepping -= 1
            self._stepped.set()
            self._stepped = asyncio.Event()

    async def _tokens_in_hand(self) -> None:
        """Return once no token is being made (a pause lands on a token boundary)."""
        while self._stepping:
            await self._stepped.wait()

    async def generate(self, request: web.Request) -> web.Response:
        job = gen.job_of(await self._body(request), self.model.config, self.context_len)
        created = time.monotonic()
        self._jobs[job.rid] = job
        try:
            while not job.done and await self._may_go_on(job):
                if job.rid in self._doomed and len(job.tokens) == job.max_new_tokens // 2:
                    os._exit(1)
                await self._step(job)
                if job.done:  # answered as the last token is: its version, no later one
                    break
                await asyncio.sleep(self.token_seconds)  # pause/abort land between tokens
        finally:
            self._jobs.pop(job.rid, None)
            self._doomed.discard(job.rid)
        meta = {
            "id": job.rid,
            "finish_reason": gen.finish_reason(job),
            "weight_version": self.weight_version,
            "weight_versions": job.spans,
            "testbed_kept_kv": job.kept_kv,
            "prompt_tokens": len(job.prompt),
            "completion_tokens": len(job.tokens),
            "cached_tokens": job.cached_tokens,
            "testbed_cached_versions": job.cached_versions,
            "e2e_latency": time.monotonic() - created,  # SGLang's: arrival to finish, seconds
            "output_token_logprobs": [
                [lp, t, None] for lp, t in zip(job.logprobs, job.tokens, strict=True)
            ],
        }
        return web.json_response({"text": "", "output_ids": job.tokens, "meta_info": meta})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's default mode is abort; miles sends its --pause-generation-mode. Answered
        once the token being made is done, so nothing generates after the answer."""
        body = await self._body(request)
        mode, below = body["mode"], body["abort_below_start_weight_version"]
        if below is not None and mode == "abort":  # sglang #34185: refused, nothing changed
            raise BadRequest(
                "abort_below_start_weight_version",
                "mode abort aborts every request already; send it with retract or in_place",
            )
        self.paused = True
        await self._tokens_in_hand()
        for job in self._jobs.values():
            start = job.start_weight_version
            if mode == "abort" or (below is not None and start is not None and start < below):
                job.aborted = True
            elif mode == "retract":
                job.release()
        self._notify()
        return ok()

    async def continue_generation(self, request: web.Request) -> web.Response:
        await self._body(request)
        self.paused = False
        self._notify()
        return ok()

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if body["abort_all"]:
            self._abort_all()
        elif body["rid"] in self._jobs:
            self._jobs[body["rid"]].aborted = True
            self._notify()
        return ok()

    async def flush_cache(self, request: web.Request) -> web.Response:
        holding = sum(job.holds_pages for job in self._jobs.values())
        if holding:
            return refused(f"Cache not flushed: {holding} requests hold KV pages")
        if self._jobs and self.flush_refuses_while_queued:
            return refused(f"Cache not flushed: {len(self._jobs)} requests wait in the queue")
        # in the decoding thread, the prefix cache's only other user
        await asyncio.get_running_loop().run_in_executor(self._decoder, self.prefixes.clear)
        return web.Response(text="Cache flushed.")


@ray.remote(num_cpus=0)
class EngineActor:
    """Hosts one EngineServer; ``start`` gives its port on loopback."""

    def __init__(
        self,
        engine_id: str,
        policy: AnyPolicy,
        token_seconds: float = 0.0,
        device: str = "cpu",
        collective_timeout: float = GLOO_TIMEOUT.total_seconds(),
        flush_refuses_while_queued: bool = False,
        prefix_cache: str = "off",
    ) -> None:
        self.server = EngineServer(
            engine_id,
            policy,
            token_seconds,
            device=device,
            collective_timeout=collective_timeout,
            flush_refuses_while_queued=flush_refuses_while_queued,
            prefix_cache=prefix_cache,
        )

    async def start(self, delay: float = 0.0) -> int:
        """Serve, after ``delay`` seconds of a process that is up and not yet listening (the
        slow_start fault: a model that loads for minutes)."""
        if delay > 0:
            await asyncio.sleep(delay)
        return await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def hang(self) -> None:
        self.server.hang()

    async def hang_route(self, route: str) -> None:
        self.server.hang_route(route)

    async def lie(self) -> None:
        """The lying_engine fault: loads answer success and load nothing from now on."""
        self.server.lie()

    async def arm_delta_fault(self, fault: str) -> None:
        """A disk-delta fault for the next pull (delta_routes.py ``arm_delta_fault``)."""
        self.server.arm_delta_fault(fault)

    async def die_midway(self, rid: str) -> None:
        """The mid-generation kill: this process exits halfway through request ``rid``."""
        self.server.die_midway(rid)

    async def wait_forever(self) -> None:
        """Never returns: a call left pending here fails when the actor dies, which is how
        the world learns of an engine's death without waiting for a request to fail."""
        await asyncio.Event().wait()
