"""The CPU engine's state gates its routes, and no client can wedge it or exhaust it.

Each test runs one EngineServer on loopback in this process and drives it over HTTP:
the routes each state refuses (409 naming the state, SGLang's own 400 where SGLang
refuses), a load in progress that nothing can resume, stamp or destroy under it, a
long prefill that /health answers through, bodies and connections past the limits,
and a connection that never finishes its request.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

import aiohttp
import torch
import torch.distributed as dist

from backends.common.engine import http as engine_http
from backends.common.engine.server import EngineServer
from backends.common.engine.state import ROUTES, EngineState, refusal
from backends.common.training.policy import BOS, SEP, PolicyConfig
from backends.common.wire.groups import broadcast_each

NORM = "model.norm.weight"
BUCKET = {"names": [NORM], "dtypes": ["float32"], "shapes": [[64]], "group_name": "g"}


class Engine:
    def __init__(self, server: EngineServer, port: int, http: aiohttp.ClientSession) -> None:
        self.server, self.http = server, http
        self.url = f"http://127.0.0.1:{port}"

    async def post(self, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        async with self.http.post(self.url + path, json=body or {}) as reply:
            text = await reply.text()
            return reply.status, (json.loads(text) if text.startswith("{") else {"text": text})

    async def get(self, path: str) -> int:
        async with self.http.get(self.url + path) as reply:
            await reply.read()
            return reply.status


def with_engine(body: Callable[[Engine], Awaitable[None]], **server: Any) -> None:
    async def main() -> None:
        engine = EngineServer("states-0", PolicyConfig(), **server)
        port = await engine.start()
        try:
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                await body(Engine(engine, port, http))
        finally:
            await engine.stop()

    asyncio.run(main())


def refused_as(reply: tuple[int, dict[str, Any]], status: int, starts: str) -> None:
    code, body = reply
    assert code == status and body["success"] is False, reply
    assert body["message"].startswith(starts), body["message"]


def test_every_route_is_in_the_table_and_stopping_admits_nothing() -> None:
    app = EngineServer("table-0", PolicyConfig()).app()
    served = {r.resource.canonical for r in app.router.routes()}
    assert served == set(ROUTES)
    assert all(refusal(EngineState.STOPPING, c) for c in set(ROUTES.values()))


def test_the_states_refuse_what_would_serve_or_change_half_loaded_weights() -> None:
    async def body(engine: Engine) -> None:
        # serving: no session, no load (pause first)
        refused_as(await engine.post("/begin_weight_update"), 409, "state: serving")
        refused_as(await engine.post("/update_weights_from_distributed", BUCKET), 409, "state")
        # paused, no session: SGLang's own refusal of a load outside one
        assert (await engine.post("/pause_generation", {"mode": "retract"}))[0] == 200
        refused_as(await engine.post("/update_weights_from_distributed", BUCKET), 400, "session")
        refused_as(await engine.post("/end_weight_update"), 400, "session")
        # updating: generation cannot resume on half-loaded weights
        assert (await engine.post("/begin_weight_update"))[0] == 200
        assert engine.server.state is EngineState.UPDATING
        refused_as(await engine.post("/continue_generation"), 409, "state: updating")
        refused_as(await engine.post("/begin_weight_update"), 400, "session")
        assert (await engine.post("/end_weight_update"))[0] == 200
        assert (await engine.post("/continue_generation"))[0] == 200
        assert engine.server.state is EngineState.SERVING

    with_engine(body)


JOIN_TIMEOUT = datetime.timedelta(seconds=30)


async def joined(engine: Engine, store: Any, name: str = "g") -> Any:
    """A two-member gloo group ``name``: the engine joins it as rank 1 over HTTP, and the
    trainer's side (rank 0, made here) is returned."""
    trainer = asyncio.get_running_loop().run_in_executor(
        None, lambda: dist.ProcessGroupGloo(dist.PrefixStore(name, store), 0, 2, JOIN_TIMEOUT)
    )
    join = {"master_address": "127.0.0.1", "master_port": store.port, "rank_offset": 1}
    join |= {"world_size": 2, "group_name": name, "backend": "gloo"}
    assert (await engine.post("/init_weights_update_group", join))[0] == 200
    return await trainer


async def session_open(engine: Engine) -> None:
    """Paused (retract) and inside an update session: where a load is taken."""
    await engine.post("/pause_generation", {"mode": "retract"})
    await engine.post("/begin_weight_update")


def test_a_load_in_progress_cannot_be_resumed_stamped_ended_or_unjoined_under_it() -> None:
    """A per-tensor receive waits for the trainer's broadcast: meanwhile a second load, a
    continue, a version stamp, an end of the session and a destroy of its group are 409,
    /health answers, and the load then lands whole."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    async def body(engine: Engine) -> None:
        loop = asyncio.get_running_loop()
        group = await joined(engine, store)
        await session_open(engine)
        load = asyncio.ensure_future(engine.post("/update_weights_from_distributed", BUCKET))
        while engine.server.state is not EngineState.RECEIVING:
            await asyncio.sleep(0.01)
        refused_as(await engine.post("/update_weights_from_distributed", BUCKET), 409, "state")
        refused_as(await engine.post("/continue_generation"), 409, "state: receiving")
        refused_as(await engine.post("/update_weight_version", {"new_version": "9"}), 409, "state")
        refused_as(await engine.post("/end_weight_update"), 409, "state: receiving")
        destroy = await engine.post("/destroy_weights_update_group", {"group_name": "g"})
        refused_as(destroy, 409, "state: receiving")
        assert await engine.get("/health") == 200
        sent = torch.full([64], 2.5)
        await loop.run_in_executor(None, broadcast_each, group, [sent])
        assert (await load)[0] == 200
        norm = dict(engine.server.model.named_parameters())[NORM].detach()
        assert torch.equal(norm, sent)
        assert engine.server.state is EngineState.UPDATING

    with_engine(body)


def test_health_answers_while_a_long_prompt_is_prefilled() -> None:
    """Generation runs off the event loop: a 4,000-token prompt's prefill does not hold up
    /health (it blocked the loop for over a second before)."""

    async def body(engine: Engine) -> None:
        prompt = [BOS, *([3] * 3998), SEP]
        sampling = {"max_new_tokens": 8}
        long = asyncio.ensure_future(
            engine.post("/generate", {"input_ids": prompt, "sampling_params": sampling})
        )
        while not engine.server._stepping:
            await asyncio.sleep(0.001)
        waits = []
        while engine.server._stepping and len(waits) < 20:
            started = time.monotonic()
            assert await engine.get("/health") == 200
            waits.append(time.monotonic() - started)
        assert (await long)[0] == 200
        assert waits and max(waits) < 0.5, waits

    with_engine(body)


def test_a_pause_answers_once_the_token_in_hand_is_made() -> None:
    """After /pause_generation answers no token is made until the engine continues."""

    async def body(engine: Engine) -> None:
        request = asyncio.ensure_future(
            engine.post(
                "/generate",
                {"input_ids": [BOS, 1, SEP], "sampling_params": {"max_new_tokens": 400}},
            )
        )
        while not engine.server._jobs or not next(iter(engine.server._jobs.values())).tokens:
            await asyncio.sleep(0.001)
        assert (await engine.post("/pause_generation", {"mode": "in_place"}))[0] == 200
        job = next(iter(engine.server._jobs.values()))
        made = len(job.tokens)
        assert engine.server._stepping == 0
        await asyncio.sleep(0.1)
        assert len(job.tokens) == made
        await engine.post("/abort_request", {"abort_all": True})
        await engine.post("/continue_generation")
        assert (await request)[1]["meta_info"]["finish_reason"]["type"] == "abort"

    with_engine(body, token_seconds=0.001)


def test_bodies_past_the_bytes_in_flight_are_refused_before_they_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_http, "MAX_BYTES_IN_FLIGHT", 3 * 1024**2)

    async def body(engine: Engine) -> None:
        big = b'{"rid": "' + b"r" * (2 * 1024**2) + b'"}'
        headers = {"Content-Type": "application/json"}

        async def send() -> int:
            async with engine.http.post(engine.url + "/generate", data=big, headers=headers) as r:
                return r.status

        statuses = await asyncio.gather(*(send() for _ in range(8)))
        assert 503 in statuses, statuses
        assert await engine.get("/health") == 200

    with_engine(body)


def test_connections_past_the_cap_and_its_spares_are_closed_and_the_engine_still_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Open connections stay within the cap and its spares (test_engine_edge.py: what a
    request past the cap is answered)."""
    monkeypatch.setattr(engine_http, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(engine_http, "SPARE_CONNECTIONS", 4)

    async def body(engine: Engine) -> None:
        port = int(engine.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        try:
            await asyncio.sleep(0.2)
            assert len(engine.server._runner.server.connections) <= 8 + 4 + 1  # type: ignore[union-attr]
        finally:
            for s in held:
                s.close()
        await asyncio.sleep(0.2)
        assert await engine.get("/health") == 200

    with_engine(body)


def test_a_connection_that_never_finishes_its_request_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slowloris client: half a request line, then silence. It is closed after the idle
    time, so such connections cannot pile up."""
    monkeypatch.setattr(engine_http, "IDLE_SECONDS", 0.5)

    async def body(engine: Engine) -> None:
        port = int(engine.url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(), timeout=10)  # b"" once it is closed
        assert closed == b"" or b"408" in closed or b"400" in closed
        writer.close()
        assert await engine.get("/health") == 200

    with_engine(body)


def test_a_join_to_a_store_that_cannot_be_reached_fails_at_once_naming_it() -> None:
    """A closed port and an unknown host answer SGLang's 400 within the reach timeout (they
    took 54-65 s, naming nothing, before), twelve at once included, and a real join behind
    them still succeeds."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    async def body(engine: Engine) -> None:
        def join(address: str, port: int, name: str) -> dict[str, Any]:
            return {"master_address": address, "master_port": port, "rank_offset": 1} | {
                "world_size": 2,
                "group_name": name,
                "backend": "gloo",
            }

        started = time.monotonic()
        bad = [join("127.0.0.1", 1, f"closed{i}") for i in range(12)]
        bad.append(join("no-such-host.invalid", 1234, "unknown"))
        replies = await asyncio.gather(*(engine.post("/init_weights_update_group", b) for b in bad))
        assert time.monotonic() - started < 10
        for reply, sent in zip(replies, bad, strict=True):
            peer = f"{sent['master_address']}:{sent['master_port']}"
            refused_as(reply, 400, f"Failed to initialize custom process group via {peer}")
        timeout = datetime.timedelta(seconds=30)
        loop = asyncio.get_running_loop()
        trainer = loop.run_in_executor(
            None, lambda: dist.ProcessGroupGloo(dist.PrefixStore("real", store), 0, 2, timeout)
        )
        assert (
            await engine.post("/init_weights_update_group", join("127.0.0.1", store.port, "real"))
        )[0] == 200
        await trainer

    with_engine(body)


def test_two_receives_at_once_on_one_group_cannot_abort_the_engine() -> None:
    """Two receives on one group with the trainer sending in the other order aborted the
    engine process (gloo: "Received data size doesn't match expected size"). The second is
    now refused (409: one load at a time) before it enters the group, and the first lands."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    k_proj = "model.layers.0.self_attn.k_proj.weight"
    small, large = BUCKET, {**BUCKET, "names": [k_proj], "shapes": [[32, 64]]}

    async def body(engine: Engine) -> None:
        loop = asyncio.get_running_loop()
        group = await joined(engine, store)
        await session_open(engine)
        first = asyncio.ensure_future(engine.post("/update_weights_from_distributed", small))
        second = asyncio.ensure_future(engine.post("/update_weights_from_distributed", large))
        done, _ = await asyncio.wait([second], timeout=10)
        assert done, "the second receive was not refused"
        refused_as(second.result(), 409, "state: receiving")
        sent = torch.full([64], 1.5)
        await loop.run_in_executor(None, broadcast_each, group, [sent])  # the first's bytes
        assert (await first)[0] == 200
        assert await engine.get("/health") == 200

    with_engine(body)


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_twenty_bodies_of_60_mb_at_once_keep_memory_bounded() -> None:
    """20 concurrent 60 MB bodies took the engine to 1.9 GB before (each refused only after
    it was read): past the bytes in flight they are refused before reading, and the engine's
    memory grows by less than half of what they hold."""

    async def body(engine: Engine) -> None:
        big = b'{"rid": "' + b"r" * (60 * 1024**2) + b'"}'
        headers = {"Content-Type": "application/json"}
        before = _rss_bytes()

        async def send() -> int:
            async with engine.http.post(engine.url + "/generate", data=big, headers=headers) as r:
                return r.status

        statuses = await asyncio.gather(*(send() for _ in range(20)))
        grew = _rss_bytes() - before
        assert statuses.count(503) >= 10, statuses
        assert grew < 20 * len(big) // 2, f"grew by {grew / 1024**2:.0f} MiB"
        assert await engine.get("/health") == 200

    with_engine(body)


def test_a_receive_left_behind_on_an_older_group_does_not_hold_the_engine() -> None:
    """An update the client abandoned leaves its receive waiting out the group's timeout;
    once the client joined a newer group, that receive no longer holds the engine: the new
    group's load, the stamp and the session's end go through."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    async def body(engine: Engine) -> None:
        loop = asyncio.get_running_loop()
        old = await joined(engine, store, "old")
        await session_open(engine)
        stuck = asyncio.ensure_future(
            engine.post("/update_weights_from_distributed", {**BUCKET, "group_name": "old"})
        )
        while engine.server.state is not EngineState.RECEIVING:
            await asyncio.sleep(0.01)
        new = await joined(engine, store, "new")
        load = asyncio.ensure_future(
            engine.post("/update_weights_from_distributed", {**BUCKET, "group_name": "new"})
        )
        sent = torch.full([64], 4.0)
        await loop.run_in_executor(None, broadcast_each, new, [sent])
        assert (await load)[0] == 200
        assert (await engine.post("/update_weight_version", {"new_version": "5"}))[0] == 200
        assert (await engine.post("/end_weight_update"))[0] == 200
        await loop.run_in_executor(None, broadcast_each, old, [torch.zeros(64)])  # it ends late
        refused_as(await stuck, 400, "Failed to receive weights")  # and loads nothing stale
        norm = dict(engine.server.model.named_parameters())[NORM].detach()
        assert torch.equal(norm, sent)

    with_engine(body)
