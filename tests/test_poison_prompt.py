"""One prompt longer than the engines' context (NeMo-RL #3938): every engine refuses its
requests, and the control plane must blame the request, not the engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.buffer import (
    BufferConfig,
    DataBuffer,
    Fate,
    Group,
    Reason,
    Sample,
    SampleStatus,
    UnusedHandler,
)
from miles_core.events import (
    EngineStateChanged,
    GroupDropped,
    GroupRecycled,
    SampleGenerated,
)
from miles_core.kinds import SampleOutcome
from miles_core.oracles import recycled_regenerated
from miles_core.probes import probes_hit
from miles_core.scenario import load_scenario_file
from sim.run import run_scenario
from sim.search.plants import planted
from sim.search.swarm import swarm_scenario

FILE = Path(__file__).resolve().parents[1] / "scenarios/files/over_long_prompt.toml"


def _refused(history) -> list[SampleGenerated]:
    return [
        e for e in history if isinstance(e, SampleGenerated) and e.outcome is SampleOutcome.REFUSED
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_refused_prompt_is_dropped_and_no_engine_leaves_rotation(seed: int) -> None:
    result = run_scenario(load_scenario_file(FILE), seed)
    assert result.ok, result.failures()
    refused = _refused(result.history)
    assert refused and len({e.prompt_id for e in refused}) == 1
    (dropped,) = [e for e in result.history if isinstance(e, GroupDropped)]
    assert dropped.reason == "refused" and dropped.prompt_id == refused[0].prompt_id
    assert not any(isinstance(e, GroupRecycled) for e in result.history)  # despite retry
    downs = [e for e in result.history if isinstance(e, EngineStateChanged) and not e.up]
    assert downs == []
    assert "request_refused" in probes_hit(result.history)


def test_taken_for_an_engine_failure_the_prompt_goes_round_the_engines() -> None:
    with planted("refused_request_fails_engine"):
        result = run_scenario(load_scenario_file(FILE), 0)
    verdict = result.verdicts["recycled_regenerated"]
    assert verdict is not None and "refused one of its requests" in str(verdict)
    downs = [e for e in result.history if isinstance(e, EngineStateChanged) and not e.up]
    assert len({e.engine for e in downs}) == 2  # both engines taken out by one prompt
    clean = run_scenario(load_scenario_file(FILE), 0)
    assert result.history[-1].t > 5 * clean.history[-1].t  # the run crawled


def test_the_buffer_drops_a_refused_group_under_either_handler() -> None:
    for handler in UnusedHandler:
        buffer = DataBuffer(BufferConfig(rollout_batch_size=1, unused_samples_handler=handler))
        samples = (Sample(0, (1,)), Sample(1, (), SampleStatus.REFUSED))
        verdict = buffer.put(Group(1, 1, samples))
        assert (verdict.fate, verdict.reason) == (Fate.DROP, Reason.REFUSED)


def test_the_oracle_fails_a_refused_group_recycled() -> None:
    """The history alone says it: the world's refusal, then the control plane's recycle."""
    with planted("refused_request_fails_engine"):
        result = run_scenario(load_scenario_file(FILE), 1)
    assert recycled_regenerated(result.history) is not None
    kept = [e for e in result.history if not isinstance(e, GroupRecycled)]
    assert "refused" not in str(recycled_regenerated(type(result.history)(kept)) or "")


def test_without_the_fault_nothing_is_refused() -> None:
    scenario = dataclasses.replace(load_scenario_file(FILE), faults=())
    result = run_scenario(scenario, 0)
    assert result.ok and not _refused(result.history)


def test_the_swarm_draws_an_over_long_prompt() -> None:
    kinds = [{f.kind.value for f in swarm_scenario(s).faults} for s in range(80)]
    assert any("poison_prompt" in k for k in kinds)
