"""Fitting the time model to a run's history and predicting another run (sim/timing/run_fit.py).

The simulator is the one world whose true figures are known, so it checks the method: a
fit of a simulated run must give back the figures that made it, and predict the other
scenario's simulated run. The real runs' figures are in docs/timing.md."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from miles_core.errors import ConfigError
from miles_core.events import History
from miles_core.scenario import Scenario, load_scenario_file
from sim.run import run_scenario
from sim.timing.run_fit import _update_overheads, check, compare, figures, fit_timing, read_history

ROOT = Path(__file__).resolve().parent.parent
FIT, CHECK = ROOT / "scenarios/timing/fit.toml", ROOT / "scenarios/timing/check.toml"


def _with_costs(scenario: Scenario) -> Scenario:
    timing = dataclasses.replace(
        scenario.timing, engine_start_seconds=3.0, update_fixed_seconds=0.5, allreduce_seconds=0.3
    )
    return dataclasses.replace(scenario, timing=timing)


@pytest.fixture(scope="module")
def fitted() -> tuple[Scenario, History, object, dict[str, str]]:
    scenario = _with_costs(load_scenario_file(FIT))
    history = run_scenario(scenario, 0).history
    timing, how = fit_timing([history], scenario)
    return scenario, history, timing, how


def test_a_fit_of_a_simulated_run_gives_back_the_figures_that_made_it(fitted) -> None:  # type: ignore[no-untyped-def]
    scenario, _, timing, how = fitted
    true = scenario.timing
    assert timing.allreduce_seconds == pytest.approx(true.allreduce_seconds, rel=1e-6)
    assert timing.link_latency_seconds == pytest.approx(true.link_latency_seconds, rel=1e-3)
    # the fit's cells and engines share a node: their buckets go at NVLink's rate
    assert timing.link_bytes_per_second == pytest.approx(true.nvlink_bytes_per_second, rel=1e-3)
    assert timing.update_fixed_seconds == pytest.approx(0.5, rel=1e-3)
    assert timing.engine_start_seconds == pytest.approx(3.0, abs=0.05)
    assert timing.train_step_seconds == pytest.approx(true.train_step_seconds, rel=0.05)
    assert timing.decode_seconds_per_token == pytest.approx(true.decode_seconds_per_token, rel=0.2)
    assert set(how) >= {"train_step_seconds", "engine_start_seconds", "link_bytes_per_second"}


def test_the_fit_predicts_a_run_it_was_not_fitted_on(fitted) -> None:  # type: ignore[no-untyped-def]
    """Other cells, bucket size, pause mode and restart: the check scenario's simulated run
    against the prediction from the fit of the other one (same seed)."""
    _, _, timing, _ = fitted
    other = _with_costs(load_scenario_file(CHECK))
    real = figures(run_scenario(other, 0).history)
    predicted = figures(check(other, timing, 0, None))
    rows = compare(real, predicted)
    assert [r["figure"] for r in rows] == ["step_seconds", "update_seconds", "restart_to_serving"]
    for r in rows:
        assert r["real"] and r["ratio"] == pytest.approx(1.0, abs=0.1), r


def test_a_fit_from_a_history_with_no_restart_keeps_the_scenarios_start_time() -> None:
    scenario = dataclasses.replace(_with_costs(load_scenario_file(FIT)), faults=())
    timing, how = fit_timing([run_scenario(scenario, 0).history], scenario)
    assert "engine_start_seconds" not in how and timing.engine_start_seconds == 3.0


def test_a_fit_gives_back_what_making_a_group_cost_apart_from_the_updates_fixed_cost() -> None:
    """UpdateGroupMade: the fit run's group of two engines alone shows one size, so all of
    it is the fixed cost; pooled with the check run's group of three, the fixed cost and
    each engine's share come apart. The update's fixed cost leaves the groups' making out,
    as the simulator charges them apart."""

    def made(path: Path) -> tuple[Scenario, History]:
        scenario = _with_costs(load_scenario_file(path))
        timing = dataclasses.replace(
            scenario.timing, group_make_seconds=0.8, group_make_seconds_per_engine=0.3
        )
        scenario = dataclasses.replace(scenario, timing=timing)
        return scenario, run_scenario(scenario, 0).history

    (fit, two), (_, three) = made(FIT), made(CHECK)
    # every update's time beyond its sends and its groups' making is the fixed cost, the
    # updates that made a group included
    assert max(_update_overheads(two)) == pytest.approx(0.5, rel=1e-9)
    one_size, how = fit_timing([two], fit)
    assert one_size.group_make_seconds == pytest.approx(0.8 + 2 * 0.3, rel=1e-9)
    assert one_size.group_make_seconds_per_engine == 0.0 and "one size" in how["group_make_seconds"]
    assert one_size.update_fixed_seconds == pytest.approx(0.5, rel=1e-3)
    pooled, _ = fit_timing([two, three], fit)
    assert pooled.group_make_seconds == pytest.approx(0.8, rel=1e-9)
    assert pooled.group_make_seconds_per_engine == pytest.approx(0.3, rel=1e-9)
    assert pooled.update_fixed_seconds == pytest.approx(0.5, rel=1e-3)


def test_a_fit_from_a_history_with_no_group_made_keeps_the_scenarios_figures() -> None:
    scenario = _with_costs(load_scenario_file(FIT))
    timing, how = fit_timing([run_scenario(scenario, 0).history], scenario)
    assert "group_make_seconds" not in how and timing.group_make_seconds == 0.0


def test_compare_marks_a_figure_off_by_more_than_a_quarter() -> None:
    from sim.timing.run_fit import RunFigures

    rows = compare(RunFigures(10.0, 2.0, None), RunFigures(12.4, 2.6, 5.0))
    assert [r["within"] for r in rows] == [True, False, False]
    assert rows[2]["ratio"] is None  # not in the real run: not judged


def test_a_history_file_round_trips_and_bad_ones_are_named(tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "sim", "run", str(FIT), "--history", str(out), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert read_history(str(out)).hash() == json.loads(run.stdout)["history_hash"]
    with pytest.raises(ConfigError, match=r"--history.*does not exist"):
        read_history(str(tmp_path / "none.jsonl"))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"--history.*not a history"):
        read_history(str(tmp_path / "bad.jsonl"))


def test_calibrate_asks_for_both_halves_of_a_check(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "sim", "calibrate", "--history", "x.jsonl"]
    half = subprocess.run(
        [*cmd, "--scenario", str(FIT), "--check", "y.jsonl"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert half.returncode == 2 and "--check-scenario" in half.stderr


def test_the_check_cuts_the_fitted_runs_model_as_a_real_world_cuts_it() -> None:
    """A real model's units are uneven: at the scenario's budget the CPU policy's 16 units
    go in fewer buckets than the scenario's 16 (13 in the real run). The check rebuilds
    that model (ModelDescribed) and cuts it at the real world's budget, so it sends what
    the real run sent."""
    from miles_core.events import ModelDescribed, UpdateBegan
    from miles_core.transfer import plan_buckets

    units = (256,) * 5 + (3072, 16384, 16384) + (32768,) * 8  # the CPU policy's, sorted
    other = load_scenario_file(CHECK)  # at 4 MiB: the scenario's 64 MiB in 16 buckets
    other = dataclasses.replace(
        other, loop=dataclasses.replace(other.loop, update_weight_buffer_size=4 << 20)
    )
    history = check(other, other.timing, 0, units)
    (described,) = [e for e in history if isinstance(e, ModelDescribed)]
    assert described.unit_bytes == units
    budget = -(-sum(units) // other.n_buckets)
    sent = {e.n_buckets for e in history if isinstance(e, UpdateBegan) and e.publishes}
    assert sent == {len(plan_buckets(load_units(units), budget))}
    assert max(sent) < other.n_buckets == 16  # uneven units: fewer buckets than equal ones


def load_units(units: tuple[int, ...]):  # type: ignore[no-untyped-def]
    from miles_core.scenario import WorldShape

    return WorldShape(unit_bytes=units, param_bytes=sum(units)).units()
