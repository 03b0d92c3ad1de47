"""disk-delta's faults on the CPU backend, over real files (backends/common/wire/disk_delta.py):
the weights oracle reads each engine's own tensors (sha256 at its stamp, WeightsChecked)
against the trainer's, so a skipped delta or an xor delta applied twice past the engine's
check is caught from the bytes the engine loaded; a torn file is refused by the engine's
per-tensor checksum and the history shows it. The simulator's twin: scenarios/test_miles_delta.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.common.run.ray_run import run_in_ray
from backends.common.session.ray_session import ray_session
from miles_core.events import UpdateAborted, WeightsChecked
from miles_core.scenario.files import load_scenario_file
from miles_core.witness.delta import PULL_REFUSED

FILES = Path(__file__).resolve().parent.parent / "scenarios" / "files"
FT_AT_THE_SMALL_SCALE = {
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "mini_ft_controller_poll_interval": 2.0,
    "mini_ft_controller_resume_delay": 2.0,
}
"""The torn file's replaced engines come back on the named FT scenarios' scale (sim/scenarios
``_FT``), not miles' 10 s controller poll and resume delay: 41 s of the test's waiting."""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with ray_session(num_gpus=8):
        yield


@pytest.mark.parametrize(
    ("name", "engine"),
    [
        ("disk_delta_faults/xor_applied_twice.toml", "engine-1"),
        ("disk_delta_faults/skipped.toml", "engine-0"),
    ],
)
def test_the_weights_oracle_catches_it_from_the_bytes(
    ray_cluster: None, name: str, engine: str
) -> None:
    real = run_in_ray(load_scenario_file(FILES / name), seed=0, steps=2, timeout=300)
    failing = {n for n, v in real.verdicts.items() if v is not None}
    assert failing == {"published_weights"}, failing
    bad = [
        e
        for e in real.history
        if isinstance(e, WeightsChecked) and e.checksum != e.trainer_checksum
    ]
    assert [(e.engine, e.version) for e in bad] == [(engine, 2)]


def test_a_torn_file_is_refused_by_the_engines_checksum(ray_cluster: None) -> None:
    torn = load_scenario_file(FILES / "disk_delta_torn.toml")
    loop = dataclasses.replace(torn.loop, **FT_AT_THE_SMALL_SCALE)
    real = run_in_ray(dataclasses.replace(torn, loop=loop), seed=0, steps=3, timeout=300)
    assert real.ok, "\n".join(str(v) for v in real.verdicts.values() if v)
    refused = [e for e in real.history if isinstance(e, UpdateAborted) and PULL_REFUSED in e.reason]
    assert refused, "no pull was refused"
    checks = [e for e in real.history if isinstance(e, WeightsChecked)]
    assert checks and all(e.checksum == e.trainer_checksum for e in checks)
