"""The CPU engine server's /pause_generation with sglang #34185's draft
``abort_below_start_weight_version``: a request whose declared ``start_weight_version`` is
strictly below the threshold ends aborted at the pause, the others are retracted and finish
on resume; the field is refused (400, naming it) with mode abort or a bad type, before the
engine pauses; a request without the field is never dropped by it.

One EngineServer on loopback in this process (tests/test_engine_states.py's harness).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

from backends.common.training.policy import BOS, SEP
from tests.test_engine_states import Engine, refused_as, with_engine

FIELD = "abort_below_start_weight_version"


def _generate(engine: Engine, start: int | None) -> asyncio.Future[Any]:
    body: dict[str, Any] = {
        "input_ids": [BOS, 1, SEP],
        "sampling_params": {"max_new_tokens": 40},
    }
    if start is not None:
        body["start_weight_version"] = start
    return asyncio.ensure_future(engine.post("/generate", body))


async def _all_running(engine: Engine, n: int) -> None:
    jobs = engine.server._jobs
    while len(jobs) < n or not all(job.tokens for job in jobs.values()):
        await asyncio.sleep(0.001)


def test_a_pause_aborts_the_requests_declared_below_and_retracts_the_rest() -> None:
    async def body(engine: Engine) -> None:
        old, fresh, undeclared = _generate(engine, 3), _generate(engine, 5), _generate(engine, None)
        await _all_running(engine, 3)
        assert (await engine.post("/pause_generation", {"mode": "retract", FIELD: 5}))[0] == 200
        assert (await engine.post("/continue_generation"))[0] == 200
        reasons = [
            (await r)[1]["meta_info"]["finish_reason"]["type"] for r in (old, fresh, undeclared)
        ]
        assert reasons == ["abort", "length", "length"]

    with_engine(body, token_seconds=0.005)


def test_the_field_is_refused_with_abort_or_a_bad_type_and_nothing_pauses() -> None:
    async def body(engine: Engine) -> None:
        refused_as(await engine.post("/pause_generation", {"mode": "abort", FIELD: 1}), 400, FIELD)
        refused_as(
            await engine.post("/pause_generation", {"mode": "retract", FIELD: "1"}), 400, FIELD
        )
        assert not engine.server.paused
        refused_as(
            await engine.post(
                "/generate",
                {"input_ids": [BOS, 1, SEP], "start_weight_version": 1.5},
            ),
            400,
            "start_weight_version",
        )

    with_engine(body, token_seconds=0.005)
