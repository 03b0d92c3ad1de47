"""Generation as engines do it, in the simulator (docs/generation.md): a cap on running
requests with a queue behind it, the KV pool that lowers the cap, the decode law, the
prefill the prefix cache saves, and a heavier tail of response lengths.

Requests of one length (a lognormal of tiny sigma cut at response_tokens_max) make every
time exact, so each expectation below is a closed form, not a tolerance.

    python tests/test_generation_model.py    # the worked example's table (docs/generation.md)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from miles_core.backend import EngineFailure, GenerateRequest, GenerateResult
from miles_core.errors import ConfigError
from miles_core.kinds import PauseMode
from miles_core.loop.config import LoopConfig
from miles_core.scenario import TimeModel, WorldShape, scenario_from_toml
from miles_core.scenario.liveness import response_length_quantiles, step_parts
from sim.run import run_scenario
from sim.world.cluster import SimCluster
from sim.world.engine import EngineHandle
from sim.world.engine_batch import DecodeClock
from sim.world.runtime import SimRuntime

LENGTH = 100.0
FIXED = TimeModel(
    response_tokens_mean=200.0,
    response_tokens_sigma=0.01,
    response_tokens_max=LENGTH,  # every response is LENGTH tokens
    concurrency_slowdown=0.0,
)
"""Requests of LENGTH tokens at 0.01 s each and no slowdown: one takes 1 s alone."""

EXAMPLE = TimeModel(
    prompt_tokens=1024.0,
    response_tokens_mean=2048.0,
    response_tokens_sigma=0.01,
    response_tokens_max=1024.0,
    engine_gpu_memory_bytes=80e9,
    model_weight_bytes_per_gpu=16e9,
    kv_bytes_per_token=147456.0,
    decode_step_fixed_seconds=0.007,
    decode_step_seconds_per_request=2.5e-5,
    decode_step_seconds_per_kv_token=5e-8,
)
"""docs/generation.md's worked example: an 8B model (Qwen3-8B's KV: 36 layers x 8 KV heads
x 128 x 2 x 2 bytes) on an 80 GB GPU, prompts of 1024 tokens and responses of 1024."""
UNCAPPED = dataclasses.replace(
    EXAMPLE, engine_gpu_memory_bytes=0.0, model_weight_bytes_per_gpu=0.0, kv_bytes_per_token=0.0
)
"""The example without its KV pool: no cap at all."""
BATCHES = (1, 8, 64, 256)


def _run(
    timing: TimeModel,
    n: int,
    world: WorldShape | None = None,
    control: Callable[[SimRuntime, EngineHandle], Coroutine[Any, Any, None]] | None = None,
    prompts: Callable[[int], int] = lambda i: i,
) -> tuple[list[GenerateResult], float]:
    """``n`` requests sent at once to one engine (``control`` beside them): their results
    and the time the last ended."""
    rt = SimRuntime(0)
    cluster = SimCluster(rt, world or WorldShape(num_engines=1), timing)
    engine = cluster.engines["engine-0"]

    async def main() -> list[GenerateResult]:
        tasks = [
            rt.spawn(engine.generate(0, GenerateRequest(i, prompts(i), 0)), f"r{i}", eager=True)
            for i in range(n)
        ]
        if control is not None:
            await control(rt, cluster.engine("engine-0", 0))
        return [await task for task in tasks]

    results = rt.run(main())
    return results, rt.now()


def _latencies(results: list[GenerateResult]) -> list[float]:
    return [r.engine_seconds for r in results if r.engine_seconds is not None]


# -- 1. a cap on running requests --------------------------------------------------------------


def test_a_cap_makes_requests_queue_first_come_first_served() -> None:
    """Four slots: request i starts in wave i // 4, so it ends at (i // 4 + 1) s; the
    throughput stays at four requests a second past the cap and the latency grows."""
    capped = dataclasses.replace(FIXED, max_running_requests=4)
    throughput, mean_latency = [], []
    for n in (1, 2, 4, 8, 16):
        results, end = _run(capped, n)
        latencies = _latencies(results)
        assert latencies == pytest.approx([i // 4 + 1.0 for i in range(n)], rel=1e-9)
        throughput.append(n / end)
        mean_latency.append(sum(latencies) / n)
    assert throughput == pytest.approx([1, 2, 4, 4, 4], rel=1e-9)
    assert mean_latency == pytest.approx([1, 1, 1, 1.5, 2.5], rel=1e-9)
    uncapped, end = _run(FIXED, 16)
    assert end == pytest.approx(1.0) and max(_latencies(uncapped)) == pytest.approx(1.0)


def test_a_retracted_request_goes_to_the_back_of_the_queue() -> None:
    """One slot, two requests: a retract pause at 0.5 s puts the first behind the second
    (SGLang appends retracted requests to its waiting queue), and it pays its recompute."""
    capped = dataclasses.replace(FIXED, max_running_requests=1)

    async def control(rt: SimRuntime, engine: EngineHandle) -> None:
        await rt.sleep(0.5)
        await engine.pause(PauseMode.RETRACT)
        await rt.sleep(1.0)
        await engine.resume()

    results, _ = _run(capped, 2, control=control)
    first, second = _latencies(results)
    recompute = (capped.prompt_tokens + 50) * capped.prefill_seconds_per_token
    assert second == pytest.approx(1.5 + 1.0, rel=1e-9)  # resumed at 1.5 s, first in line
    assert first == pytest.approx(2.5 + recompute + 0.5, rel=1e-9)
    assert not any(r.aborted for r in results)


def test_an_abort_reaches_the_requests_in_the_queue() -> None:
    capped = dataclasses.replace(FIXED, max_running_requests=1)

    async def control(rt: SimRuntime, engine: EngineHandle) -> None:
        await rt.sleep(0.5)
        await engine.pause(PauseMode.ABORT)
        await engine.resume()

    results, end = _run(capped, 3, control=control)
    assert all(r.aborted for r in results) and end == pytest.approx(0.5)


# -- 2. the KV pool ---------------------------------------------------------------------------


def test_the_kv_pool_sets_the_cap_and_long_context_lowers_it() -> None:
    """(80 GB x 0.88 - 16 GB) / 147456 B = 368923 tokens of KV; at 1024 + 1024 reserved a
    request that is 180 of them, at 1024 + 32768 it is 10; max_running_requests caps too."""
    assert EXAMPLE.kv_tokens() == 368923
    assert EXAMPLE.running_cap() == 180
    long = dataclasses.replace(EXAMPLE, response_tokens_max=32768.0)
    assert long.running_cap() == 10
    assert dataclasses.replace(EXAMPLE, max_running_requests=64).running_cap() == 64
    assert dataclasses.replace(long, max_running_requests=64).running_cap() == 10


def test_a_long_context_makes_the_engine_run_fewer_requests_at_once() -> None:
    """A KV pool for 3 requests of 356 reserved tokens: 7 requests run in 3 waves."""
    timing = dataclasses.replace(
        FIXED,
        prompt_tokens=256.0,
        engine_gpu_memory_bytes=1100.0,
        mem_fraction_static=1.0,
        kv_bytes_per_token=1.0,
    )
    assert timing.running_cap() == 3
    results, end = _run(timing, 7)
    assert end == pytest.approx(3.0)
    assert _latencies(results) == pytest.approx([1, 1, 1, 2, 2, 2, 3], rel=1e-9)


# -- 3. the decode law ------------------------------------------------------------------------


def _law_makespan(timing: TimeModel, n: int, tokens: float) -> float:
    """n requests of ``tokens`` decoded together from their prompts, by the law's integral."""
    start = (
        timing.decode_step_fixed_seconds
        + timing.decode_step_seconds_per_request * n
        + timing.decode_step_seconds_per_kv_token * n * timing.prompt_tokens
    )
    return tokens * (start + timing.decode_step_seconds_per_kv_token * n * tokens / 2)


def example_throughput(timing: TimeModel = EXAMPLE) -> dict[int, float]:
    """Tokens a second one engine makes for n requests sent at once, simulated."""
    out = {}
    for n in BATCHES:
        results, end = _run(timing, n)
        assert not any(r.aborted for r in results)
        out[n] = n * timing.response_tokens_max / end
    return out


def test_the_decode_law_gives_throughput_that_rises_then_flattens() -> None:
    measured = example_throughput(UNCAPPED)
    for n, rate in measured.items():
        expected = n * UNCAPPED.response_tokens_max / _law_makespan(UNCAPPED, n, 1024.0)
        assert rate == pytest.approx(expected, rel=1e-9), n
    assert list(measured.values()) == pytest.approx([140.81, 1023.75, 4735.4, 7743.3], rel=1e-4)
    rates = list(measured.values())
    gains = [b / a for a, b in itertools.pairwise(rates)]
    assert all(g > 1 for g in gains) and gains[-1] < 2 < gains[0]  # x8, then x4: less
    ceiling = 1 / (2.5e-5 + 5e-8 * 1536)  # per request and per KV token of the mean context
    assert rates[-1] < ceiling and rates[-1] > 0.75 * ceiling


def test_the_kv_cap_holds_the_example_at_180_running() -> None:
    """256 requests with 180 slots: a wave of 180, then one of 76."""
    _, end = _run(EXAMPLE, 256)
    expected = _law_makespan(EXAMPLE, 180, 1024.0) + _law_makespan(EXAMPLE, 76, 1024.0)
    assert end == pytest.approx(expected, rel=1e-9)
    assert 256 * 1024 / end == pytest.approx(6390.3, rel=1e-5)


def test_the_token_time_follows_the_batch_as_it_changes() -> None:
    """Steps of 0.01 s + 0.01 s a request: A alone makes 25 tokens by 0.5 s, when B joins;
    both then make a token each 0.03 s, A its last 75 by 2.75 s; B, alone again, makes its
    last 25 at 0.02 s each and ends at 3.25 s (2.75 s after it was sent)."""
    law = dataclasses.replace(FIXED, decode_step_fixed_seconds=0.01)
    law = dataclasses.replace(law, decode_step_seconds_per_request=0.01)
    rt = SimRuntime(0)
    engine = SimCluster(rt, WorldShape(num_engines=1), law).engines["engine-0"]

    async def main() -> list[GenerateResult]:
        first = rt.spawn(engine.generate(0, GenerateRequest(0, 0, 0)), "a")
        await rt.sleep(0.5)
        second = rt.spawn(engine.generate(0, GenerateRequest(1, 1, 0)), "b")
        return [await first, await second]

    assert _latencies(rt.run(main())) == pytest.approx([2.75, 2.75], rel=1e-9)
    assert rt.now() == pytest.approx(3.25, rel=1e-9)


def test_the_smooth_context_is_within_one_prompt_token_of_the_discrete_steps() -> None:
    """The clock treats the context as growing smoothly within a step; the discrete sum of
    steps differs by per_kv_token x n / 2 a step, under 1 / prompt_tokens of the time."""
    for n, tokens in ((1, 1024.0), (64, 1024.0), (256, 8192.0)):
        rt = SimRuntime(0)
        clock = DecodeClock(rt, EXAMPLE, 0.0)
        clock.context = n * EXAMPLE.prompt_tokens
        clock.members = dict.fromkeys(range(n), 0.0)  # type: ignore[arg-type]
        smooth = clock.seconds_for(tokens)
        start, growth = clock._start()
        discrete = sum(start + growth * j for j in range(int(tokens)))
        assert abs(smooth - discrete) / discrete < 1 / EXAMPLE.prompt_tokens
        assert clock.steps_in(smooth) == pytest.approx(tokens, rel=1e-12)


def test_the_token_pace_floors_the_step() -> None:
    """engine_token_seconds is a floor on a step's time under the law too."""
    law = dataclasses.replace(FIXED, decode_step_fixed_seconds=0.001)
    results, _ = _run(law, 1, world=WorldShape(num_engines=1, engine_token_seconds=0.05))
    assert _latencies(results) == pytest.approx([LENGTH * 0.05])
    clock = DecodeClock(SimRuntime(0), EXAMPLE, 0.0075)
    clock.context, clock.members = 1024.0, {0: 0.0}  # type: ignore[dict-item]
    for seconds in (0.5, 50.0, 100.0, 500.0):  # across the floor's end (8476 steps, 64 s)
        assert clock.seconds_for(clock.steps_in(seconds)) == pytest.approx(seconds, rel=1e-12)


def test_a_retract_under_the_law_keeps_the_tokens_so_far() -> None:
    law = dataclasses.replace(FIXED, decode_step_fixed_seconds=0.01)

    async def control(rt: SimRuntime, engine: EngineHandle) -> None:
        await rt.sleep(0.25)
        await engine.pause(PauseMode.RETRACT)
        await rt.sleep(1.0)
        await engine.stamp(1, abort_all_requests=False)
        await engine.resume()

    results, _ = _run(law, 1, control=control)
    recompute = (law.prompt_tokens + 25) * law.prefill_seconds_per_token
    assert _latencies(results) == pytest.approx([1.0 + 1.0 + recompute], rel=1e-9)
    assert results[0].versions == (None, 1)


class _OneKill:
    """A mid_generation kill armed until it fires once (test_sim_engine.py's)."""

    def __init__(self) -> None:
        self.cluster: SimCluster | None = None
        self.fired_at: list[float] = []

    def armed(self, point: object, **where: object) -> bool:
        return not self.fired_at

    def fire(self, point: object, **where: object) -> bool:
        assert self.cluster is not None
        self.fired_at.append(self.cluster.rt.now())
        self.cluster.kill_engine(str(where["engine"]))
        return True


def test_a_kill_strikes_halfway_under_the_law_and_fails_the_queue_too() -> None:
    """Under the law and a cap of one, the first request is killed at 0.5 s (halfway through
    its 1 s); the one queued behind it fails with it, and the clock's batch empties."""
    law = dataclasses.replace(FIXED, decode_step_fixed_seconds=0.01, max_running_requests=1)
    rt, faults = SimRuntime(0), _OneKill()
    cluster = SimCluster(rt, WorldShape(num_engines=1), law, faults=faults)  # type: ignore[arg-type]
    faults.cluster = cluster
    engine = cluster.engines["engine-0"]

    async def one(i: int) -> str:
        try:
            await engine.generate(0, GenerateRequest(i, i, 0))
        except EngineFailure as failure:
            return failure.reason
        return "completed"

    async def main() -> list[str]:
        tasks = [rt.spawn(one(i), f"r{i}", eager=True) for i in range(2)]
        return [await task for task in tasks]

    clock = engine._clock
    assert rt.run(main()) == [
        "killed mid-generation",
        "killed while the request waited in the queue",
    ]
    assert faults.fired_at == [pytest.approx(0.5, rel=1e-9)]
    assert clock is not None and not clock.members


# -- 4. the prefill ---------------------------------------------------------------------------


@pytest.mark.parametrize("law", [False, True])
def test_the_prefix_cache_saves_the_first_prefill(law: bool) -> None:
    """Two requests for one prompt, one after the other: with every prefill charged the
    first pays prompt_tokens x prefill_seconds_per_token (1 s here); the second pays it
    unless the prefix cache hands it the prompt's KV."""
    timing = dataclasses.replace(
        FIXED, charge_every_prefill=True, prompt_tokens=1000.0, prefill_seconds_per_token=0.001
    )
    if law:
        timing = dataclasses.replace(timing, decode_step_fixed_seconds=0.01)
    one = dataclasses.replace(timing, max_running_requests=1)
    for cache, second in (("off", 2.0), ("shared", 1.0), ("by_version", 1.0)):
        world = WorldShape(num_engines=1, prefix_cache=cache)
        results, _ = _run(one, 2, world=world, prompts=lambda i: 7)
        latencies = _latencies(results)
        assert latencies[0] == pytest.approx(2.0), cache
        assert latencies[1] - latencies[0] == pytest.approx(second), cache
    today, _ = _run(dataclasses.replace(one, charge_every_prefill=False), 2, prompts=lambda i: 7)
    assert _latencies(today) == pytest.approx([1.0, 2.0])  # no first prefill charged


# -- 5. the tail ------------------------------------------------------------------------------


def test_a_share_run_to_the_cap_moves_p99_and_the_engine_draws_it() -> None:
    base = TimeModel(response_tokens_mean=2048.0, response_tokens_sigma=0.5)
    base = dataclasses.replace(base, response_tokens_max=8192.0, concurrency_slowdown=0.0)
    plain = response_length_quantiles(base)
    assert (round(plain.p50, 1), round(plain.p99, 1), plain.max) == (1807.4, 5783.7, 8192.0)
    tail = response_length_quantiles(dataclasses.replace(base, response_tokens_max_fraction=0.02))
    assert (round(tail.p50, 1), tail.p99, tail.max) == (1830.6, 8192.0, 8192.0)
    uncapped = response_length_quantiles(dataclasses.replace(base, response_tokens_max=0.0))
    assert uncapped.max == math.inf and uncapped.p99 == pytest.approx(5783.7, abs=0.1)

    def drawn(fraction: float) -> list[float]:
        timing = dataclasses.replace(base, response_tokens_max_fraction=fraction)
        results, _ = _run(timing, 4000)
        return sorted(s / timing.decode_seconds_per_token for s in _latencies(results))

    for fraction, quantiles in ((0.0, plain), (0.02, tail)):
        lengths = drawn(fraction)
        assert lengths[1999] == pytest.approx(quantiles.p50, rel=0.03)
        assert lengths[3959] == pytest.approx(quantiles.p99, rel=0.05)
        at_cap = sum(abs(length - 8192.0) < 1e-6 for length in lengths) / len(lengths)
        beyond = 0.00126  # the lognormal's own share past 8192: z = (ln 4 + 0.125) / 0.5
        assert at_cap == pytest.approx(fraction + (1 - fraction) * beyond, abs=0.006)


# -- the liveness bound and the file format ---------------------------------------------------


def test_the_liveness_bound_counts_the_waves_a_cap_makes() -> None:
    """One engine, 64 requests, 8 slots: the nominal rollout is 8 waves of a p99 request at
    8 running, and the simulated rollout fits in it."""
    loop = LoopConfig(steps=1, rollout_batch_size=64, n_samples_per_prompt=1)
    world = WorldShape(num_engines=1)
    for timing in (
        dataclasses.replace(FIXED, max_running_requests=8, concurrency_slowdown=0.02),
        dataclasses.replace(FIXED, max_running_requests=8, decode_step_fixed_seconds=0.01),
        dataclasses.replace(EXAMPLE, max_running_requests=8, charge_every_prefill=True),
    ):
        parts = step_parts(world, timing, loop)
        prefill = (timing.prompt_tokens + timing.response_tokens_max) * 0.0002
        rollout = parts["rollout"] - prefill
        _, end = _run(timing, 64, world=world)
        assert end <= rollout * (1 + 1e-12) and rollout < 1.2 * end
    plain = step_parts(world, FIXED, loop)["rollout"]
    capped = step_parts(world, dataclasses.replace(FIXED, max_running_requests=8), loop)
    prefill = (FIXED.prompt_tokens + LENGTH) * FIXED.prefill_seconds_per_token
    assert capped["rollout"] - prefill == pytest.approx(8 * (plain - prefill), rel=1e-12)


SCENARIO = """
name = "engine_batch_cap"
[sim]
max_running_requests = 4
decode_step_fixed_seconds = 0.005
decode_step_seconds_per_request = 0.0005
decode_step_seconds_per_kv_token = 1e-6
charge_every_prefill = true
prefix_cache = "shared"
response_tokens_max = 512.0
response_tokens_max_fraction = 0.05
engine_gpu_memory_bytes = 8e9
model_weight_bytes_per_gpu = 1e9
kv_bytes_per_token = 1e6
[loop]
steps = 4
mode = "{loop}"
pause_generation_mode = "{mode}"
"""


@pytest.mark.parametrize("mode", ["retract", "in_place", "abort"])
def test_a_scenario_file_sets_the_model_and_every_oracle_passes(mode: str) -> None:
    loop = "one_step_off" if mode == "abort" else "fully_async"  # abort would kill every request
    scenario = scenario_from_toml(SCENARIO.format(mode=mode, loop=loop), "engine_batch_cap.toml")
    timing = scenario.timing
    assert timing.running_cap() == 4 and timing.batch_law() and timing.charge_every_prefill
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()


BAD = [
    ("max_running_requests", -1, "integer >= 0"),
    ("max_running_requests", 2.5, "integer"),
    ("max_running_requests", True, "integer"),
    ("mem_fraction_static", 1.5, "(0, 1]"),
    ("mem_fraction_static", 0, "> 0"),
    ("decode_step_fixed_seconds", -0.1, ">= 0"),
    ("decode_step_seconds_per_kv_token", float("nan"), "finite"),
    ("charge_every_prefill", 1, "true or false"),
    ("response_tokens_max_fraction", 0.1, "response_tokens_max"),
    ("kv_bytes_per_token", 1000.0, "engine_gpu_memory_bytes"),
    ("model_weight_bytes_per_gpu", 1e9, "engine_gpu_memory_bytes"),
    ("engine_gpu_memory_bytes", 80e9, "kv_bytes_per_token"),
]


@pytest.mark.parametrize(("key", "value", "words"), BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_bad_values_are_refused_naming_the_key(key: str, value: Any, words: str) -> None:
    text = f"[sim]\n{key} = {_toml(value)}\n"
    with pytest.raises(ConfigError) as caught:
        scenario_from_toml(text, "bad.toml")
    assert caught.value.field == f"[sim].{key}", str(caught.value)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"response_tokens_max": 100.0, "response_tokens_max_fraction": 1.0}, "below 1"),
        ({"engine_gpu_memory_bytes": 80e9, "kv_bytes_per_token": 1e5}, "response_tokens_max"),
        (
            {"engine_gpu_memory_bytes": 1e6, "kv_bytes_per_token": 1e5, "response_tokens_max": 64},
            "holds 8 tokens",
        ),
    ],
)
def test_keys_that_need_each_other_name_the_one_that_asked(keys: dict, words: str) -> None:
    text = "[sim]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items())
    with pytest.raises(ConfigError) as caught:
        scenario_from_toml(text, "bad.toml")
    asked = next(k for k in keys if k != "response_tokens_max")
    assert caught.value.field == f"[sim].{asked}", str(caught.value)
    assert words in str(caught.value)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "nan" if isinstance(value, float) and math.isnan(value) else repr(value)


def example_table() -> list[str]:
    """The worked example's table (docs/generation.md), as markdown rows: simulated tokens
    a second at each batch sent at once, with no cap and under the KV pool's cap of 180."""
    free, capped = example_throughput(UNCAPPED), example_throughput(EXAMPLE)
    rows = [
        "| requests sent | step at the mean context (s) | tokens/s, no cap | tokens/s, KV cap |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for n in BATCHES:
        step = 0.007 + 2.5e-5 * n + 5e-8 * 1536 * n
        rows.append(f"| {n} | {step:.5f} | {free[n]:.1f} | {capped[n]:.1f} |")
    return rows


def test_the_docs_worked_example_is_what_the_simulator_gives() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "generation.md").read_text()
    for row in example_table():
        assert row in doc, row
    numbers = (
        f"{EXAMPLE.kv_tokens()} tokens",
        f"{EXAMPLE.running_cap()} requests",
        f"{dataclasses.replace(EXAMPLE, response_tokens_max=32768.0).running_cap()} requests",
    )
    for number in numbers:
        assert number in doc, number


def main() -> None:
    print(f"KV pool: {EXAMPLE.kv_tokens()} tokens, cap {EXAMPLE.running_cap()} running")
    print("\n".join(example_table()))


if __name__ == "__main__":
    main()
