"""sim/cli/bench.py: its workloads are the runs they name, its figures are what those runs gave,
and a baseline is compared like with like (no timing is asserted here)."""

from __future__ import annotations

import hashlib
import json

import pytest

from miles_core.errors import ConfigError
from miles_core.events import FaultInjected, StepCommitted
from miles_core.kinds import FaultKind
from miles_core.scenario import PRESETS, SCENARIOS
from miles_core.scenario.faults import BeforeAllreduce
from sim.cli import bench
from sim.run import run_scenario


def test_the_scale_preset_is_64_cells_of_8_gpus_and_256_engines() -> None:
    world = PRESETS["production-64x256"].world
    assert (world.num_cells, world.gpus_per_cell, world.num_engines) == (64, 8, 256)
    scenario = bench.scale_scenario(10)
    assert scenario.loop.rollout_batch_size == 64
    assert [(f.kind, f.cell, f.when) for f in scenario.faults] == [
        (FaultKind.KILL_CELL, 1, BeforeAllreduce(step=5))
    ]


def test_the_scale_workload_kills_its_cell_and_still_commits_every_step() -> None:
    result = run_scenario(bench.scale_scenario(2), 0)
    assert result.ok, result.failures()
    assert [e.step for e in result.history if isinstance(e, StepCommitted)] == [0, 1]
    fired = [e for e in result.history if isinstance(e, FaultInjected)]
    assert [(e.fault, e.cell) for e in fired] == [(FaultKind.KILL_CELL, 1)]


def test_a_workload_reports_what_its_run_gave() -> None:
    figures = bench.measure(bench.WORKLOADS["production-30b-moe"], 2, [0])
    result = run_scenario(bench.production_scenario(2), 0)
    assert figures["steps"] == 2 and figures["seeds"] == [0]
    assert figures["history_hash"] == result.hash  # the same seed, the same history
    assert figures["simulated_seconds"] == result.history[-1].t
    assert figures["simpy_events"] == result.events
    assert figures["history_events"] == len(result.history)
    assert figures["sim_per_wall"] == figures["simulated_seconds"] / figures["wall_seconds"]


def test_a_fixed_workload_keeps_its_steps_and_combines_its_seeds_hashes() -> None:
    workload = bench.Workload("w", lambda steps: SCENARIOS["no_failure"], 3, fixed_steps=True)
    figures = bench.measure(workload, 50, [0, 1])
    hashes = [run_scenario(SCENARIOS["no_failure"], seed, 3).hash for seed in (0, 1)]
    assert figures["steps"] == 3
    assert figures["history_hashes"] == {"0": hashes[0], "1": hashes[1]}
    assert figures["history_hash"] == hashlib.sha256("\n".join(hashes).encode()).hexdigest()


def _figures(wall: float, simulated: float, events: int, digest: str = "h") -> dict:
    return {
        "steps": 10,
        "seeds": [0],
        "wall_seconds": wall,
        "simulated_seconds": simulated,
        "sim_per_wall": simulated / wall,
        "simpy_events": events,
        "history_hash": digest,
    }


def test_fewer_events_do_not_count_against_a_run_only_its_wall_time_does() -> None:
    before, now = _figures(4.0, 1000.0, 10**6), _figures(2.0, 1000.0, 10**5)
    assert bench.compare(now, before) == {
        "speedup": 2.0,
        "sim_per_wall_ratio": 2.0,
        "same_hash": True,
    }
    assert bench.compare(_figures(2.0, 1000.0, 1, "other"), before)["same_hash"] is False


def test_a_baseline_of_another_run_gives_no_ratio() -> None:
    before = _figures(4.0, 1000.0, 1) | {"steps": 20}
    assert bench.compare(_figures(2.0, 1000.0, 1), before)["speedup"] is None


def test_the_baseline_reads_this_bench_and_the_one_before_it(tmp_path) -> None:
    new = tmp_path / "new.json"
    new.write_text(json.dumps({"workloads": {"scenario": _figures(1.0, 5.0, 1)}}))
    assert bench.read_baseline(new)["scenario"]["wall_seconds"] == 1.0
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"production_preset": {"steps": 1000, "wall_seconds": 12.5}}))
    assert bench.read_baseline(old) == {"production-30b-moe": {"steps": 1000, "wall_seconds": 12.5}}
    garbage = tmp_path / "garbage.json"
    garbage.write_text("[1, 2]")
    with pytest.raises(ConfigError):
        bench.read_baseline(garbage)


def test_main_compares_with_its_own_json_output(tmp_path, capsys) -> None:
    argv = ["--preset", "production-30b-moe", "--steps", "2", "--json"]
    assert bench.main(argv) == 0
    first = json.loads(capsys.readouterr().out)["workloads"]["production-30b-moe"]
    path = tmp_path / "base.json"
    path.write_text(json.dumps({"workloads": {"production-30b-moe": first}}))
    assert bench.main([*argv, "--baseline", str(path)]) == 0
    again = json.loads(capsys.readouterr().out)["workloads"]["production-30b-moe"]
    assert again["vs_baseline"]["same_hash"] is True
    assert again["vs_baseline"]["speedup"] == first["wall_seconds"] / again["wall_seconds"]


def _fake_runs(monkeypatch, walls: list[float], hashes: list[str]) -> None:
    """bench._measured_run handing out the given wall times and hashes, one per call."""
    figures = iter(zip(walls, hashes, strict=True))

    def fake(scenario, seed, steps) -> dict:
        wall, digest = next(figures)
        run = _figures(wall, 100.0, 7, digest) | {"seed": seed, "cpu_seconds": wall}
        return run | {"history_events": 3, "hash_seconds": 0.0, "history_hash": digest}

    monkeypatch.setattr(bench, "_measured_run", fake)


def test_rounds_report_the_median_round_beside_every_rounds_time(monkeypatch) -> None:
    _fake_runs(monkeypatch, [3.0, 1.0, 2.0], ["h", "h", "h"])
    figures = bench.measure(bench.WORKLOADS["production-30b-moe"], 2, [0], rounds=3)
    assert figures["wall_seconds_rounds"] == [3.0, 1.0, 2.0]
    assert figures["wall_seconds"] == 2.0 and figures["cpu_seconds"] == 2.0
    assert figures["sim_per_wall"] == 100.0 / 2.0
    assert figures["simulated_seconds"] == 100.0  # one round's runs, not three rounds' summed
    line = bench._line("production-30b-moe", figures)
    assert "2.00 s wall (median of 3: 1.00 to 3.00)" in line


def test_a_round_that_gives_another_history_stops_the_bench(monkeypatch) -> None:
    _fake_runs(monkeypatch, [1.0, 1.0, 1.0, 1.0], ["a", "b", "a", "c"])
    with pytest.raises(RuntimeError, match=r"seed 1 gave two histories.*not deterministic"):
        bench.measure(bench.WORKLOADS["production-30b-moe"], 2, [0, 1], rounds=2)


def test_rounds_time_the_same_run_again(capsys) -> None:
    argv = ["--preset", "production-30b-moe", "--steps", "2", "--rounds", "2", "--json"]
    assert bench.main(argv) == 0
    figures = json.loads(capsys.readouterr().out)["workloads"]["production-30b-moe"]
    assert len(figures["wall_seconds_rounds"]) == 2
    assert figures["history_hash"] == run_scenario(bench.production_scenario(2), 0).hash


@pytest.mark.parametrize("flag", ["--rounds", "--steps", "--repeats"])
def test_a_count_below_one_is_refused_naming_its_flag(flag, capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main([flag, "0"])
    assert f"{flag}: got 0" in capsys.readouterr().err
