"""mode = "sync": miles' train.py as it runs colocated (generate, train, update in turn)."""

from __future__ import annotations

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    GroupGot,
    SampleGenerated,
    StepCommitted,
    UpdateBegan,
    VersionPublished,
)
from miles_core.loop import LoopConfig
from miles_core.scenario import Scenario
from miles_core.scenario.faults import make_fault
from sim.run import run_scenario


def _sync(steps: int = 6, **loop: object) -> Scenario:
    kill = make_fault("kill_cell", cell=1, point="before_allreduce", step=2)
    start = make_fault("start_cell", cell=1, point="step_begin", step=4)
    config = LoopConfig(steps=steps, mode="sync", **loop)  # type: ignore[arg-type]
    return Scenario("sync", loop=config, faults=(kill, start))


@pytest.mark.parametrize("seed", range(4))
def test_every_batch_is_generated_on_the_current_weights_and_nothing_overlaps(seed: int) -> None:
    result = run_scenario(_sync(), seed)
    assert result.ok, result.failures()
    h = result.history
    ages = [e.staleness for e in h if isinstance(e, GroupGot) and e.staleness is not None]
    assert ages and set(ages) == {0}  # on-policy: the weights it was generated with
    samples = [e for e in h if isinstance(e, SampleGenerated)]
    updates = {e.update_id: e.t for e in h if isinstance(e, UpdateBegan) and e.publishes}
    published = [(updates[e.update_id], e.t) for e in h if isinstance(e, VersionPublished)]
    # no request is in flight while the weights change, nor while a step trains
    assert not [s for s in samples for a, b in published if s.sent < b and s.t > a]
    commits = sorted(e.t for e in h if isinstance(e, StepCommitted))
    first_sent = min(s.sent for s in samples)
    assert all(not (first_sent < c and any(s.sent < c < s.t for s in samples)) for c in commits)


def test_sync_takes_a_whole_batch_in_its_buffer() -> None:
    with pytest.raises(ConfigError, match=r"capacity_factor.*sync"):
        LoopConfig(steps=2, mode="sync", capacity_factor=0.5)
