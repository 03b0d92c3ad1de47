"""The CPU engine's HTTP edge: what every request passes before a handler, and the limits
no client can exceed.

Middlewares, in order: a hung engine answers nothing; a connection past the cap gets 503
naming it (``/health`` is answered on it all the same); SGLang's api_key; the engine's
state admits the route (state.py: a 409 naming the state, 503 while stopping); a body
declaring more than ``MAX_BODY_BYTES`` gets 413 and the bytes of request bodies in flight
across all requests stay under a bound (503), both before a byte of the body is read; a
BadRequest is its 4xx naming the field. The server caps its open connections (``capped``),
closes a connection that sends no request within ``IDLE_SECONDS`` (a client that opens and
never finishes its headers), and gives a body ``BODY_SECONDS`` to arrive.
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
"""Open connections served at once: a request on one more gets 503 naming this cap."""
SPARE_CONNECTIONS: Final = 32
"""Connections past MAX_CONNECTIONS still taken in, to be told why (503 naming the cap, with
``Connection: close``) and to answer ``/health``, which must answer under any load. Past
both, the oldest spare connection with no request in progress (an idle one, or one that
never finished its headers) is closed to make room, so clients that hold connections open
cannot lock a health probe out; only when every spare one is mid-answer is a new connection
closed as it comes. Open connections stay within the sum (and the few being closed)."""
ALWAYS_ANSWERED: Final = frozenset({"/health"})
"""Routes a connection past the cap is still served (SGLang's liveness probe: no body, no
work; a load balancer or the control plane must tell a busy engine from a dead one)."""
IDLE_SECONDS: Final = 15.0
"""A connection that sends no complete request in this long is closed (aiohttp's keepalive
timer, which also runs from a connection's start)."""
BODY_SECONDS: Final = 60.0
"""How long a body may take to arrive once its headers did (408 after)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Overflow:
    """The connections taken in past MAX_CONNECTIONS (oldest first), and those of them with
    a request being answered: kept by ``capped``, read by the ``over_cap`` middleware."""

    def __init__(self) -> None:
        self.spare: dict[Any, None] = {}
        self.busy: set[Any] = set()

    def idlest(self) -> Any | None:
        """The oldest spare connection with no request in progress, or None."""
        return next((h for h in self.spare if h not in self.busy), None)


OVERFLOW: Final = web.AppKey("overflow", Overflow)
"""The app's Overflow, set by ``serve`` (an app built and never served has none)."""


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
    async def over_cap(request: web.Request, handler: Handler) -> web.StreamResponse:
        """On a connection past the cap: /health is answered, anything else is 503 naming
        the cap, before a byte of its body is read, and the connection closes after it."""
        overflow = request.app.get(OVERFLOW)
        connection = request.protocol
        if overflow is None or connection not in overflow.spare:
            return await handler(request)
        if request.path in ALWAYS_ANSWERED:
            overflow.busy.add(connection)
            try:
                return await handler(request)
            finally:
                overflow.busy.discard(connection)
        response = refused(
            f"connections: this engine serves at most {MAX_CONNECTIONS} at once and as many "
            "are open: close one, or try again",
            status=503,
        )
        response.headers["Retry-After"] = "1"
        response.force_close()
        return response

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
        """A body declared larger than MAX_BODY_BYTES is refused at once (it would be cut off
        at that size after arriving, or wait BODY_SECONDS for bytes that never come), and
        bodies in flight across requests stay under MAX_BYTES_IN_FLIGHT."""
        declared = request.content_length
        if declared is not None and declared > MAX_BODY_BYTES:
            response = refused(
                f"body: declares {declared} bytes (Content-Length), at most {MAX_BODY_BYTES}",
                status=413,
            )
            response.force_close()  # what it sends next is no request
            return response
        size = MAX_BODY_BYTES if declared is None else declared
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

    return [unless_hung, over_cap, authorized, gated, bounded, refusals]


async def serve(app: web.Application, host: str) -> tuple[web.AppRunner, int]:
    """Start ``app`` on ``host`` (a free port), with the connection limits; runner and port."""
    overflow = app[OVERFLOW] = Overflow()
    # stopping waits at most a second for handlers still running (a hung engine's never end)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=1.0, keepalive_timeout=IDLE_SECONDS
    )
    await runner.setup()
    server = runner.server
    assert server is not None
    capped(server, overflow)
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def capped(server: Any, overflow: Overflow) -> None:
    """Past MAX_CONNECTIONS a connection is a spare one (``over_cap`` answers it); past the
    spares too, the idlest spare one is closed for it, or, with none idle, it is closed as it
    comes, nothing read. Open connections stay within MAX_CONNECTIONS + SPARE_CONNECTIONS."""
    admit, release = server.connection_made, server.connection_lost

    def made(handler: Any, transport: Any) -> None:
        if len(server.connections) - len(overflow.spare) >= MAX_CONNECTIONS:
            if len(overflow.spare) < SPARE_CONNECTIONS or _evicted(overflow):
                overflow.spare[handler] = None
            else:
                transport.close()  # every spare connection is mid-answer: nothing read
        admit(handler, transport)

    def lost(handler: Any, exc: BaseException | None) -> None:
        overflow.spare.pop(handler, None)
        overflow.busy.discard(handler)
        release(handler, exc)

    server.connection_made = made
    server.connection_lost = lost


def _evicted(overflow: Overflow) -> bool:
    """Close the idlest spare connection to make room; False when every one is mid-answer."""
    victim = overflow.idlest()
    if victim is None:
        return False
    del overflow.spare[victim]
    victim.force_close()
    return True
