"""The lying_engine fault (tokenspeed #1373) on the CPU engine: a load answers 200, success,
and the weights keep their bytes; the checksum the world reads is computed from those
bytes (sha256 of every parameter, /testbed/weights_checksum and SGLang's /weights_checker
``checksum``), so it is the tensors, not the fault's own flag, that give the engine away.

One EngineServer on loopback in this process, a two-member gloo group (tests/
test_engine_states.py's helpers), one bucket broadcast for real.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

import torch
import torch.distributed as dist

from backends.common.training.policy import checksum, checksum_of
from backends.common.wire.groups import broadcast_each
from tests.test_engine_states import BUCKET, NORM, Engine, joined, session_open, with_engine


async def _checksum(engine: Engine) -> str:
    async with engine.http.get(engine.url + "/testbed/weights_checksum") as reply:
        return str(json.loads(await reply.text())["checksum"])


async def _load(engine: Engine, group: Any, sent: torch.Tensor) -> tuple[int, dict[str, Any]]:
    """One bucket (NORM) broadcast to the engine; its answer."""
    load = asyncio.ensure_future(engine.post("/update_weights_from_distributed", BUCKET))
    await asyncio.get_running_loop().run_in_executor(None, broadcast_each, group, [sent])
    return await load


def _norm(engine: Engine) -> torch.Tensor:
    return dict(engine.server.model.named_parameters())[NORM].detach().clone()


def test_a_lying_engine_answers_success_and_its_checksum_is_its_old_bytes() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)

    async def body(engine: Engine) -> None:
        group = await joined(engine, store)
        await session_open(engine)
        honest = torch.full([64], 2.5)
        assert (await _load(engine, group, honest))[0] == 200
        assert torch.equal(_norm(engine), honest)  # an honest load changes the bytes
        before, held = await _checksum(engine), _norm(engine)
        engine.server.lie()  # the fault injector's hook (an actor call in the Ray world)
        status, reply = await _load(engine, group, torch.full([64], 7.0))
        assert status == 200 and reply["success"] is True  # it says it loaded
        assert torch.equal(_norm(engine), held)  # it loaded nothing
        after = await _checksum(engine)
        assert after == before == checksum(engine.server.model)  # the bytes it holds
        sent = dict(engine.server.model.named_parameters()) | {NORM: torch.full([64], 7.0)}
        assert after != checksum_of(sent.items())  # the trainer's would differ

    with_engine(body)


def test_the_checksum_follows_the_tensors_not_the_flag() -> None:
    """The planted check: the flag alone moves no checksum; a byte changed under it, with
    no load and no flag, does, in both the testbed's checksum and SGLang's checker."""

    async def body(engine: Engine) -> None:
        first = await _checksum(engine)
        status, checked = await engine.post("/weights_checker", {"action": "checksum"})
        assert status == 200
        engine.server.weights.lying = True
        assert await _checksum(engine) == first  # the flag is not read
        with torch.no_grad():
            dict(engine.server.model.named_parameters())[NORM][0] += 1.0
        assert await _checksum(engine) != first
        again = (await engine.post("/weights_checker", {"action": "checksum"}))[1]
        assert again["per_engine_checksum"] != checked["per_engine_checksum"]

    with_engine(body)
