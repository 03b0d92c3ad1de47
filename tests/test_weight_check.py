"""The weight check is carried by the world's reports, not a global: the transport's Delivery
carries the trainer's checksum of what the update sends, each engine's stamp answers its
own, and the updater records both (WeightsChecked) for the published_weights oracle.

Run in the simulator with its transport and engine handles taught checksums, as the Ray
world's report them (backends/common/world/fanout.py, engine_slot.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from miles_core.events import EngineStamped, WeightsChecked
from miles_core.profile import MilesProfile
from miles_core.scenario import SCENARIOS
from sim.run import run_scenario
from sim.world.engine import EngineHandle
from sim.world.transport import SimTransport

TRAINER = "t0"


def _with_checksums(monkeypatch: pytest.MonkeyPatch, engine_checksums: dict[str, str]) -> None:
    send, send_each, stamp = (
        SimTransport.send_bucket,
        SimTransport.send_bucket_each,
        EngineHandle.stamp,
    )

    async def send_bucket(self: SimTransport, *args: Any, **kw: Any) -> Any:
        return dataclasses.replace(await send(self, *args, **kw), trainer_checksum=TRAINER)

    async def send_bucket_each(self: SimTransport, *args: Any, **kw: Any) -> Any:
        sent = await send_each(self, *args, **kw)
        return tuple(dataclasses.replace(d, trainer_checksum=TRAINER) for d in sent)

    async def stamped(self: EngineHandle, version: int, abort_all_requests: bool = True) -> str:
        await stamp(self, version, abort_all_requests)
        return engine_checksums[self.id]

    monkeypatch.setattr(SimTransport, "send_bucket", send_bucket)
    monkeypatch.setattr(SimTransport, "send_bucket_each", send_bucket_each)
    monkeypatch.setattr(EngineHandle, "stamp", stamped)


def test_every_stamp_is_checked_against_what_its_update_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_checksums(monkeypatch, {"engine-0": TRAINER, "engine-1": TRAINER})
    result = run_scenario(SCENARIOS["no_failure"], 0)
    checks = [e for e in result.history if isinstance(e, WeightsChecked)]
    stamps = [e for e in result.history if isinstance(e, EngineStamped)]
    assert len(checks) == len(stamps) > 0
    assert {(c.engine, c.version) for c in checks} == {(s.engine, s.version) for s in stamps}
    assert all(c.trainer_checksum == TRAINER == c.checksum for c in checks)
    assert result.verdicts["published_weights"] is None


def test_an_engine_whose_weights_differ_fails_published_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _with_checksums(monkeypatch, {"engine-0": TRAINER, "engine-1": "e1-bad"})
    result = run_scenario(SCENARIOS["no_failure"], 0)
    violation = result.verdicts["published_weights"]
    assert violation is not None
    assert "engine engine-1" in violation.message and "e1-bad != t0" in violation.message


def test_a_world_that_reads_no_weights_records_no_check() -> None:
    """A world that reports no checksum in a delivery or a stamp gets no WeightsChecked:
    the simulator under aug2026. Pinned there because under today the simulator reads
    weights (content ids, sim/world/contents.py; shown by scenarios/test_field_bugs.py)."""
    scenario = SCENARIOS["no_failure"]
    old = dataclasses.replace(
        scenario, loop=dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    )
    result = run_scenario(old, 0)
    assert not any(isinstance(e, WeightsChecked) for e in result.history)
    assert any(isinstance(e, EngineStamped) for e in result.history)
