"""--namespaced-radix-cache (issue 50, item 7): prompt KV reused only within a train call.

miles (``configs/rollout.py`` 3c07fcdd; resolver in ``miles/utils/arguments.py``): unset, it
is on for ``--fully-async`` with ``--pause-generation-mode in_place``; each group keeps the
namespace ``train:-:{rollout_id}`` of the train call it was submitted under
(``FullyAsyncRolloutFn``: ``compute_kv_cache_namespace``, ``stamp_kv_cache_namespace``), sent
as ``extra_key`` (``compute_request_payload``, 02aa8e78). Against the testbed's ``[sim]
prefix_cache``: ``shared`` is SGLang's radix cache with one namespace; ``by_version`` keys by
the weights; the namespace keys by the train call, under either policy.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from miles_core.kinds import PauseMode
from miles_core.loop.config import LoopConfig
from miles_core.loop.version_rules import kv_namespace
from miles_core.profile import MilesProfile
from miles_core.scenario.files import load_scenario_file
from sim.run import run_scenario

FILE = Path(__file__).parents[1] / "scenarios" / "files" / "namespaced_radix_cache.toml"


@pytest.mark.parametrize(
    ("profile", "mode", "pause", "flag", "on"),
    [
        (MilesProfile.TODAY, "fully_async", PauseMode.IN_PLACE, None, True),
        (MilesProfile.TODAY, "fully_async", PauseMode.RETRACT, None, False),
        (MilesProfile.TODAY, "one_step_off", PauseMode.IN_PLACE, None, False),
        (MilesProfile.AUG2026, "fully_async", PauseMode.IN_PLACE, None, False),
        (MilesProfile.TODAY, "fully_async", PauseMode.IN_PLACE, False, False),
        (MilesProfile.AUG2026, "fully_async", PauseMode.RETRACT, True, True),
    ],
)
def test_the_default_is_miles_on_for_fully_async_in_place_under_today(
    profile: MilesProfile, mode: str, pause: PauseMode, flag: bool | None, on: bool
) -> None:
    config = LoopConfig(
        steps=1,
        miles_profile=profile,
        mode=mode,
        pause_generation_mode=pause,
        namespaced_radix_cache=flag,
    )
    assert config.radix_namespaced is on


def test_the_namespace_is_miles_spelling() -> None:
    assert kv_namespace(7) == "train:-:7"  # miles' own test of compute_kv_cache_namespace


def _run(flag: bool | None, profile: MilesProfile = MilesProfile.TODAY) -> str | None:
    scenario = load_scenario_file(FILE)
    loop = dataclasses.replace(scenario.loop, namespaced_radix_cache=flag, miles_profile=profile)
    result = run_scenario(dataclasses.replace(scenario, loop=loop), 0)
    verdict = result.verdicts["cached_kv_fresh"]
    return None if verdict is None else str(verdict)


def test_namespaced_kv_is_not_reused_across_train_calls_so_stale_kv_is_never_trained() -> None:
    """The scenario file passes under today's default; without the namespace (the flag off,
    or aug2026 where it is unset) a regenerated prompt reuses KV from the initial weights."""
    assert _run(None) is None
    off = _run(False)
    assert off is not None and "reused prompt KV computed by version 0" in off
    assert _run(None, MilesProfile.AUG2026) is not None
