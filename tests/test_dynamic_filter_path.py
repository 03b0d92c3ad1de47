"""--dynamic-sampling-filter-path names any importable ``module.function``, as in miles.

miles loads the path with ``load_function`` (miles/utils/misc.py: importlib, then
getattr) and calls it through ``call_dynamic_filter``
(miles/rollout/filter_hub/base_types.py): ``fn(args, group)``, whose answer is a
DynamicFilterOutput or, from a legacy filter, a bare truth value. The run-level test
is modelled on miles' tests/fast/rollout/test_fully_async_rollout.py::
test_dynamic_filter_drops_group_without_recycling, whose filter lives in the test module
and is named by ``f"{__name__}.reject_group_1"``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from miles_core.buffer import FilterOutput, Group, Sample
from miles_core.errors import ConfigError
from miles_core.events import GroupDropped, GroupRecycled, GroupTrained, StepMetrics
from miles_core.filters import (
    MILES_MODULE,
    ImportedFilter,
    check_reward_nonzero_std,
    dynamic_filter,
)
from miles_core.loop import LoopConfig
from miles_core.scenario import SCENARIOS
from sim.__main__ import main
from sim.run import SimResult, run_scenario

SEEN: list[tuple[Any, Group]] = []


def reject_odd_prompts(args: Any, group: Group, **kwargs: Any) -> FilterOutput:
    """A filter in miles' signature: rejects every group of an odd prompt, with a reason."""
    SEEN.append((args, group))
    keep = group.prompt_id % 2 == 0
    return FilterOutput(keep=keep, reason=None if keep else "rejected")


def legacy_keep_even(args: Any, group: Group) -> bool:
    """miles' legacy form: a bare bool (call_dynamic_filter wraps it as keep=output)."""
    return group.prompt_id % 2 == 0


@dataclasses.dataclass
class OwnOutput:
    """An output of the user's own type with miles' fields (keep, reason)."""

    keep: Any
    reason: str | None = None


def own_output(args: Any, group: Group) -> OwnOutput:
    return OwnOutput(keep=0, reason="own")


async def async_filter(args: Any, group: Group) -> bool:
    return True


NOT_A_FUNCTION = 3


def _group(prompt_id: int) -> Group:
    sample = Sample(index=0, weight_versions=(0,), reward=1.0)
    return Group(group_id=prompt_id, prompt_id=prompt_id, items=(sample,))


def _run(path: str, seed: int = 0) -> SimResult:
    scenario = SCENARIOS["no_failure"]
    loop = dataclasses.replace(
        scenario.loop, dynamic_sampling_filter=path, unused_samples_handler="retry", steps=3
    )
    result = run_scenario(dataclasses.replace(scenario, loop=loop), seed)
    assert result.ok, result.failures()
    return result


def test_a_filter_named_by_path_drops_groups_without_recycling() -> None:
    """Modelled on miles' test_dynamic_filter_drops_group_without_recycling: the rejected
    groups are dropped even with handler=retry, never trained nor recycled, and counted
    under rollout/dynamic_filter/drop_<reason>."""
    SEEN.clear()
    result = _run(f"{__name__}.reject_odd_prompts")
    # called with the run's flags first, as miles passes its parsed args
    assert SEEN and all(a == result.scenario.loop for a, _ in SEEN)
    dropped = [e for e in result.history if isinstance(e, GroupDropped)]
    assert dropped and {e.reason for e in dropped} == {"dynamic_filter:rejected"}
    assert all(e.prompt_id % 2 == 1 for e in dropped)
    trained = [e for e in result.history if isinstance(e, GroupTrained)]
    assert trained and all(e.prompt_id % 2 == 0 for e in trained)
    recycled = {e.group_id for e in result.history if isinstance(e, GroupRecycled)}
    assert recycled.isdisjoint(e.group_id for e in dropped)
    metrics = [dict(e.metrics) for e in result.history if isinstance(e, StepMetrics)]
    assert sum(m.get("rollout/dynamic_filter/drop_rejected", 0) for m in metrics) == len(dropped)


def test_a_run_with_an_imported_filter_replays_from_its_seed() -> None:
    path = f"{__name__}.legacy_keep_even"
    first, again = _run(path, seed=3), _run(path, seed=3)
    assert first.hash == again.hash
    dropped = [e for e in first.history if isinstance(e, GroupDropped)]
    assert dropped and all(e.prompt_id % 2 == 1 for e in dropped)


def test_the_filter_is_called_as_miles_calls_it() -> None:
    """``fn(args, group)``: the args given first, then this project's Group."""
    SEEN.clear()
    args = LoopConfig(steps=1)
    loaded = dynamic_filter(f"{__name__}.reject_odd_prompts", args)
    assert isinstance(loaded, ImportedFilter)
    assert loaded(_group(1)) == FilterOutput(False, "rejected")
    assert loaded(_group(2)) == FilterOutput(True)
    assert [(a, g.prompt_id) for a, g in SEEN] == [(args, 1), (args, 2)]


@pytest.mark.parametrize(
    ("name", "odd", "even"),
    [
        ("legacy_keep_even", FilterOutput(False), FilterOutput(True)),
        ("own_output", FilterOutput(False, "own"), FilterOutput(False, "own")),
    ],
)
def test_a_bool_or_an_output_with_keep_is_read_as_miles_reads_it(
    name: str, odd: FilterOutput, even: FilterOutput
) -> None:
    loaded = dynamic_filter(f"{__name__}.{name}")
    assert loaded is not None
    assert (loaded(_group(1)), loaded(_group(2))) == (odd, even)


@pytest.mark.parametrize(
    "name", ["check_reward_nonzero_std", f"{MILES_MODULE}.check_reward_nonzero_std"]
)
def test_the_built_in_names_still_name_the_built_ins(name: str) -> None:
    assert dynamic_filter(name) is check_reward_nonzero_std
    assert LoopConfig(steps=1, dynamic_sampling_filter=name).dynamic_sampling_filter == name


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("no_such_module_xyz.f", "cannot import 'no_such_module_xyz' for 'no_such_module_xyz.f'"),
        ("nofilter", "unknown filter 'nofilter'"),
        (f"{__name__}.missing", f"module '{__name__}' has no 'missing'"),
        (f"{__name__}.NOT_A_FUNCTION", "is not callable (it is a int)"),
        (f"{__name__}.async_filter", "is an async function"),
    ],
)
def test_a_path_that_names_no_filter_is_refused_before_the_run(path: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LoopConfig(steps=1, dynamic_sampling_filter=path)
    assert caught.value.field == "dynamic_sampling_filter"
    assert problem in caught.value.problem


def test_a_bad_path_on_the_command_line_names_the_flag(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "no_failure", "--dynamic-sampling-filter-path", "no_such_module_xyz.f"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--dynamic-sampling-filter-path: cannot import 'no_such_module_xyz'" in err
    assert "importable module.function" in err
