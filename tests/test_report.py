"""The text report: the story in time order, one name per weight update, the run's time
labelled by its clock, and a staleness histogram that counts every trained group."""

from __future__ import annotations

import dataclasses
import re
from functools import cache
from typing import Any

import pytest

from miles_core.cells import Decision
from miles_core.engines import EngineState
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    EngineStateChanged,
    GroupTrained,
    History,
    StepBegan,
    UpdateBegan,
    VersionPublished,
)
from miles_core.profile import MilesProfile
from miles_core.report import chrome_trace, step_stories, story_lines, summary, text_lines
from miles_core.scenario import SCENARIOS
from miles_core.weight_update import UpdateKind
from sim.run import SimResult, run_scenario


@cache
def _run(name: str) -> SimResult:
    return run_scenario(SCENARIOS[name], 0)


def _run_aug2026(name: str) -> SimResult:
    """Under miles at 31f1ca9, whose health monitor recovers an engine at once (today's mini
    FT controller waits its poll and resume delay: scenarios/test_miles_health.py)."""
    scenario = SCENARIOS[name]
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    return run_scenario(dataclasses.replace(scenario, loop=loop), 0)


def _info(result: SimResult) -> dict[str, Any]:
    return summary(result.scenario, result.seed, result.history, result.report, result.verdicts)


def _step(lines: list[str], step: int) -> list[str]:
    """The lines under ``step N:`` in a story's text, up to the next step."""
    start = lines.index(f"  step {step}:") + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("    ")), None)
    return [line.strip() for line in lines[start:end]]


def test_a_step_is_told_in_time_order() -> None:
    """engine-1 dies as step 2 begins and its new process starts during the attempt: both
    come before the attempt's commit, and its sync by the update after it."""
    lines = story_lines(step_stories(_run_aug2026("ft_engine_dies").history))
    assert _step(lines, 2) == [
        "fault kill_engine engine-1 at t=13.51 (step_begin step=2)",
        "engine-1: serving -> down (process exited: process killed)",
        "engine-1: down -> unsynced (new process: process restarted)",
        "try 1 on [0, 1]: commit",
        "update 2 (v3) by cell 0: published",
        "engine-1: unsynced -> serving (stamped and resumed by update 2)",
    ]


def test_faults_and_syncs_fall_between_the_updates_they_came_after() -> None:
    """Step 0's update published before the faults at t=32 and t=36 fired; a sync that a
    fault aborted comes after that fault, and each sync is named as an update."""
    lines = story_lines(step_stories(_run_aug2026("sync_fails_then_engine_hangs").history))
    assert _step(lines, 0) == [
        "try 1 on [0, 1]: commit",
        "update 0 (v1) by cell 0: published",
        "fault kill_engine engine-1 at t=32.00 (at t=32)",
        "engine-1: serving -> down (process exited: process killed)",
        "engine-1: down -> unsynced (new process: process restarted)",
        "fault kill_cell cell 0 at t=32.33 (after_bucket bucket=0 after_time=32)",
        "update 1 (sync to v1) by cell 0 for ['engine-1'] aborted: cell-0 failed "
        "(killed sending bucket 1)",
        "fault hang_engine engine-0 at t=36.00 (at t=36)",
        # left paused by the sync that failed, engine-1's process answers no health generate
        "engine-1: unsynced -> down (no answer to a health check within 2s)",
        "engine-1: down -> unsynced (new process: process restarted)",
        "update 2 (sync to v1) by cell 1 for ['engine-1']",
        "engine-1: unsynced -> serving (stamped and resumed by update 2)",
        "engine-0: serving -> down (no answer to a health check within 2s)",
        "engine-0: down -> unsynced (new process: process restarted)",
        "update 3 (sync to v1) by cell 1 for ['engine-0']",
        "engine-0: unsynced -> serving (stamped and resumed by update 3)",
    ]


def _changed(t: float, old: EngineState, new: EngineState) -> EngineStateChanged:
    return EngineStateChanged(t=t, engine="engine-1", old=old, new=new, incarnation=1, reason="r")


def test_lines_go_by_time_and_ties_in_history_order() -> None:
    """The engine went down during the attempt: before its verdict. It came back at the
    moment the update published, recorded first: before the update's line."""
    began = UpdateBegan(
        t=4.0, update_id=0, version=1, updater=0, kind=UpdateKind.FULL, n_buckets=1, engines=()
    )
    history = History(
        [
            StepBegan(t=0.0, step=0),
            AttemptBegan(t=0.0, step=0, attempt=1, quorum_id=0, cells=(0,)),
            _changed(3.0, EngineState.SERVING, EngineState.DOWN),
            AttemptEnded(
                t=4.0,
                step=0,
                attempt=1,
                decision=Decision.COMMIT,
                normal=(0,),
                discarded=(),
                errored=(),
            ),
            began,
            _changed(5.0, EngineState.DOWN, EngineState.SERVING),
            VersionPublished(t=5.0, update_id=0, version=1, updater=0),
        ]
    )
    (story,) = step_stories(history)
    assert [line.strip() for line in story_lines([story])[1:]] == [
        "engine-1: serving -> down (r)",
        "try 1 on [0]: commit",
        "engine-1: down -> serving (r)",
        "update 0 (v1) by cell 0: published",
    ]
    assert story.to_dict()["updates"][0]["t"] == 5.0 and "timeline" not in story.to_dict()


def test_an_update_is_named_by_its_id_and_version_everywhere() -> None:
    """Two updates carry version 4 (the first aborted): the story, the engine's line and the
    trace all name them update 3 and update 4; none says "update vN". Pinned to aug2026,
    whose replaced engine aborts the update: under today the update gives that engine up and
    publishes v4 to the others, so no two updates share a version here (cell_isolation.py;
    scenarios/test_miles_deadlines.py, tests/test_update_order_given_up.py)."""
    result = _run_aug2026("restart_mid_update")
    lines = text_lines(_info(result), result.history, result.verdicts)
    step3 = _step(lines, 3)
    assert "update 3 (v4) by cell 0 aborted: engine-0 failed (its process was replaced " in (
        "\n".join(step3)
    )
    assert step3[-2:] == [
        "update 4 (v4) by cell 0: published",
        "engine-0: unsynced -> serving (stamped and resumed by update 4)",
    ]
    assert not any("update v" in line for line in lines)
    spans = [e["name"] for e in chrome_trace(result.history)["traceEvents"] if e["ph"] == "X"]
    updates = [name for name in spans if name.startswith("update")]
    assert "update 3 (v4) aborted" in updates and "update 4 (v4)" in updates
    assert all(re.fullmatch(r"update \d+ \((sync to )?v\d+\)( aborted)?", n) for n in updates)


def test_a_sync_has_its_span_in_the_trace() -> None:
    """A sync publishes nothing: its span ends when its engines resume. (Miles at 31f1ca9:
    today's miles syncs no new process, the next full update takes it.)"""
    scenario = SCENARIOS["sync_fails_then_engine_hangs"]
    loop = dataclasses.replace(scenario.loop, miles_profile=MilesProfile.AUG2026)
    history = run_scenario(dataclasses.replace(scenario, loop=loop), 0).history
    trace = chrome_trace(history)
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    assert "update 1 (sync to v1) aborted" in names and "update 2 (sync to v1)" in names


def test_the_header_says_the_time_is_simulated() -> None:
    result = _run("no_failure")
    info = _info(result)
    assert info["clock"] == "simulated"
    first = text_lines(info, result.history, result.verdicts)[0]
    assert first.endswith(f", {info['seconds']:.1f} s simulated time")


def test_a_real_run_says_wall_time() -> None:
    """A real backend's summary names its clock wall (its seconds are the run's own)."""
    pytest.importorskip("ray", reason="the real backends need the cpu extra")
    from backends.common.run.ray_run import RealResult

    sim = _run("no_failure")
    real = RealResult(sim.scenario, sim.seed, sim.history, sim.report, sim.verdicts)
    info = real.summary()
    assert info["clock"] == "wall"
    assert text_lines(info, sim.history, sim.verdicts)[0].endswith(" s wall time")


@pytest.mark.parametrize("name", ["no_failure", "first_update", "all_cells_dead"])
def test_the_histogram_counts_every_trained_group(name: str) -> None:
    """Groups trained before the first version was published have no staleness: they are
    their own bucket, "none", and the buckets add up to the groups trained. A group the
    trainer took in a step that never committed is not counted (all_cells_dead)."""
    result = _run(name)
    info = _info(result)
    hist = info["staleness_histogram"]
    assert sum(hist.values()) == info["groups_trained"] > 0
    first_step = sum(isinstance(e, GroupTrained) and e.step == 0 for e in result.history)
    none, *versioned = hist
    assert none == "none" and hist["none"] == first_step
    assert all(k.isdigit() for k in versioned)
    lines = text_lines(info, result.history, result.verdicts)
    assert f"staleness of trained groups {{'none': {first_step}" in "\n".join(lines)
