"""An engine's prefix cache across weight updates (miles #2782), in both worlds, and the
oracle that holds the KV it hands out to the staleness bound (cached_kv_fresh).

SGLang's radix cache gives a later request the prompt KV an earlier one computed,
whatever weights computed it, until /flush_cache; SGLang reports only how many tokens
it reused. The worlds record which weights those were; the control plane does not see
them, so under in_place (no flush between updates) a recycled prompt regenerated on old
KV passes the staleness filter.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    GroupGot,
    GroupTrained,
    History,
    RunStarted,
    SampleGenerated,
    SampleOutcome,
)
from miles_core.kinds import PauseMode
from miles_core.oracles import cached_kv_fresh
from miles_core.scenario import WorldShape, load_scenario_file
from sim.run import run_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios/files/prefix_cache_across_updates.toml"


def _with_cache(policy: str, **loop: Any):
    scenario = load_scenario_file(FILE)
    world = dataclasses.replace(scenario.world, prefix_cache=policy)
    return dataclasses.replace(
        scenario, world=world, loop=dataclasses.replace(scenario.loop, **loop)
    )


def _samples(history) -> list[SampleGenerated]:
    return [e for e in history if isinstance(e, SampleGenerated)]


# -- the simulator ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_sglangs_shared_cache_under_in_place_trains_tokens_on_stale_kv(seed: int) -> None:
    """Without miles' --namespaced-radix-cache (today's default for fully_async + in_place
    turns it on: tests/test_namespaced_radix_cache.py)."""
    result = run_scenario(_with_cache("shared", namespaced_radix_cache=False), seed)
    failed = {name: v for name, v in result.verdicts.items() if v is not None}
    assert set(failed) == {"cached_kv_fresh"}, failed  # the staleness filter saw nothing
    assert "reused prompt KV computed by version" in str(failed["cached_kv_fresh"])


def test_a_cache_keyed_by_version_reuses_only_under_the_same_weights() -> None:
    result = run_scenario(_with_cache("by_version"), 0)
    assert result.ok, result.failures()
    reused = [e for e in _samples(result.history) if e.cached_versions]
    assert reused  # the n samples of a group share their prompt
    assert all(set(e.cached_versions) <= set(e.all_versions[:1]) for e in reused)


def test_no_cache_reuses_nothing() -> None:
    result = run_scenario(_with_cache("off"), 0)
    assert result.ok and not any(e.cached_versions for e in _samples(result.history))


def test_the_flush_of_each_retract_update_empties_the_shared_cache() -> None:
    """Under retract every update flushes: KV a request reused was computed under the
    weights of one of its own spans, never before the update that preceded it."""
    result = run_scenario(_with_cache("shared", pause_generation_mode=PauseMode.RETRACT), 0)
    assert result.ok, result.failures()
    reused = [e for e in _samples(result.history) if e.cached_versions]
    assert reused and all(set(e.cached_versions) <= set(e.all_versions) for e in reused)


def test_a_prefix_cache_that_is_not_one_of_the_three_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"prefix_cache.*pass one of off, shared, by_version"):
        WorldShape(prefix_cache="radix")


# -- the oracle ------------------------------------------------------------------------------


def _history(cached: tuple[int | None, ...], current: int, bound: int | None, aborted=False):
    sample = SampleGenerated(
        t=1.0,
        group_id=5,
        prompt_id=2,
        sample=0,
        turn=0,
        engine="engine-0",
        incarnation=0,
        version=current,
        versions=(current,),
        cached_versions=cached,
        outcome=SampleOutcome.ABORTED if aborted else SampleOutcome.COMPLETED,
    )
    return History(
        [
            RunStarted(
                t=0.0,
                seed=0,
                scenario="s",
                engines=("engine-0",),
                num_cells=1,
                max_weight_staleness=bound,
            ),
            sample,
            GroupGot(t=2.0, group_id=5, prompt_id=2, current_version=current, staleness=0),
            GroupTrained(t=3.0, group_id=5, prompt_id=2, step=current),
        ]
    )


@pytest.mark.parametrize(
    ("cached", "current", "bound", "fails"),
    [
        ((None,), 3, 1, True),  # the initial weights' KV, three versions on
        ((2,), 3, 1, False),
        ((1,), 3, 1, True),
        ((1,), 3, 2, False),
        ((1,), 3, None, False),  # no bound: nothing to hold it to
        ((), 3, 0, False),  # reused nothing
    ],
)
def test_the_oracle_holds_reused_kv_to_the_staleness_bound(cached, current, bound, fails) -> None:
    verdict = cached_kv_fresh(_history(cached, current, bound))
    assert (verdict is not None) is fails, verdict


def test_the_oracle_ignores_an_aborted_sample() -> None:
    assert cached_kv_fresh(_history((None,), 3, 1, aborted=True)) is None


# -- the CPU engine: real KV reused --------------------------------------------------------

pytest.importorskip("ray", reason="the CPU engine needs the cpu extra (see the README)")

import aiohttp  # noqa: E402
import torch  # noqa: E402

from backends.common.engine.decoding import forward  # noqa: E402
from backends.common.engine.server import EngineServer  # noqa: E402
from backends.common.training.policy import BOS, SEP, PolicyConfig, build_model  # noqa: E402

PROMPT = [BOS, 3, 1, 4, SEP]


def _perturb(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(7)))


def _engine_test(
    policy: str, body: Callable[[EngineServer, Callable[..., Awaitable[Any]]], Awaitable[None]]
) -> None:
    async def main() -> None:
        server = EngineServer("engine-0", PolicyConfig(), prefix_cache=policy)
        port = await server.start()
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:

                async def call(path: str, body: dict[str, Any] | None = None) -> Any:
                    async with http.post(url + path, json=body or {}) as reply:
                        assert reply.status == 200, await reply.text()
                        return await reply.json() if path == "/generate" else None

                await body(server, call)
        finally:
            await server.stop()

    asyncio.run(main())


def _generate(rid: str) -> dict[str, Any]:
    return {"rid": rid, "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}}


async def _twice_across_a_version(server: EngineServer, call) -> tuple[dict, dict]:
    first = (await call("/generate", _generate("a")))["meta_info"]
    _perturb(server.model)
    await call("/update_weight_version", {"new_version": "1"})
    second = (await call("/generate", _generate("b")))["meta_info"]
    return first, second


def test_the_cpu_engines_shared_cache_hands_out_kv_the_old_weights_computed() -> None:
    async def body(server: EngineServer, call) -> None:
        first, second = await _twice_across_a_version(server, call)
        assert first["cached_tokens"] == 0 and first["testbed_cached_versions"] == []
        assert second["cached_tokens"] == len(PROMPT) - 1
        assert second["testbed_cached_versions"] == ["default"]
        assert second["weight_versions"] == ["1"]  # what SGLang reports: the new weights only
        # the first token's logprob is the new weights attending to the old prompt KV
        # (computed here by hand), not a prefill on the new weights
        with torch.no_grad():
            _, kv = forward(build_model(PolicyConfig()), PROMPT[:-1], None)  # initial weights
            on_old_kv, _ = forward(server.model, PROMPT[-1:], kv)
            fresh, _ = forward(server.model, PROMPT, None)
        token = second["output_token_logprobs"][0][1]
        logprob = second["output_token_logprobs"][0][0]
        assert logprob == pytest.approx(float(torch.log_softmax(on_old_kv[0, -1], -1)[token]))
        assert logprob != pytest.approx(float(torch.log_softmax(fresh[0, -1], -1)[token]))

    _engine_test("shared", body)


def test_the_cpu_engines_cache_keyed_by_version_computes_again_after_an_update() -> None:
    async def body(server: EngineServer, call) -> None:
        _, second = await _twice_across_a_version(server, call)
        assert second["cached_tokens"] == 0  # the entry was the initial weights'
        third = (await call("/generate", _generate("c")))["meta_info"]
        assert third["testbed_cached_versions"] == ["1"]  # the entry the second computed

    _engine_test("by_version", body)


def test_the_cpu_engines_flush_drops_the_cache() -> None:
    async def body(server: EngineServer, call) -> None:
        await call("/generate", _generate("a"))
        assert len(server.prefixes) == 1
        await call("/flush_cache")
        again = (await call("/generate", _generate("b")))["meta_info"]
        assert again["cached_tokens"] == 0

    _engine_test("shared", body)


def test_the_cpu_engine_without_a_cache_reuses_nothing() -> None:
    async def body(server: EngineServer, call) -> None:
        _, second = await _twice_across_a_version(server, call)
        assert second["cached_tokens"] == 0 and len(server.prefixes) == 0

    _engine_test("off", body)


def test_sglang_is_launched_with_its_radix_cache_as_the_world_says() -> None:
    from backends.gpu.sglang_engine import launch_command

    assert "--disable-radix-cache" in launch_command(Path("/m"), 1, "off")
    assert "--disable-radix-cache" not in launch_command(Path("/m"), 1, "shared")
    with pytest.raises(ValueError, match=r"prefix_cache.*SGLang cannot do"):
        launch_command(Path("/m"), 1, "by_version")
