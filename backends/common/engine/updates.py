"""The CPU engine's weight-update and reporting routes (SGLang's), as a part of EngineServer.

SGLang's semantics kept (managers/scheduler_components/weight_updater.py): a load
runs only inside a weight-update session, a second /begin_weight_update and an
/end_weight_update with none open are refused (400, SGLang's words); a receive that
fails answers "Failed to receive weights" (400) and loads nothing it did not
receive whole; a load whose body asks for a flush while requests hold KV loads and
says the cache was not flushed. Beyond SGLang (state.py): one load at a time,
the group a load uses cannot be destroyed under it, and no version is stamped mid-load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from backends.common.engine.checker import WeightChecker
from backends.common.engine.decoding import Decoding
from backends.common.engine.http import ok, refused
from backends.common.engine.info import EngineInfo
from backends.common.engine.requests import BadRequest
from backends.common.engine.weights import EngineWeights
from backends.common.training.policy import checksum

HANDLES = "tensor handles"
"""What a load by /update_weights_from_tensor receives on, for state.py."""


class UpdateRoutes:
    """Handlers over the engine's weights; EngineServer holds the state they share."""

    weights: EngineWeights
    checker: WeightChecker
    info: EngineInfo | None
    model: Any
    weight_version: str
    paused: bool
    session_open: bool
    _receiving: dict[str, int]
    _loads: int
    _jobs: dict[str, Decoding]

    async def _body(self, request: web.Request) -> dict[str, Any]: ...

    def _abort_all(self) -> None: ...

    def _require_session(self, route: str) -> None:
        """Weights load only inside an update session (SGLang refuses a load outside one)."""
        if not self.session_open:
            raise BadRequest(
                "session",
                f"{route} must run between begin_weight_update() and end_weight_update()",
            )

    @contextmanager
    def _loading(self, group: str) -> Iterator[Callable[[], bool]]:
        """The engine is receiving (state.py) while this load is the newest one begun;
        one load at a time on a group (a second one entering the same collective out of
        order aborted the process in gloo). Yields whether the load is still the newest: one
        left behind (its client gave up on it and sent a newer one) must not load late."""
        if group in self._receiving:
            raise BadRequest("state", f"receiving: a load on {group!r} is in progress", 409)
        self._loads += 1
        number = self._receiving[group] = self._loads
        try:
            yield lambda: self._loads == number
        finally:
            del self._receiving[group]

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        """Join the trainer's group; a join that fails (the store unreachable, a member that
        never came) answers SGLang's 400, naming the store it dialled and why. A name this
        engine holds (or is joining) is refused before anything is dialled (weights.py
        ``join``): SGLang would replace the group it holds."""
        body = await self._body(request)
        try:
            await self.weights.join(body)
        except BadRequest:
            raise
        except Exception as error:  # torch's store and rendezvous errors, socket errors
            peer = f"{body['master_address']}:{body['master_port']}"
            message = f"Failed to initialize custom process group via {peer}: {str(error)[:200]}"
            return refused(message)
        return ok()

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        """One bucket by broadcast, tensor by tensor or packed (``load_format``); miles sends
        weight_version with each bucket, and it is the engine's version once the bucket loads."""
        body = await self._body(request)
        self._require_session("update_weights_from_distributed")
        group = self.weights.group_of(body)
        if body["abort_all_requests"]:
            self._abort_all()
        with self._loading(body["group_name"]) as current:
            try:
                await self.weights.receive(group, body, current)
            except RuntimeError as error:  # the collective failed: a peer died, or timed out
                return refused(f"Failed to receive weights: {str(error)[:200]}")
        return self._loaded(body)

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        """One bucket (or one dtype's part of it) by tensor handles from a colocated trainer
        (loopback only)."""
        body = await self._body(request)
        self._require_session("update_weights_from_tensor")
        named = self.weights.handles(body, request.remote)
        if body["abort_all_requests"]:
            self._abort_all()
        with self._loading(HANDLES):
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
            return refused(
                "Weights were updated, but the cache was not flushed because requests are "
                "still running or queued. Retract or finish them, then call /flush_cache."
            )
        return ok()

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        """Leave a group; not the one a load is receiving on (409), nor one this engine does
        not hold (SGLang's 400: weights.py ``leave``)."""
        name = (await self._body(request))["group_name"]
        if name in self._receiving:
            return refused(f"state: receiving: group {name!r} is in use by a load", status=409)
        self.weights.leave(name)
        return ok()

    async def begin_weight_update(self, request: web.Request) -> web.Response:
        """Opens the session (SGLang restores packed weights here; an unquantized fp32 model
        has nothing to restore). A second one while open is refused, as SGLang refuses it."""
        await self._body(request)
        if self.session_open:
            raise BadRequest(
                "session", "a weight-update session is already open; call end_weight_update() first"
            )
        self.session_open = True
        return ok()

    async def end_weight_update(self, request: web.Request) -> web.Response:
        """Closes it (SGLang's post-load processing; nothing to post-process here)."""
        await self._body(request)
        if not self.session_open:
            raise BadRequest(
                "session", "no weight-update session is open; call begin_weight_update() first"
            )
        self.session_open = False
        return ok()

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's UpdateWeightVersionReqInput: abort_all_requests defaults to true."""
        body = await self._body(request)
        if body["abort_all_requests"]:
            self._abort_all()
        self.weight_version = body["new_version"]
        return ok()

    async def model_info(self, request: web.Request) -> web.Response:
        """SGLang's /model_info (info.py)."""
        assert self.info is not None
        return web.json_response(self.info.model_info(self.weight_version))

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's /server_info and its deprecated alias /get_server_info (info.py)."""
        assert self.info is not None
        running, session = len(self._jobs), self.session_open
        return web.json_response(self.info.server_info(running, self.paused, session))

    async def weights_checker(self, request: web.Request) -> web.Response:
        """SGLang's /weights_checker: a failed action is 400 with success false."""
        body = await self._body(request)
        extra = self.checker.handle(body["action"], body["skip_tensor_list"])
        return ok(**extra)

    async def weights_checksum(self, request: web.Request) -> web.Response:
        return web.json_response({"checksum": checksum(self.model)})
