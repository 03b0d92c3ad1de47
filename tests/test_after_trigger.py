"""``after = { fault = N | event = KIND, seconds = S }``: faults set off by the run's story.

Each must fire exactly ``seconds`` after what it waits for (once, however often that comes
again), be refused with the key named when it could never fire, survive a round trip
through TOML, and be renumbered, not left dangling, when the shrinker drops faults.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from miles_core.errors import ConfigError
from miles_core.events import FaultInjected, HealBegan
from miles_core.scenario import load_scenario_file
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.faults import After, make_fault
from miles_core.scenario.load import scenario_from_toml
from sim.run import run_scenario
from sim.search.shrinker import kept

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "scenarios" / "files" / "after_triggers.toml"


def test_each_fault_fires_when_what_it_waits_for_happened() -> None:
    scenario = load_scenario_file(FILE)
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    fired = {e.index: e for e in result.history if isinstance(e, FaultInjected)}
    assert sorted(fired) == [0, 1, 2, 3, 4]
    heal = next(e for e in result.history if isinstance(e, HealBegan) and e.dst_cell == 1)
    assert fired[2].t == heal.t  # the restart, the moment cell 1's heal began
    assert fired[4].t == fired[3].t  # the start, right after the kill it follows


def test_seconds_delay_the_fault_and_it_fires_once() -> None:
    base = load_scenario_file(FILE)
    restart = make_fault(
        "restart_engine", engine="engine-0", after={"event": "StepCommitted", "seconds": 2.5}
    )
    scenario = dataclasses.replace(base, faults=(*base.faults, restart))
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    index = len(base.faults)
    shots = [e for e in result.history if isinstance(e, FaultInjected) and e.index == index]
    first_commit = next(e for e in result.history if type(e).__name__ == "StepCommitted")
    assert len(shots) == 1 and shots[0].t == pytest.approx(first_commit.t + 2.5)


def _fault_error(after: Any, **extra: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        make_fault("restart_engine", engine="engine-0", after=after, **extra)
    return str(caught.value)


@pytest.mark.parametrize(
    ("after", "extra", "named"),
    [
        ({"event": "NoSuchEvent"}, {}, "fault (restart_engine).after.event"),
        ({"event": "RunEnded"}, {}, "fault (restart_engine).after.event"),
        ({"event": "HealBegan", "dst": 1}, {}, "fault (restart_engine).after.dst"),
        ({"event": "HealBegan", "fault": 0}, {}, "fault (restart_engine).after"),
        ({"seconds": 1.0}, {}, "fault (restart_engine).after"),
        ({"fault": 0, "seconds": -1.0}, {}, "fault (restart_engine).after.seconds"),
        ({"fault": 0, "cell": 1}, {}, "fault (restart_engine).after.cell"),
        ({"fault": -1}, {}, "fault (restart_engine).after.fault"),
        ({"fault": 0}, {"at": 3.0}, "fault (restart_engine).at"),
        ({"fault": 0}, {"point": "step_begin"}, "fault (restart_engine).point"),
        ({"fault": 0}, {"step": 1}, "fault (restart_engine).step"),
        ("soon", {}, "fault (restart_engine).after"),
    ],
)
def test_a_trigger_that_could_never_fire_is_refused_naming_its_key(
    after: Any, extra: dict[str, Any], named: str
) -> None:
    assert _fault_error(after, **extra).startswith(named)


def _with_faults(faults: str) -> str:
    return f'name = "x"\n[loop]\nsteps = 4\n{faults}'


def test_a_fault_index_must_exist_and_not_wait_on_itself() -> None:
    one = '[[faults]]\nkind = "restart_engine"\nengine = "engine-0"\nafter = { fault = 1 }\n'
    with pytest.raises(ConfigError, match=r"faults\[0\] \(restart_engine\)\.after\.fault"):
        scenario_from_toml(_with_faults(one), "x.toml")
    two = (
        '[[faults]]\nkind = "restart_engine"\nengine = "engine-0"\nafter = { fault = 1 }\n'
        '[[faults]]\nkind = "restart_engine"\nengine = "engine-1"\nafter = { fault = 0 }\n'
    )
    with pytest.raises(ConfigError, match="waits on itself through faults 1 -> 0 -> 1"):
        scenario_from_toml(_with_faults(two), "x.toml")


def test_after_triggers_survive_a_round_trip_through_toml() -> None:
    scenario = load_scenario_file(FILE)
    text = scenario_to_toml(scenario)
    assert 'after = { event = "HealBegan", dst_cell = 1 }' in text
    assert "after = { fault = 3 }" in text
    assert scenario_from_toml(text, "again.toml") == dataclasses.replace(
        scenario, loop=scenario_from_toml(text, "again.toml").loop
    )


def test_dropping_a_fault_renumbers_the_ones_after_it_or_refuses_the_orphan() -> None:
    faults = load_scenario_file(FILE).faults
    moved = kept(faults, [0, 3, 4])
    assert moved is not None and moved[2].when == After(fault=1)
    assert kept(faults, [0, 4]) is None  # fault 4 waits on fault 3, which was dropped
