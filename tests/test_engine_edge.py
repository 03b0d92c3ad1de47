"""The CPU engine's HTTP edge under load (issue 52, item 9) and its update groups (item 10).

Each test runs one EngineServer on loopback in this process, with its connection cap
lowered so that a handful of sockets reach it. Past the cap a client used to get a TCP
reset, a /health probe too; a body declaring 300 MiB waited 60 s for a 408. Now a request
past the cap gets 503 naming it, /health is answered whatever holds the connections, open
connections stay bounded, and a body declared too large gets 413 before a byte of it is
read. A second join of a group name is refused before anything changes, and destroying a
group the engine does not hold answers SGLang's 400.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

import aiohttp
import torch.distributed as dist

from backends.common.engine import http as engine_http
from backends.common.engine.server import EngineServer
from backends.common.training.policy import PolicyConfig

CAP = 4
SPARE = 2


@pytest.fixture(autouse=True)
def small_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_http, "MAX_CONNECTIONS", CAP)
    monkeypatch.setattr(engine_http, "SPARE_CONNECTIONS", SPARE)


class Edge:
    def __init__(self, server: EngineServer, port: int) -> None:
        self.server, self.port = server, port
        self.url = f"http://127.0.0.1:{port}"

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """One request on a connection of its own (a fresh session: no pooled connection)."""
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.request(method, self.url + path, json=body) as reply,
        ):
            text = await reply.text()
            return reply.status, (json.loads(text) if text.startswith("{") else {"text": text})

    def hold(self, n: int) -> list[socket.socket]:
        """``n`` connections opened and left silent (a client that holds them)."""
        return [socket.create_connection(("127.0.0.1", self.port)) for _ in range(n)]

    def open_connections(self) -> int:
        runner = self.server._runner
        assert runner is not None and runner.server is not None
        return len(runner.server.connections)


def with_edge(body: Callable[[Edge], Awaitable[None]]) -> None:
    async def main() -> None:
        engine = EngineServer("edge-0", PolicyConfig())
        port = await engine.start()
        try:
            await body(Edge(engine, port))
        finally:
            await engine.stop()

    asyncio.run(main())


@pytest.fixture
def held() -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for s in sockets:
        s.close()


def test_past_the_cap_a_request_gets_503_naming_it_and_health_is_answered(
    held: list[socket.socket],
) -> None:
    """Before: the connection past the cap was closed as it came (ServerDisconnectedError
    or a reset), /health's too."""

    async def body(edge: Edge) -> None:
        held.extend(edge.hold(CAP))
        await asyncio.sleep(0.2)
        status, reply = await edge.call("POST", "/generate", {"input_ids": [1, 2]})
        assert status == 503 and reply["success"] is False, (status, reply)
        assert reply["message"].startswith("connections: "), reply
        assert f"at most {CAP} at once" in reply["message"]
        assert (await edge.call("GET", "/health"))[0] == 200
        for s in held:  # the held ones close: the next request is served again
            s.close()
        await asyncio.sleep(0.2)
        assert (await edge.call("GET", "/model_info"))[0] == 200

    with_edge(body)


def test_health_is_answered_however_many_connections_are_held(held: list[socket.socket]) -> None:
    """Thrice the cap held open: the oldest idle spare connection makes room for each probe,
    and open connections never exceed the cap and its spares (a new one, a closing one)."""

    async def body(edge: Edge) -> None:
        held.extend(edge.hold(3 * (CAP + SPARE)))
        await asyncio.sleep(0.3)
        assert edge.open_connections() <= CAP + SPARE + 1
        for _ in range(3):
            assert (await edge.call("GET", "/health"))[0] == 200
            assert edge.open_connections() <= CAP + SPARE + 2

    with_edge(body)


def test_a_body_declared_past_the_limit_is_refused_before_a_byte_of_it_is_read() -> None:
    """300 MiB declared, nothing sent: 413 naming the limit at once. Before: the engine
    waited BODY_SECONDS (60 s) for the body and answered 408."""

    async def body(edge: Edge) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
        declared = 300 * 1024**2
        writer.write(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {declared}\r\n\r\n".encode()
        )
        await writer.drain()
        started = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        assert time.monotonic() - started < 5
        assert head.startswith(b"HTTP/1.1 413"), head
        lines = head.decode().split("\r\n")
        length = int(next(h for h in lines if h.lower().startswith("content-length")).split(":")[1])
        message = json.loads(await reader.readexactly(length))["message"]
        most = engine_http.MAX_BODY_BYTES
        assert message == f"body: declares {declared} bytes (Content-Length), at most {most}"
        writer.close()
        assert (await edge.call("GET", "/health"))[0] == 200

    with_edge(body)


# -- update groups -----------------------------------------------------------------------------


def _join(port: int, name: str) -> dict[str, Any]:
    return {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1} | {
        "world_size": 2,
        "group_name": name,
        "backend": "gloo",
    }


def test_a_second_join_of_a_group_name_is_refused_before_anything_changes() -> None:
    """Before: accepted (200), the engine dialled the store again and replaced the group it
    held (SGLang replaces it too, leaking the old communicator)."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    async def body(edge: Edge) -> None:
        name = "dup"
        trainer = asyncio.get_running_loop().run_in_executor(
            None, lambda: dist.ProcessGroupGloo(dist.PrefixStore(name, store), 0, 2)
        )
        join = _join(store.port, name)
        assert (await edge.call("POST", "/init_weights_update_group", join))[0] == 200
        await trainer
        group = edge.server.weights.groups[name]
        status, reply = await edge.call("POST", "/init_weights_update_group", join)
        assert status == 400 and reply["message"].startswith("group_name: "), (status, reply)
        assert "'dup' is joined already" in reply["message"]
        assert edge.server.weights.groups[name] is group  # the group it holds is kept
        destroy = {"group_name": name}
        assert (await edge.call("POST", "/destroy_weights_update_group", destroy))[0] == 200
        assert name not in edge.server.weights.groups

    with_edge(body)


def test_destroying_a_group_the_engine_does_not_hold_answers_sglangs_400() -> None:
    """SGLang answers success false, 400 (http_server.py ``destroy_weights_update_group``;
    WeightUpdater.destroy_weights_update_group: "The group to be destroyed does not exist.").
    Before: 200."""

    async def body(edge: Edge) -> None:
        status, reply = await edge.call(
            "POST", "/destroy_weights_update_group", {"group_name": "never-joined"}
        )
        assert status == 400 and reply["success"] is False, (status, reply)
        assert reply["message"].startswith("group_name: "), reply
        assert "The group to be destroyed does not exist." in reply["message"]

    with_edge(body)
