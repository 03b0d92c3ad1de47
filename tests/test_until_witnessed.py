"""until_witnessed: a run goes past its steps while a fault that fired awaits its effect.

A real world's restarted engine takes seconds to come back (tens of steps on CPU), so a
step count set by hand is too short on a slow machine and wasted on a fast one. The
simulator's runs here stand in for that: a fault in the last step's update whose
witness (the cell left out of a later quorum) needs one more step.
"""

from __future__ import annotations

import dataclasses

import pytest

from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.events import EngineRecoveryAsked, EngineStateChanged, RunEnded
from miles_core.profile import MilesProfile
from miles_core.report.summary import summary, text_lines
from miles_core.scenario import scenario_from_toml
from miles_core.scenario.dump import scenario_to_toml
from miles_core.scenario.library import SCENARIOS
from miles_core.stopping import recovering
from sim.run import Scenario, run_scenario


def _one_step(name: str, until: int | None, mode: str | None = None) -> Scenario:
    """The named scenario cut to one step (its fault in the first update), with ``until``."""
    scenario = SCENARIOS[name].with_run(steps=1)
    if mode is not None:
        scenario = dataclasses.replace(scenario, loop=dataclasses.replace(scenario.loop, mode=mode))
    return dataclasses.replace(scenario, until_witnessed=until)


def _reason(result) -> str:
    return next(e.reason for e in result.history if isinstance(e, RunEnded))


@pytest.mark.parametrize("mode", ["fully_async", "one_step_off"])
def test_a_fault_awaiting_its_effect_runs_the_run_on_until_it_is_witnessed(mode: str) -> None:
    cut = run_scenario(_one_step("crash_mid_weight_update", None, mode), 0)
    assert "cell 0 failed but no later quorum excluded it" in str(cut.verdicts["fault_witness"])
    assert cut.report.steps_done == 1

    result = run_scenario(_one_step("crash_mid_weight_update", 8, mode), 0)
    assert result.ok, result.failures()
    extra = result.report.steps_done - 1
    assert 1 <= extra < 7  # on, but only until the quorum left the cell out
    assert _reason(result) == (
        f"{1 + extra} steps (1 asked, {extra} more until every fault was witnessed)"
    )


LATE_RESTART = """
name = "late_restart"
until_witnessed = 40
[loop]
steps = 2
[[faults]]
kind = "restart_engine"
engine = "engine-1"
at = 60.0
"""


def test_a_fault_not_fired_yet_is_waited_for_too() -> None:
    """A fault at a time past the asked steps' end (or at a point such as during_recovery,
    which comes when it comes) fires in the steps run on for it, and takes effect."""
    scenario = scenario_from_toml(LATE_RESTART, "late_restart.toml")
    cut = run_scenario(dataclasses.replace(scenario, until_witnessed=None), 0)
    assert "never fired" in str(cut.verdicts["fault_witness"])
    result = run_scenario(scenario, 0)
    assert result.ok, result.failures()
    assert 2 < result.report.steps_done < 40 and result.history[-1].t > 60.0
    info = summary(scenario, 0, result.history, result.report, result.verdicts)
    first = text_lines(info, result.history, result.verdicts)[0]
    done = result.report.steps_done
    assert f"{done} steps (2 asked, then until every fault was witnessed)" in first


def test_an_engine_recovery_under_way_is_waited_for() -> None:
    """A hang's witness is the engine leaving rotation; with fault tolerance its recovery
    follows, seconds later for real (here a new process takes 60 s to answer:
    engine_start_seconds). The run goes on until the recovered engine serves again, not
    just until it was taken out."""
    hangs = SCENARIOS["ft_engine_hangs"].with_run(steps=3)
    scenario = dataclasses.replace(
        hangs, timing=dataclasses.replace(hangs.timing, engine_start_seconds=60.0)
    )
    cut = run_scenario(dataclasses.replace(scenario, until_witnessed=None), 0)
    assert cut.report.steps_done == 3 and recovering(cut.history) == {"engine-0"}

    result = run_scenario(dataclasses.replace(scenario, until_witnessed=100), 0)
    assert result.ok, result.failures()
    assert 3 < result.report.steps_done < 100 and not recovering(result.history)
    asked = next(e for e in result.history if isinstance(e, EngineRecoveryAsked))
    serving = [
        e
        for e in result.history
        if isinstance(e, EngineStateChanged) and e.new is EngineState.SERVING and e.t > asked.t
    ]
    assert [e.engine for e in serving] == ["engine-0"]
    assert serving[0].t >= asked.t + 60.0


def test_the_run_goes_no_further_than_until_witnessed() -> None:
    # a slowed link needs sends outside its window to compare with: 8 steps here
    wide = run_scenario(_one_step("slow_link", 40), 0)
    assert wide.ok and wide.report.steps_done > 3
    capped = run_scenario(_one_step("slow_link", 3), 0)
    assert capped.report.steps_done == 3
    assert "no bucket sends outside the window" in str(capped.verdicts["fault_witness"])


def test_a_point_never_reached_runs_to_the_cap_and_says_how_far() -> None:
    """Nothing restarts engine-1, so its during_recovery kill never fires: the run goes on
    to until_witnessed, and the verdict counts the steps it ran, not the ones asked."""
    text = LATE_RESTART.replace("at = 60.0", 'point = "during_recovery"').replace(
        "restart_engine", "kill_engine"
    )
    result = run_scenario(scenario_from_toml(text.replace("= 40", "= 4"), "never.toml"), 0)
    assert result.report.steps_done == 4
    assert "completed its 4 steps without reaching that point for engine-1" in str(
        result.verdicts["fault_witness"]
    )


@pytest.mark.parametrize("name", [n for n, s in SCENARIOS.items() if s.until_witnessed is not None])
def test_a_run_whose_faults_had_their_effect_is_the_same_run(name: str) -> None:
    """The library's restart scenarios carry until_witnessed for real worlds; the simulator
    restarts at once, so their runs stop at their steps, event for event as without it.
    Today's mini FT controller heals no sooner than its poll and resume delay, and backs off
    10 s after a resumed process dies starting: that one's recovery outlasts its 8 steps
    under today, so it is judged under aug2026 (scenarios/test_miles_health.py, today's)."""
    scenario = SCENARIOS[name]
    if name == "ft_engine_dies_during_recovery":
        aug2026 = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
        scenario = dataclasses.replace(scenario, loop=aug2026)
    with_it = run_scenario(scenario, 0)
    without = run_scenario(dataclasses.replace(scenario, until_witnessed=None), 0)
    assert with_it.ok and with_it.report.steps_done == scenario.loop.steps
    assert with_it.hash == without.hash


def test_until_witnessed_round_trips_through_a_file() -> None:
    scenario = dataclasses.replace(SCENARIOS["crash_mid_weight_update"], until_witnessed=30)
    text = scenario_to_toml(scenario)
    assert "until_witnessed = 30" in text
    assert scenario_from_toml(text, "dumped.toml") == scenario


def test_more_steps_than_until_witnessed_is_refused_naming_it() -> None:
    scenario = SCENARIOS["restart_before_stamp"]
    with pytest.raises(ConfigError, match=r"--steps.*201 is more than.*until_witnessed = 200"):
        scenario.with_run(steps=201)
    assert scenario.with_run(steps=200).loop.steps == 200


def test_the_step_bar_grows_past_the_asked_steps_and_says_why() -> None:
    import io

    from tqdm import tqdm

    from miles_core.report.progress import PAST_ASKED, count_step

    out = io.StringIO()
    bar = tqdm(total=2, file=out)
    for _ in range(2):
        count_step(bar)
    assert (bar.n, bar.total) == (2, 2) and not bar.desc
    count_step(bar)  # a third step: the run went on for a witness
    assert (bar.n, bar.total) == (3, 3) and bar.desc.startswith(PAST_ASKED)
    bar.close()
    assert "3/3" in out.getvalue() and "3/2" not in out.getvalue()
    quiet = tqdm(total=1, disable=True)  # --json: nothing counted, nothing shown
    count_step(quiet)
    count_step(quiet)
    assert quiet.total == 1
