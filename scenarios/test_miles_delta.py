"""disk-delta weight transfer in the simulator (sim/world/delta_transport.py): both encodings
run clean under both profiles; each fault is caught, by the engine's checksum (a torn file:
the pull refused, the history shows it) or by the weights oracle from what the engine
loaded (a skip; xor applied twice past the check); overwrite applied twice is harmless."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError
from miles_core.events import History, UpdateAborted, WeightsChecked
from miles_core.profile import MilesProfile
from miles_core.scenario import Scenario
from miles_core.scenario.files import load_scenario_file
from miles_core.transfer import TransferMode
from miles_core.witness.delta import PULL_REFUSED
from sim.run import SimResult, run_scenario

FILES = Path(__file__).parent / "files"


def of(history: History, kind: type) -> list[Any]:
    return [e for e in history if isinstance(e, kind)]


def load(name: str, **loop: Any) -> Scenario:
    scenario = load_scenario_file(FILES / name)
    if loop:
        scenario = dataclasses.replace(scenario, loop=dataclasses.replace(scenario.loop, **loop))
    return scenario


def run(scenario: Scenario, seed: int = 0) -> SimResult:
    return run_scenario(scenario, seed)


def failing(result: SimResult) -> set[str]:
    return {name for name, v in result.verdicts.items() if v is not None}


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize("profile", list(MilesProfile))
def test_no_fault_is_clean_and_every_load_is_the_trainers(encoding: str, profile: str) -> None:
    """miles at 31f1ca9 has disk-delta too, so both profiles run it; each engine's stamp
    reads what it loaded (WeightsChecked), equal to the trainer's every time."""
    scenario = load(
        "disk_delta_xor.toml", update_weight_delta_encoding=encoding, miles_profile=profile
    )
    result = run(scenario)
    assert not failing(result), result.failures()
    checks = of(result.history, WeightsChecked)
    assert {(c.engine, c.version) for c in checks} == {
        (e, v) for e in ("engine-0", "engine-1") for v in range(1, scenario.loop.steps + 1)
    }
    assert all(c.checksum == c.trainer_checksum for c in checks)


def test_xor_applied_twice_reverts_and_only_the_weights_oracle_sees_it() -> None:
    result = run(load("disk_delta_faults/xor_applied_twice.toml"))
    assert failing(result) == {"published_weights"}, result.failures()
    violation = result.verdicts["published_weights"]
    assert violation is not None and "engine-1's weights at version 2" in violation.message
    (bad,) = [c for c in of(result.history, WeightsChecked) if c.checksum != c.trainer_checksum]
    assert (bad.engine, bad.checksum, bad.trainer_checksum) == ("engine-1", "sim:v1", "sim:v2")
    # its next pull applies version 3 onto version 1's bytes: that one the checksum refuses
    refusals = [a for a in of(result.history, UpdateAborted) if PULL_REFUSED in a.reason]
    assert refusals and "bytes of 1, not 2" in refusals[0].reason


def test_overwrite_applied_twice_is_idempotent() -> None:
    result = run(load("disk_delta_overwrite_applied_twice.toml"))
    assert not failing(result), result.failures()
    assert not [a for a in of(result.history, UpdateAborted) if PULL_REFUSED in a.reason]


def test_the_same_fault_under_xor_fails_where_overwrite_passes() -> None:
    """The overwrite file with xor: the oracle fails (the test above is not vacuous)."""
    result = run(
        load("disk_delta_overwrite_applied_twice.toml", update_weight_delta_encoding="xor")
    )
    assert "published_weights" in failing(result)


def test_a_skipped_delta_is_caught_by_the_weights_oracle_and_healed_by_the_chain() -> None:
    result = run(load("disk_delta_faults/skipped.toml"))
    assert failing(result) == {"published_weights"}, result.failures()
    bad = [c for c in of(result.history, WeightsChecked) if c.checksum != c.trainer_checksum]
    assert [(c.engine, c.version) for c in bad] == [("engine-0", 2)]
    later = [c for c in of(result.history, WeightsChecked) if c.version == 3]
    assert later and all(c.checksum == c.trainer_checksum for c in later)  # the chain caught up


def test_a_torn_delta_is_refused_by_the_engines_checksum_and_nothing_wrong_is_served() -> None:
    result = run(load("disk_delta_torn.toml"))
    assert not failing(result), result.failures()
    refusals = [a for a in of(result.history, UpdateAborted) if PULL_REFUSED in a.reason]
    assert refusals and "torn delta file" in refusals[0].reason
    assert all(c.checksum == c.trainer_checksum for c in of(result.history, WeightsChecked))


@pytest.mark.parametrize(
    "name", ["disk_delta_faults/xor_applied_twice.toml", "disk_delta_faults/skipped.toml"]
)
def test_without_its_fault_each_failing_file_passes(name: str) -> None:
    scenario = dataclasses.replace(load(name), faults=())
    assert not failing(run(scenario))


def test_a_delta_fault_needs_disk_delta() -> None:
    with pytest.raises(ConfigError, match='transfer_mode = "disk-delta"'):
        load("disk_delta_torn.toml", transfer_mode=TransferMode.BROADCAST)
