"""Field bugs of the engines as scenarios: each fails its oracle with the bug and passes
without it (issue 50, item 9).

tokenspeed #1373 (open): ``/update_weights_from_distributed`` answers success and
transfers nothing. The lying_engine fault makes an engine do that from a step on; the
weights oracle (published_weights) must catch it from what the world reads off the
engine's weights (the simulator: content ids, sim/world/contents.py, under the today
profile; the CPU backend: sha256 of the tensors, tests/test_lying_engine.py and
tests/test_cpu_backend.py ``test_a_lying_engine_is_caught_from_its_bytes_in_both_worlds``),
never from the fault's own flag.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.events import FaultInjected, WeightsChecked
from miles_core.fault_kinds import BY_KIND
from miles_core.kinds import FaultKind
from miles_core.profile import MilesProfile
from miles_core.scenario import load_scenario_file
from miles_core.scenario.model import Scenario
from sim.run import SimResult, run_scenario
from sim.world.contents import held, sent

LYING = Path(__file__).resolve().parent / "files" / "field_bugs" / "lying_engine.toml"


def _failed(result: SimResult) -> set[str]:
    return {name for name, verdict in result.verdicts.items() if verdict is not None}


def _without_faults(scenario: Scenario) -> Scenario:
    return dataclasses.replace(scenario, faults=())


@pytest.mark.parametrize("seed", [0, 1])
def test_a_lying_engine_fails_the_weights_oracle_naming_it_and_the_version(seed: int) -> None:
    scenario = load_scenario_file(LYING)
    result = run_scenario(scenario, seed)
    assert _failed(result) == {BY_KIND[FaultKind.LYING_ENGINE].caught_by}
    verdict = str(result.verdicts["published_weights"])
    assert "engine engine-1's weights at version 2 differ from the trainer's" in verdict
    assert f"checksum {sent(1)} != {sent(2)}" in verdict  # it kept version 1's content
    assert any(isinstance(e, FaultInjected) for e in result.history)


@pytest.mark.parametrize("seed", [0, 1])
def test_without_the_fault_it_passes_and_every_engine_was_checked(seed: int) -> None:
    scenario = _without_faults(load_scenario_file(LYING))
    result = run_scenario(scenario, seed)
    assert result.ok, result.failures()
    checked = [e for e in result.history if isinstance(e, WeightsChecked)]
    assert {(e.engine, e.version) for e in checked} == {
        (engine, version) for engine in ("engine-0", "engine-1") for version in (1, 2, 3)
    }
    assert all(e.checksum == e.trainer_checksum for e in checked)


def test_the_oracle_reads_the_content_not_the_fault() -> None:
    """The planted check: the content id is what the engine loaded; with the fault's flag
    turned on in a world but the engine still loading (a planted 'honest liar'), the
    oracle passes: it never reads the flag. And an engine that loaded two versions'
    buckets answers neither."""
    import sim.world.engine as engine_module

    scenario = load_scenario_file(LYING)
    original = engine_module.SimEngine.load_bucket

    def loads_anyway(self: engine_module.SimEngine, index: int, version: int) -> None:
        self.loaded[index] = version  # the flag set, the load done all the same

    engine_module.SimEngine.load_bucket = loads_anyway  # type: ignore[method-assign]
    try:
        result = run_scenario(scenario, 0)
    finally:
        engine_module.SimEngine.load_bucket = original  # type: ignore[method-assign]
    assert "published_weights" not in _failed(result)
    assert held({0: 2, 1: 2}) == sent(2) and held({0: 2, 1: 1}) not in (sent(1), sent(2))


def test_under_aug2026_the_simulator_reads_no_weights() -> None:
    """The old profile's histories are unchanged: no WeightsChecked in the simulator, so
    the lying engine goes unseen there (the CPU backend reads weights under either)."""
    scenario = load_scenario_file(LYING)
    old = dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    )
    result = run_scenario(old, 0)
    assert not any(isinstance(e, WeightsChecked) for e in result.history)
    assert "published_weights" not in _failed(result)
