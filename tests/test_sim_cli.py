"""python -m sim: list, run by name or file, JSON, trace, violations and replay."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from miles_core.oracles import ORACLES
from sim.__main__ import main
from sim.scenarios import SCENARIOS, find_scenario, load_scenario_file

FILES = Path(__file__).resolve().parents[1] / "scenarios" / "files"


def run_json(capsys, *args: str) -> dict:
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_list_names_every_scenario_with_a_description(capsys) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [*SCENARIOS, "swarm", "swarm_total_loss"]
    assert len(SCENARIOS) >= 12
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)


def test_json_summary_has_the_promised_fields(capsys) -> None:
    info = run_json(capsys, "cell_crash_before_allreduce", "--seed", "4")
    for key in (
        "scenario",
        "seed",
        "world",
        "status",
        "steps",
        "final_version",
        "faults",
        "story",
        "oracles",
        "history_hash",
    ):
        assert key in info
    assert info["steps"] == 8 and info["final_version"] == 8
    assert [f["fault"] for f in info["faults"]] == ["kill_cell", "start_cell"]
    assert all("fired_at" in f for f in info["faults"])
    assert set(info["oracles"].values()) == {"pass"} and set(info["oracles"]) == set(ORACLES)
    assert info["world"]["cells"] == 2 and info["world"]["expect"] == "completed"
    step2 = next(s for s in info["story"] if s["step"] == 2)
    assert [a["decision"] for a in step2["attempts"]] == ["retry", "commit"]
    assert step2["attempts"][0]["errored"] == [1] and step2["quorum"] == [0]


def test_a_hand_written_scenario_file_runs(capsys) -> None:
    info = run_json(capsys, str(FILES / "heal_twice.toml"), "--seed", "3")
    assert info["scenario"] == "heal_twice"
    assert len(info["faults"]) == 4 and all("fired_at" in f for f in info["faults"])
    assert info["versions"] == list(range(1, 11))


def test_a_fault_beyond_the_run_is_a_scenario_error_before_it_runs(tmp_path, capsys) -> None:
    bad = tmp_path / "too_short.toml"
    bad.write_text(
        'name = "too_short"\n[loop]\nsteps = 3\n'
        '[[faults]]\nkind = "kill_cell"\ncell = 1\npoint = "before_allreduce"\nstep = 5\n'
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(bad), "--seed", "2", "--json"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    assert "faults[0] (kill_cell).step: step 5 is beyond the run's 3 steps (0..2)" in captured.err


def test_a_violation_exits_1_and_the_replay_line_reproduces_the_hash(tmp_path, capsys) -> None:
    bad = tmp_path / "never.toml"  # cell 1 never sends weights while cell 0 is alive
    bad.write_text(
        'name = "never"\n[loop]\nsteps = 3\n'
        '[[faults]]\nkind = "kill_cell"\ncell = 1\npoint = "after_bucket"\nbucket = 0\n'
    )
    assert main(["run", str(bad), "--seed", "2", "--json"]) == 1
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert info["oracles"]["fault_witness"] == "fail"
    (fault,) = info["faults"]
    assert "completed its 3 steps without reaching that point for cell 1" in fault["never_fired"]
    replay = captured.err.strip().splitlines()[-1]
    assert replay.startswith("replay: python -m sim run ")
    argv = shlex.split(replay.removeprefix("replay: "))[3:]
    assert main([*argv, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["history_hash"] == info["history_hash"]


def test_trace_opens_as_chrome_trace_json(tmp_path, capsys) -> None:
    trace = tmp_path / "run.json"
    assert main(["run", "cell_crash_before_allreduce", "--trace", str(trace)]) == 0
    capsys.readouterr()
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and "tid" in e}
    assert {"cell-0", "cell-1", "engine-0", "engine-1"} <= names
    assert any(e["ph"] == "i" and e["name"] == "fault kill_cell cell-1" for e in events)
    assert {e["name"] for e in events if e["ph"] == "C"} >= {
        "weight version",
        "staleness",
        "buffer depth",
    }
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 for e in spans)


def test_human_output_names_the_verdicts(capsys) -> None:
    assert main(["run", "first_update"]) == 0
    out = capsys.readouterr().out
    assert "first_update seed=0: 1/1 steps, completed" in out
    assert out.count(" pass") == len(ORACLES) and "history hash:" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "no_such_scenario"], "unknown scenario 'no_such_scenario'"),
        (["run", "missing.toml"], "file 'missing.toml' does not exist"),
        (["run", "no_failure", "--steps", "0"], "--steps: got 0; pass an integer >= 1"),
        (["run", "no_failure", "--check-every", "0"], "--check-every: got 0"),
    ],
)
def test_bad_input_is_named(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stepz = 3", "unknown top-level keys ['stepz']"),
        ("[loop]\nsteps = 0", "[loop].steps: got 0"),
        ("[sim]\ncores = 4", "[sim]: unknown keys ['cores']"),
        ("preset = 'huge'", "unknown preset 'huge'"),
        (
            "[[faults]]\nkind = 'kill_cell'\npoint = 'before_allreduce'\nstep = 1",
            "faults[0] (kill_cell).cell: is missing",
        ),
        ("[[faults]]\nkind = 'kill_cell'\ncell = 0", "says neither 'at' nor 'point'"),
        (
            "[[faults]]\nkind = 'kill_cell'\ncell = 0\nat = 1.0\nwhen = 3",
            "faults[0] (kill_cell).when: is not used by a fault at a time",
        ),
        ("[[faults]]\nkind = 'melt'\ncell = 0\nat = 1.0", "faults[0].kind: got 'melt'"),
        (
            "[[faults]]\nkind = 'kill_cell'\ncell = '1'\nat = 1.0",
            "faults[0] (kill_cell).cell: got '1'",
        ),
        ("name = [", "is not valid TOML"),
        ("[loop]\nunused_samples_handler = 'keep'", "[loop].unused_samples_handler: got 'keep'"),
    ],
)
def test_malformed_scenario_files_name_the_field(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as error:
        load_scenario_file(path)
    assert message in str(error.value)


def test_find_scenario_prefers_names_then_files() -> None:
    assert find_scenario("no_failure") is SCENARIOS["no_failure"]
    assert find_scenario(str(FILES / "heal_twice.toml")).name == "heal_twice"


def test_live_checks_stop_a_run_at_the_first_safety_violation() -> None:
    from miles_core.events import History, StepCommitted, VersionPublished
    from sim.run import OracleStop, _live_checker

    history = History()
    history.observe(_live_checker(history, every=2))
    history.append(VersionPublished(t=0.0, update_id=0, version=5, updater=0))
    history.append(VersionPublished(t=1.0, update_id=1, version=1, updater=1))
    history.append(StepCommitted(t=2.0, step=0, attempt=1, n_groups=1))  # step 1 of 2: no check
    with pytest.raises(OracleStop) as stop:
        history.append(StepCommitted(t=3.0, step=1, attempt=1, n_groups=1))
    assert stop.value.violation.oracle == "monotonic_versions"


def test_live_checks_pass_a_clean_run(capsys) -> None:
    info = run_json(capsys, "cell_crash_before_allreduce", "--check-every", "1")
    assert info["status"] == "completed" and set(info["oracles"].values()) == {"pass"}


def test_a_swarm_seed_saved_as_a_scenario_replays_without_the_swarm(tmp_path, capsys) -> None:
    saved = tmp_path / "seed7.toml"
    first = run_json(capsys, "swarm", "--seed", "7", "--save-scenario", str(saved))
    assert "[[faults]]" in saved.read_text()  # what the seed drew, as a file a person reads
    again = run_json(capsys, str(saved), "--seed", "7")
    assert again["history_hash"] == first["history_hash"]
    assert again["faults"] == first["faults"]


def test_the_swarm_prints_what_it_drew(capsys) -> None:
    from sim.search.swarm import swarm_scenario

    drawn = {seed: len(swarm_scenario(seed).faults) for seed in range(200)}
    many = next(seed for seed, n in drawn.items() if n >= 2)
    assert main(["run", "swarm", "--seed", str(many)]) == 0
    out = capsys.readouterr().out
    assert "world:" in out and "flags:" in out
    lines = [line for line in out.splitlines() if line.startswith("  fault ")]
    assert len(lines) == drawn[many] and all(": fired at t=" in line for line in lines)
    none = next(seed for seed, n in drawn.items() if n == 0)
    assert main(["run", "swarm", "--seed", str(none)]) == 0  # a seed that drew no fault says so
    assert "faults: none scheduled" in capsys.readouterr().out
