"""The simulated engine keeps the SGLang semantics test_cpu_engine.py checks on the real one.

One request on one engine in virtual time, driven as miles does: paused with a
mode one second in, version set, continued. Virtual time makes the costs exact:
retract pays the prefill of the prompt and the tokens so far, in_place nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from miles_core.backend import (
    EngineFailure,
    GenerateRequest,
    GenerateResult,
    RequestRefused,
    SessionAlreadyOpen,
)
from miles_core.kinds import PauseMode
from miles_core.scenario import TimeModel, WorldShape
from miles_core.transfer import plan_buckets
from sim.world.cluster import SimCluster
from sim.world.engine import EngineHandle
from sim.world.runtime import SimRuntime

TIMING = TimeModel(response_tokens_mean=400.0, response_tokens_sigma=0.01)
PAUSED_AT, RESUMED_AT = 1.0, 3.0
PER_TOKEN = TIMING.decode_seconds_per_token * (1 + TIMING.concurrency_slowdown)
"""One request alone on the engine decodes at this many seconds per token."""


def _world(seed: int = 0) -> tuple[SimRuntime, SimCluster, EngineHandle]:
    rt = SimRuntime(seed)
    cluster = SimCluster(rt, WorldShape(num_engines=1), TIMING)
    return rt, cluster, cluster.engine("engine-0", 0)


def _with_request(
    control: Callable[[SimRuntime, EngineHandle], Coroutine[Any, Any, None]], seed: int = 0
) -> tuple[GenerateResult, float]:
    """A request, ``control`` run beside it; the result and the request's decode seconds."""
    rt, _, engine = _world(seed)

    async def main() -> GenerateResult:
        request = rt.spawn(engine.engine.generate(0, GenerateRequest(0, 0, 0)), "request")
        await control(rt, engine)
        return await request

    return rt.run(main()), PER_TOKEN


def _update(mode: PauseMode, abort_all_requests: bool = False):
    async def control(rt: SimRuntime, engine: EngineHandle) -> None:
        await rt.sleep(PAUSED_AT)
        await engine.pause(mode)
        await rt.sleep(RESUMED_AT - PAUSED_AT)
        await engine.stamp(1, abort_all_requests)
        await engine.resume()

    return control


def _total_tokens() -> float:
    """The request's length: the engine's length stream, drawn the same in every run."""
    rt, _, engine = _world()
    result = rt.run(engine.engine.generate(0, GenerateRequest(0, 0, 0)))
    assert result.engine_seconds is not None
    return result.engine_seconds / PER_TOKEN


@pytest.mark.parametrize("mode", [PauseMode.RETRACT, PauseMode.IN_PLACE])
def test_a_paused_request_continues_and_retract_pays_the_prefill(mode: PauseMode) -> None:
    total = _total_tokens()
    result, per_token = _with_request(_update(mode))
    assert not result.aborted
    assert result.versions == (None, 1) and result.weight_version == 1
    assert result.kept_kv is (mode is PauseMode.IN_PLACE)
    done_at_pause = PAUSED_AT / per_token
    prefill = (TIMING.prompt_tokens + done_at_pause) * TIMING.prefill_seconds_per_token
    recompute = prefill if mode is PauseMode.RETRACT else 0.0
    expected = total * per_token + (RESUMED_AT - PAUSED_AT) + recompute
    assert result.engine_seconds == pytest.approx(expected, rel=1e-9)


def test_abort_mode_ends_the_request() -> None:
    result, _ = _with_request(_update(PauseMode.ABORT))
    assert result.aborted and result.versions == (None,)


@pytest.mark.parametrize("abort_all", [True, False])
def test_the_version_update_aborts_unless_told_not_to(abort_all: bool) -> None:
    result, _ = _with_request(_update(PauseMode.RETRACT, abort_all_requests=abort_all))
    assert result.aborted is abort_all


@pytest.mark.parametrize("seed", range(8))
def test_an_abort_reaches_a_waiting_request_whichever_signal_wakes_it_first(seed: int) -> None:
    """The stamp's abort and the resume right after it wake the retracted request at one
    instant; the seed orders the two. Either way the request was aborted while the engine
    held it (it once went on decoding when the resume woke it first)."""
    result, _ = _with_request(_update(PauseMode.RETRACT, abort_all_requests=True), seed)
    assert result.aborted and result.versions == (None,)


@pytest.mark.parametrize(
    ("mode", "refused"), [(PauseMode.RETRACT, False), (PauseMode.IN_PLACE, True)]
)
def test_flush_is_refused_while_a_frozen_request_holds_kv(mode: PauseMode, refused: bool) -> None:
    outcome: list[str] = []

    async def control(rt: SimRuntime, engine: EngineHandle) -> None:
        await rt.sleep(PAUSED_AT)
        await engine.pause(mode)
        try:
            await engine.flush_cache()
            outcome.append("flushed")
        except RequestRefused as refusal:
            outcome.append(str(refusal))
        await engine.resume()

    _with_request(control)
    assert ("hold KV pages" in outcome[0]) is refused


def test_a_hung_engine_never_answers_a_health_check() -> None:
    rt, cluster, engine = _world()

    async def main() -> str:
        assert await rt.wait_any([rt.spawn(engine.health(), "h"), rt.timer(1.0)]) == 0
        cluster.hang_engine("engine-0")
        check = rt.spawn(engine.health(), "h2")
        return "answered" if await rt.wait_any([check, rt.timer(60.0)]) == 0 else "silent"

    assert rt.run(main()) == "silent"


# -- control calls take a round trip ------------------------------------------------------

REPLY = 0.05


def _engines(n: int, reply: float = REPLY) -> tuple[SimRuntime, SimCluster]:
    rt = SimRuntime(0)
    timing = TimeModel(control_reply_seconds=reply)
    return rt, SimCluster(rt, WorldShape(num_engines=n), timing)


def test_a_control_call_answers_after_its_round_trip_and_the_engine_acts_then() -> None:
    rt, cluster = _engines(1)
    engine = cluster.engine("engine-0", 0)
    seen: list[tuple[float, bool]] = []

    async def main() -> None:
        call = rt.spawn(engine.pause(PauseMode.RETRACT), "pause")
        await rt.sleep(REPLY / 2)
        seen.append((rt.now(), engine.engine.paused))  # on its way: not paused yet
        await call
        seen.append((rt.now(), engine.engine.paused))

    rt.run(main())
    assert seen == [(REPLY / 2, False), (REPLY, True)]


def test_calls_made_at_one_instant_share_one_reply_wait() -> None:
    """An update calls every engine at once: one wait (one SimPy event) answers them all,
    and a call at a later instant gets a wait of its own."""
    rt, cluster = _engines(32)
    handles = [cluster.engine(e, 0) for e in cluster.engine_ids]

    async def main() -> list[float]:
        first = cluster.control_reply()
        assert cluster.control_reply() is first
        ends = []
        for _ in range(2):
            tasks = [rt.spawn(h.resume(), h.id, eager=True) for h in handles]
            await rt.wait_all(tasks)
            ends.append(rt.now())
        assert cluster.control_reply() is not first
        return ends

    assert rt.run(main()) == [REPLY, 2 * REPLY]


def test_a_process_replaced_during_the_round_trip_fails_the_call_and_is_left_alone() -> None:
    """The window between the last bucket and the stamp, in time: the stamp addressed to the
    process that received the buckets fails; the restarted process keeps no version."""
    rt, cluster = _engines(1)
    old = cluster.engine("engine-0", 0)

    async def main() -> str:
        call = rt.spawn(old.stamp(7, False), "stamp")
        await rt.sleep(REPLY / 2)
        cluster.engines["engine-0"].kill()
        cluster.engines["engine-0"].start()
        try:
            await call
        except EngineFailure as failure:
            return failure.reason
        return "answered"

    reason = rt.run(main())
    assert "replaced" in reason
    assert cluster.engines["engine-0"].version is None


def test_with_no_round_trip_a_call_acts_at_once() -> None:
    rt, cluster = _engines(1, reply=0.0)
    engine = cluster.engine("engine-0", 0)

    async def main() -> float:
        await engine.pause(PauseMode.RETRACT)
        return rt.now()

    assert rt.run(main()) == 0.0 and engine.engine.paused


# -- a mid-generation kill strikes the process halfway through a request ------------------


class _OneKill:
    """Fault points with one mid-generation kill armed: it kills the engine when fired."""

    def __init__(self) -> None:
        self.cluster: SimCluster | None = None
        self.fired_at: list[float] = []

    def armed(self, point: object, **where: object) -> bool:
        return not self.fired_at

    def fire(self, point: object, **where: object) -> bool:
        assert self.cluster is not None and not self.fired_at
        self.fired_at.append(self.cluster.rt.now())
        self.cluster.kill_engine(str(where["engine"]))
        return True


def _armed_world() -> tuple[SimRuntime, SimCluster, _OneKill]:
    rt, faults = SimRuntime(0), _OneKill()
    cluster = SimCluster(rt, WorldShape(num_engines=1), TIMING, faults=faults)
    faults.cluster = cluster
    return rt, cluster, faults


def test_the_kill_strikes_halfway_through_the_request_on_its_process() -> None:
    total = _total_tokens()
    rt, cluster, faults = _armed_world()

    async def main() -> str:
        try:
            await cluster.engines["engine-0"].generate(0, GenerateRequest(0, 0, 0))
        except EngineFailure as failure:
            return failure.reason
        return "completed"

    assert rt.run(main()) == "killed mid-generation"
    assert faults.fired_at == [pytest.approx(total * PER_TOKEN / 2, rel=1e-9)]


def test_a_request_that_ends_before_halfway_leaves_the_kill_armed_for_the_next() -> None:
    """An abort before halfway: that request never got there, so the kill does not strike
    then (it struck the process whatever ran on it, even a restarted one, before); the next
    request that gets halfway takes it."""
    rt, cluster, faults = _armed_world()
    engine = cluster.engine("engine-0", 0)

    async def main() -> GenerateResult:
        first = rt.spawn(engine.engine.generate(0, GenerateRequest(0, 0, 0)), "first")
        await rt.sleep(0.1)  # far below halfway (a request takes seconds)
        await engine.pause(PauseMode.ABORT)
        aborted = await first
        assert faults.fired_at == []
        await engine.resume()
        await rt.sleep(1.0)
        with pytest.raises(EngineFailure, match="killed mid-generation"):
            await engine.engine.generate(0, GenerateRequest(1, 1, 0))
        return aborted

    assert rt.run(main()).aborted
    assert len(faults.fired_at) == 1 and faults.fired_at[0] > 1.1


def test_an_adapter_is_unloaded_only_where_it_is_loaded_and_loaded_once() -> None:
    """SGLang's contract that the LoRA plan is held to: unloading an adapter a process does
    not hold is refused ("LoRA adapter ... is not loaded"), and so is loading a name it
    holds; a new process holds none."""
    rt, cluster, handle = _world()
    engine = handle.engine
    outcome: list[str] = []

    async def unload() -> None:
        try:
            await handle.unload_adapter("policy")
            outcome.append("unloaded")
        except RequestRefused as refusal:
            outcome.append(refusal.reason)

    rt.run(unload())
    engine.load_adapter("policy")
    with pytest.raises(RequestRefused, match="LoRA adapter policy is already loaded"):
        engine.load_adapter("policy")
    rt.run(unload())
    assert outcome == ["LoRA adapter policy is not loaded", "unloaded"]
    engine.load_adapter("policy")
    cluster.restart_engine("engine-0")
    assert engine.adapter is None  # the new process starts without it
    engine.load_adapter("policy")


def test_the_update_session_refuses_a_second_begin_and_an_end_with_none_open() -> None:
    """SGLang's session (scheduler_components/weight_updater.py): a second begin is refused
    as SessionAlreadyOpen, an end with no session open is refused, a new process has none."""
    rt, cluster, engine = _world()

    async def main() -> list[str]:
        seen = []
        with pytest.raises(RequestRefused, match="no weight-update session"):
            await engine.end_update()
        await engine.begin_update()
        with pytest.raises(SessionAlreadyOpen):
            await engine.begin_update()
        seen.append("open")
        cluster.restart_engine("engine-0")
        await cluster.engine("engine-0", 1).begin_update()  # the new process has no session
        seen.append("restarted")
        await engine.engine.end_update()
        return seen

    assert rt.run(main()) == ["open", "restarted"]


def test_a_hung_member_stalls_the_broadcast_until_the_timeout_and_is_named() -> None:
    """A collective completes for nobody until every member takes part: the source waits
    the whole collective timeout, then the broadcast fails naming the member that hung."""
    rt = SimRuntime(0)
    cluster = SimCluster(rt, WorldShape(num_engines=3), TIMING, collective_timeout=7.0)
    bucket = plan_buckets(cluster.units, 1 << 40)[0]
    cluster.hang_engine("engine-1")

    async def main() -> tuple[str, float]:
        try:
            engines = dict.fromkeys(cluster.engine_ids, 0)
            await cluster.transport.connect(0, 0, engines)
            await cluster.transport.send_bucket(0, 0, bucket, engines)
        except EngineFailure as failure:
            return failure.engine, rt.now()
        raise AssertionError("the broadcast completed with a hung member")

    engine, when = rt.run(main())
    assert engine == "engine-1" and when == pytest.approx(7.0)
