"""The CPU engine's HTTP edge: what every request passes before a handler, and the limits
no client can exceed.

Middlewares, in order: a hung engine answers nothing; SGLang's api_key; the engine's
state admits the route (state.py: a 409 naming the state, 503 while stopping);
the bytes of request bodies in flight across all requests stay under a bound (503
before a body is read); a BadRequest is its 4xx naming the field. The server caps
its open connections, closes a connection that sends no request within
``IDLE_SECONDS`` (a client that opens and never finishes its headers), and gives a
body ``BODY_SECONDS`` to arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from aiohttp import web

from backends.common.engine.requests import BadRequest
from backends.common.engine.state import ROUTES, EngineState, refusal

MAX_BODY_BYTES: Final = 64 * 1024**2
"""A bucket's metadata for a large MoE model runs to megabytes (aiohttp's default is 1 MiB)."""
MAX_BYTES_IN_FLIGHT: Final = 4 * MAX_BODY_BYTES
"""Bodies being read or handled at once, in bytes (each counted at its declared length, or
at MAX_BODY_BYTES without one): past it a request gets 503 before its body is read."""
MAX_CONNECTIONS: Final = 256
"""Open connections at once: more are closed as they come."""
IDLE_SECONDS: Final = 15.0
"""A connection that sends no complete request in this long is closed (aiohttp's keepalive
timer, which also runs from a connection's start)."""
BODY_SECONDS: Final = 60.0
"""How long a body may take to arrive once its headers did (408 after)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Gatekeeper(Protocol):
    """What the middlewares read of the engine."""

    hung: bool
    unanswered: frozenset[str]
    """Routes (without the slash) this process accepts and never answers (hang_call)."""
    api_key: str | None

    @property
    def state(self) -> EngineState: ...


def ok(**extra: Any) -> web.Response:
    return web.json_response({"success": True, "message": "", **extra})


def refused(message: str, status: int = 400) -> web.Response:
    return web.json_response({"success": False, "message": message}, status=status)


async def read_body(request: web.Request) -> bytes:
    """The body, within BODY_SECONDS of its headers (a slow body is a 408, naming it)."""
    try:
        return await asyncio.wait_for(request.read(), BODY_SECONDS)
    except TimeoutError:
        raise BadRequest("body", f"not received within {BODY_SECONDS:g}s", status=408) from None


def middlewares(engine: Gatekeeper) -> list[Any]:
    in_flight = [0]

    @web.middleware
    async def unless_hung(request: web.Request, handler: Handler) -> web.StreamResponse:
        """A hung engine accepts connections and never answers (the client times out); so
        does one whose route the hang_call fault left unanswered, for that route only."""
        if engine.hung or request.path.removeprefix("/") in engine.unanswered:
            await asyncio.Event().wait()
        return await handler(request)

    @web.middleware
    async def authorized(request: web.Request, handler: Handler) -> web.StreamResponse:
        """SGLang's api_key: every request carries ``Authorization: Bearer KEY``."""
        key = engine.api_key
        if key and request.headers.get("Authorization") != f"Bearer {key}":
            return refused("Authorization: missing or wrong api key", status=401)
        return await handler(request)

    @web.middleware
    async def gated(request: web.Request, handler: Handler) -> web.StreamResponse:
        """The engine's state admits the route, or a 409 (503 stopping) says which state."""
        control = ROUTES.get(request.path)
        if control is not None:
            state = engine.state
            why = refusal(state, control)
            if why is not None:
                status = 503 if state is EngineState.STOPPING else 409
                return refused(f"state: {state.value}: {why}", status=status)
        return await handler(request)

    @web.middleware
    async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Bodies in flight across requests stay under MAX_BYTES_IN_FLIGHT."""
        declared = request.content_length
        size = MAX_BODY_BYTES if declared is None else min(declared, MAX_BODY_BYTES)
        size = size if request.can_read_body else 0
        if size and in_flight[0] + size > MAX_BYTES_IN_FLIGHT:
            return refused(
                f"body: {in_flight[0]} bytes of requests already in flight, at most "
                f"{MAX_BYTES_IN_FLIGHT}: try again",
                status=503,
            )
        in_flight[0] += size
        try:
            return await handler(request)
        finally:
            in_flight[0] -= size

    @web.middleware
    async def refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
        """A BadRequest from any handler is its 4xx, naming the field; nothing was changed."""
        try:
            return await handler(request)
        except BadRequest as error:
            return refused(str(error), status=error.status)
        except web.HTTPRequestEntityTooLarge:
            return refused(f"body: larger than {MAX_BODY_BYTES} bytes", status=413)

    return [unless_hung, authorized, gated, bounded, refusals]


async def serve(app: web.Application, host: str) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host`` (a free port), with the connection limits; runner and port."""
    # stopping waits at most a second for handlers still running (a hung engine's never end)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=1.0, keepalive_timeout=IDLE_SECONDS
    )
    await runner.setup()
    server = runner.server
    assert server is not None
    admit = server.connection_made

    def capped(handler: Any, transport: Any) -> None:
        if len(server.connections) >= MAX_CONNECTIONS:
            transport.close()  # over the cap: closed as it comes, nothing read
        admit(handler, transport)

    server.connection_made = capped  # type: ignore[method-assign]
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
