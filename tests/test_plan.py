"""``python -m sim plan``: the plan file, its points, the faults drawn for them, the front,
and the command end to end (sim/timing/plan_file.py, sim/timing/planner.py, sim/cli/plan.py)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import (
    AttemptBegan,
    AttemptEnded,
    CellRestartAsked,
    CellTrained,
    FaultInjected,
)
from miles_core.kinds import FaultKind
from miles_core.scenario import Scenario, TimeModel, WorldShape, load_scenario_file
from miles_core.scenario.faults import make_fault
from sim.run import run_scenario
from sim.timing.plan_file import Point, drawn_faults, load_plan, points
from sim.timing.planner import PointResult, SeedRun, mark_front, run_point

ROOT = Path(__file__).resolve().parent.parent
TINY = """
name = "tiny"
steps = 8
seeds = 2
[cluster]
gpus = 8
[model]
param_bytes = 1e9
gpus_per_cell = 3
gpus_per_engine = 2
train_seconds_per_sample = 0.5
[workload]
rollout_batch_size = 4
n_samples_per_prompt = 2
response_tokens_mean = 64.0
[faults]
cell_mtbf_seconds = 8.0
engine_mtbf_seconds = 8.0
cell_restart_seconds = 5.0
[search]
rollout_share = [0.25, 0.5, 0.99]
mode = ["fully_async", "one_step_off"]
"""


def _plan(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "plan.toml"
    path.write_text(text)
    return path


def test_every_combination_is_a_point_and_a_share_that_leaves_no_room_says_why(
    tmp_path: Path,
) -> None:
    plan = load_plan(str(_plan(tmp_path)))
    pts = points(plan)
    assert len(pts) == 3 * 2
    quarter = next(p for p in pts if p.settings["rollout_share"] == 0.25)
    assert quarter.scenario is not None
    world = quarter.scenario.world  # 2 GPUs of engines, 6 of cells of 3
    assert (world.num_engines, world.num_cells) == (1, 2)
    # a cell's share of 4 x 2 samples at 0.5 s each, split over 2 cells
    assert quarter.scenario.timing.train_step_seconds == pytest.approx(0.5 * 8 / 2)
    assert quarter.scenario.timing.batch_split_by_quorum
    full = [p for p in pts if p.settings["rollout_share"] == 0.99]
    assert all(p.scenario is None and "leaves" in p.why for p in full)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (("[model]", "[model]\nlayers = 3"), "[model]"),
        (("gpus = 8\n", ""), "[cluster]"),
        (("rollout_share = [0.25, 0.5, 0.99]", "rollout_share = []"), "[search].rollout_share"),
        (("steps = 8", "steps = 0"), "steps"),
        (("train_seconds_per_sample = 0.5", "train_seconds_per_sample = -1"), "[model]"),
        (("rollout_batch_size = 4", "rollout_batch_size = 2.5"), "[workload].rollout_batch_size"),
        (("gpus = 8", "gpus = 8.5"), "[cluster].gpus"),
        (("param_bytes = 1e9", "param_bytes = 1.5"), "[model].param_bytes"),
        (("response_tokens_mean = 64.0", "response_tokens_mean = -3.0"), "[workload]"),
        (("[faults]", "[timing]\nlink_bytes_per_second = 0\n[faults]"), "[timing]"),
    ],
)
def test_a_bad_plan_names_the_field_before_anything_runs(
    tmp_path: Path, edit: tuple[str, str], field: str
) -> None:
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_plan(str(_plan(tmp_path, TINY.replace(*edit))))


def test_faults_are_drawn_inside_the_run_on_components_that_are_up(tmp_path: Path) -> None:
    plan = load_plan(str(_plan(tmp_path)))
    scenario = next(p.scenario for p in points(plan) if p.settings["rollout_share"] == 0.25)
    assert scenario is not None and scenario.world.num_cells == 2
    wide = dataclasses.replace(scenario.world, num_engines=2)  # two engines to strike
    scenario = dataclasses.replace(scenario, world=wide)
    for seed in range(20):
        faults = drawn_faults(plan, scenario, seed, horizon=200.0, step_seconds=4.0)
        assert faults == drawn_faults(plan, scenario, seed, 200.0, 4.0)  # from the seed alone
        times = [f.when.at for f in faults]  # type: ignore[union-attr]
        assert times == sorted(times) and all(0 <= t < 200.0 for t in times)
        kills = [f for f in faults if f.kind is FaultKind.KILL_ENGINE]
        for a, b in itertools.pairwise(kills):  # the other engine, or the same one back up
            assert b.when.at - a.when.at >= 5.0 or a.engine != b.engine  # type: ignore[union-attr]
        down: dict[int, float] = {}
        for f in faults:  # a cell is started before the next one dies
            if f.kind is FaultKind.KILL_CELL:
                assert all(up <= f.when.at for up in down.values())  # type: ignore[union-attr]
                down[f.cell] = float("inf")  # type: ignore[union-attr]
            elif f.kind is FaultKind.START_CELL:
                down[f.cell] = f.when.at  # type: ignore[union-attr]
    lone = dataclasses.replace(scenario, world=dataclasses.replace(scenario.world, num_cells=1))
    assert not [f for f in drawn_faults(plan, lone, 0, 500.0, 4.0) if f.kind is FaultKind.KILL_CELL]


def _result(index: int, tokens: float, ettr: float, failed: tuple[str, ...] = ()) -> PointResult:
    run = SeedRun(0, 10.0, 3, 9.0, 3, 9.0, 9.0, tokens * 10.0, 1.0, 0.1, failed, 1)
    point = Point(index, {}, None)
    return PointResult(point, [dataclasses.replace(run, seconds_to_baseline=9.0 / ettr)])


def test_the_front_keeps_the_points_no_passing_point_beats_on_every_measure() -> None:
    fast, steady, beaten, broken = (
        _result(0, 100.0, 0.8),
        _result(1, 80.0, 0.95),
        _result(2, 70.0, 0.9),
        _result(3, 500.0, 1.0, failed=("end_state",)),
    )
    mark_front([fast, steady, beaten, broken])
    assert [r.on_front for r in (fast, steady, beaten, broken)] == [True, True, False, False]
    assert beaten.ettr == pytest.approx(0.9)


def test_a_points_runs_are_judged_and_its_faults_cost_time(tmp_path: Path) -> None:
    plan = load_plan(str(_plan(tmp_path)))
    point = next(p for p in points(plan) if p.settings["rollout_share"] == 0.25)
    runs = run_point(plan, point, range(4))
    assert all(r.failed == () and r.tokens_trained > 0 for r in runs)
    struck = [r for r in runs if r.faults]
    assert struck and all(0 < PointResult(point, [r]).ettr < 1.0 for r in struck)


def test_a_cell_lost_gives_the_survivors_its_share_of_the_batch() -> None:
    """With batch_split_by_quorum, a quorum of one cell of two trains twice as long."""
    timing = TimeModel(train_jitter=0.0, batch_split_by_quorum=True)
    world = WorldShape(num_cells=2, num_engines=1)
    kill = make_fault("kill_cell", cell=1, point="before_allreduce", step=2)
    scenario = Scenario("split", world=world, timing=timing, faults=(kill,))
    history = run_scenario(scenario, 0).history
    by_step = {e.step: e.seconds for e in history if isinstance(e, CellTrained) and e.cell == 0}
    assert by_step[1] == pytest.approx(5.0) and by_step[4] == pytest.approx(10.0)


def test_a_quorum_of_one_exchanges_with_nobody() -> None:
    """No gradient allreduce for a single cell: its attempt lasts its forward/backward."""
    scenario = Scenario("one", world=WorldShape(num_cells=1), timing=TimeModel(train_jitter=0))
    history = run_scenario(scenario, 0).history
    began = {e.step: e.t for e in history if isinstance(e, AttemptBegan)}
    spans = [e.t - began[e.step] for e in history if isinstance(e, AttemptEnded)]
    assert spans and max(spans) == pytest.approx(5.0)


def test_plan_end_to_end_writes_every_point_with_a_line_that_replays_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "sim", "plan", str(_plan(tmp_path)), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(run.stdout)
    assert (out / "front.png").stat().st_size > 0 and json.loads((out / "plan.json").read_text())
    ran = [r for r in rows if not r["invalid"]]
    assert len(ran) == 4 and any(r["on_front"] for r in ran)
    struck = next(r for r in ran if r["faults"])
    replay = struck["replay"].split()  # python -m sim run FILE --seed N
    scenario = load_scenario_file(Path(replay[4]))
    assert scenario.faults and scenario.timing.batch_split_by_quorum
    again = run_scenario(scenario, int(replay[-1]))
    assert again.ok


def test_a_sync_point_runs_colocated_once_whatever_the_share(tmp_path: Path) -> None:
    """mode = sync (miles' train.py, colocated): every GPU an engine's, then a cell's."""
    text = TINY.replace('mode = ["fully_async", "one_step_off"]', 'mode = ["sync"]')
    pts = points(load_plan(str(_plan(tmp_path, text))))
    (ran,) = [p for p in pts if p.scenario is not None]
    assert ran.settings["rollout_share"] == 0.25
    world = ran.scenario.world  # type: ignore[union-attr]
    assert (world.num_engines, world.num_cells) == (8 // 2, 8 // 3)
    assert all("does not apply" in p.why for p in pts if p.scenario is None)


def test_under_the_ft_controller_the_plan_starts_no_cell_and_the_controller_heals_them(
    tmp_path: Path,
) -> None:
    """A point with --mini-ft-controller-enable: the plan kills cells and starts none; the
    controller resumes each (CellRestartAsked), the runs pass, and the faults cost time."""
    text = TINY.replace(
        'mode = ["fully_async", "one_step_off"]', "mini_ft_controller_enable = [true]"
    ).replace("steps = 8", "steps = 40")  # long enough for a kill and its resume (50 s)
    plan = load_plan(str(_plan(tmp_path, text)))
    point = next(p for p in points(plan) if p.settings["rollout_share"] == 0.25)
    assert point.scenario is not None and point.scenario.loop.mini_ft_controller_enable
    faults = drawn_faults(plan, point.scenario, 0, horizon=500.0, step_seconds=4.0)
    assert {f.kind for f in faults} >= {FaultKind.KILL_CELL}
    assert FaultKind.START_CELL not in {f.kind for f in faults}
    runs = run_point(plan, point, range(3))
    assert all(r.failed == () and r.tokens_trained > 0 for r in runs)
    struck = [r for r in runs if r.faults]
    assert struck and all(0 < PointResult(point, [r]).ettr < 1.0 for r in struck)
    scenario = dataclasses.replace(point.scenario, faults=faults)
    history = run_scenario(scenario, 0).history
    killed = [e for e in history if isinstance(e, FaultInjected) and e.fault is FaultKind.KILL_CELL]
    resumed = [e for e in history if isinstance(e, CellRestartAsked)]
    assert killed and len(resumed) >= 1
