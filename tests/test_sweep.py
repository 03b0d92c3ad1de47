"""`python -m sim sweep` on a local Ray, and `python -m sim shrink` on what it finds.

What CI's sweep must show: every oracle passes on 1,000 swarm seeds over 2
workers, every core rare-state probe is reached (--require-probes), the re-checked
seeds give the same hash, the coverage map's JSON has the cells these seeds must
hit, and no Ray process is left. A planted control bug is
found by a sweep and shrunk to a scenario of a few faults that still fails the
oracle named for it, and passes without the bug.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_core.oracles import ORACLES
from miles_core.probes import CORE
from miles_core.scenario import load_scenario_file
from sim.cli.shrink import main as shrink_main
from sim.cli.sweep import _parser as sweep_parser
from sim.cli.sweep import _sources as sweep_sources
from sim.cli.sweep import main as sweep_main
from sim.run import run_scenario
from sim.search.fanout import SweepRun, Tally
from sim.search.judge import CRASHED, SeedTask, judge
from sim.search.plants import PLANTS, planted
from sim.search.shrinker import ddmin
from sim.search.swarm import swarm_scenario
from sim.search.sweep_report import summary, text_lines
from tests.ray_cluster import leftovers

MUST_HIT = {
    "kill_cell@before_allreduce:allreduce",
    "kill_cell@during_heal:healing",
    "kill_cell@after_bucket:stamping",
    "restart_engine@after_bucket:stamping",  # the window of the restart-before-stamp bug
    "restart_engine@at_time:training",
    "kill_engine@mid_generation:generating",
    "slow_link@step_begin:generating",
}
"""Cells CI's seeds hit (the swarm draws each of them on most seeds' way)."""


@pytest.fixture
def ray_tmp() -> Iterator[Path]:
    """A short temp dir for the sweep's local Ray (its socket paths must stay short)."""
    path = Path(tempfile.mkdtemp(prefix="rsw-", dir="/tmp"))
    yield path
    left = leftovers(str(path))
    for pid in left:  # whatever a failed test left must not slow the tests after it
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)
    assert left == []  # the sweep shut its Ray down


def _sweep(ray_tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = os.environ | {"RAY_TMPDIR": str(ray_tmp)}
    command = [sys.executable, "-m", "sim", "sweep", "--workers", "2", *argv]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def test_a_sweep_of_1000_seeds_passes_every_oracle_reaches_every_probe_and_covers_the_map(
    ray_tmp: Path, tmp_path: Path
) -> None:
    argv = ("--seeds", "1000", "--require-probes", "--json", "--out", str(tmp_path))
    done = _sweep(ray_tmp, *argv)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info == json.loads((tmp_path / "sweep.json").read_text())
    assert info["seeds"] == 1000 and info["ok"] and info["failures"] == []
    assert all(c == {"passed": 1000, "failed": 0} for c in info["oracles"].values())
    probes = info["probes"]
    assert probes["core_missed"] == [] and set(probes["core"]) == CORE
    assert all(probes["seeds"][name] > 0 for name in CORE)
    assert info["findability"] is None  # no plant
    assert sorted(info["oracles"]) == sorted(ORACLES)  # every oracle
    assert info["determinism"] == {"rechecked": 20, "differed": []}
    coverage = info["coverage"]
    assert set(coverage["cells"]) >= MUST_HIT, MUST_HIT - set(coverage["cells"])
    assert coverage["aimed_seeds"] > 0 and coverage["aimed_seeds_that_hit_their_cell"] > 0
    assert set(coverage["empty"]).isdisjoint(coverage["cells"])
    assert (tmp_path / "coverage.png").stat().st_size > 10_000
    assert not (tmp_path / "failures").exists()


def test_a_planted_bug_is_found_and_shrunk_to_a_few_faults(
    ray_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bug = "stamp_by_engine_id"
    oracle = PLANTS[bug][1]
    done = _sweep(ray_tmp, "--seeds", "80", "--plant", bug, "--json", "--out", str(tmp_path))
    assert done.returncode == 1, done.stderr[-3000:]
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["failures"] and all(oracle in f["oracles"] for f in info["failures"])
    found = info["findability"]
    caught = len(info["failures"])
    assert found["caught"] == caught and found["rate"] == caught / 80
    assert found["seeds_to_first_catch"] == min(f["seed"] for f in info["failures"]) + 1
    needed = found["seeds_for_99_percent"]  # the fewest seeds that miss it at most 1% of runs
    assert (1 - found["rate"]) ** needed <= 0.01 < (1 - found["rate"]) ** (needed - 1)
    first = info["failures"][0]
    name = f"swarm-seed{first['seed']}"
    (folder,) = [p for p in (tmp_path / "failures").iterdir() if p.name.split("-aim")[0] == name]
    assert first["replay"] in (folder / "failure.txt").read_text()
    assert (folder / "scenario.toml").exists()

    monkeypatch.chdir(tmp_path)
    assert shrink_main([first["replay"], "--out", "small.toml"]) == 0
    small = load_scenario_file(tmp_path / "small.toml")
    assert 1 <= len(small.faults) <= 3, small.faults
    with planted(bug):
        assert run_scenario(small, first["seed"]).verdicts[oracle] is not None
    assert run_scenario(small, first["seed"]).ok  # without the bug the scenario passes


def test_require_probes_fails_a_sweep_that_missed_a_core_probe(ray_tmp: Path) -> None:
    done = _sweep(ray_tmp, "--seeds", "2", "--require-probes", "--recheck", "0")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "failing seeds: 0" in done.stdout  # every seed passed: the probes failed it
    missed = done.stderr.strip().splitlines()[-1]
    assert missed.startswith("--require-probes: no seed reached ")
    named = set(missed.removeprefix("--require-probes: no seed reached ").split(", "))
    assert named and named <= CORE
    assert "core probes no seed reached: " in done.stdout


def _as_in_a_terminal() -> None:
    """SIGINT as a terminal's foreground job has it: a runner that started these tests in
    the background (nohup, `&`) leaves it ignored, and Python keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("after", [0.0, 3.0])
def test_ctrl_c_reports_what_finished_and_leaves_no_ray(ray_tmp: Path, after: float) -> None:
    """After 0 s: as Ray starts its workers, inside ray.init (a Ctrl-C there once left a
    half-started core worker, and the interpreter crashed at exit); after 3 s: mid-sweep."""
    env = os.environ | {"RAY_TMPDIR": str(ray_tmp)}
    command = [sys.executable, "-m", "sim", "sweep", "--seeds", "1000000", "--workers", "2"]
    sweep = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_as_in_a_terminal,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(ray_tmp.glob("*/session_*/logs/worker-*")) and time.monotonic() < deadline:
            time.sleep(0.1)  # Ray is starting its workers
        time.sleep(after)
        sweep.send_signal(signal.SIGINT)
        out, err = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:  # a sweep that ignored Ctrl-C fails the test, not the run
            sweep.terminate()
            sweep.communicate(timeout=60)
    assert sweep.returncode == 130, err[-2000:]
    assert b"(interrupted)" in out and b"oracle" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--seed-range", "5:2"], "--seed-range"),
        (["--seeds", "0"], "--seeds"),
        (["--scenario", "no_such_scenario"], "no_such_scenario"),
        (["--scenario", "swarm", "no_failure", "no_such_scenario"], "no_such_scenario"),
        (["--plant", "no_such_bug"], "--plant"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_bad_input_is_refused_before_ray_starts(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        sweep_main(argv)
    assert stop.value.code == 2
    assert flag in capsys.readouterr().err


def test_scenarios_come_after_one_flag_or_with_the_flag_repeated() -> None:
    """The issue's form, ``--scenario swarm|NAME|FILE ...``, and the flag repeated."""
    args = sweep_parser().parse_args(
        ["--scenario", "swarm", "no_failure", "--scenario", "engine_restart"]
    )
    assert [s.text for s in sweep_sources(args)] == ["swarm", "no_failure", "engine_restart"]
    assert [s.scenario is None for s in sweep_sources(args)] == [True, False, False]


def test_a_sweep_stopped_before_ray_started_says_so() -> None:
    """Ctrl-C during Ray's start-up: no seed ran, and the report does not count nodes."""
    info = summary(SweepRun(Tally(), interrupted=True), workers=2, nodes=0, plant=None)
    first = text_lines(info, Tally())[0]
    assert first.startswith("0 seeds in 0.0 s before Ray had started") and "(interrupted)" in first
    info = summary(SweepRun(Tally()), workers=2, nodes=3, plant=None)
    assert "on 2 workers (0 of 3 nodes)" in text_lines(info, Tally())[0]


def test_a_sweep_counts_the_windows_that_met_nothing_to_act_on() -> None:
    """An idle window passes its witness, so a sweep says how many there were: a map cell
    that only idle windows hit would otherwise look exercised."""
    path = (
        Path(__file__).resolve().parents[1]
        / "scenarios/files/slow_link_while_the_filter_refills.toml"
    )
    scenario = load_scenario_file(path)
    outcome = judge(SeedTask(str(path), 16833, scenario))
    assert outcome.ok and outcome.idle == ("slow_link",)
    busy = judge(SeedTask(str(path), 1, scenario))  # here the next update falls in the window
    assert busy.ok and busy.idle == ()
    tally = Tally()
    for o in (outcome, busy, outcome):
        tally.add(o, "node")
    info = summary(SweepRun(tally), workers=2, nodes=1, plant=None)
    assert info["idle_windows"] == {"slow_link": 2}
    assert "idle windows (met nothing to act on; passed, witnessed nothing): slow_link 2" in (
        text_lines(info, tally)
    )


def test_shrink_refuses_a_run_that_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert shrink_main(["python -m sim run swarm --seed 1", "--out", os.devnull]) == 2
    assert "nothing to shrink" in capsys.readouterr().out


@given(
    st.lists(st.integers(0, 50), unique=True, max_size=30),
    st.sets(st.integers(0, 50), max_size=4),
)
def test_ddmin_keeps_exactly_what_the_failure_needs(items: list[int], needed: set[int]) -> None:
    """A failure that needs these items: ddmin returns them, in their order, and no more."""
    needed &= set(items)
    calls = []

    def fails(subset: list[int]) -> bool:
        calls.append(subset)
        return needed <= set(subset)

    assert ddmin(items, fails) == [x for x in items if x in needed]
    assert all(set(c) <= set(items) for c in calls)


def test_a_seed_that_crashes_is_a_failure_with_its_replay_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sim.search.judge

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("an injector's own bug")

    monkeypatch.setattr(sim.search.judge, "run_scenario", broken)
    outcome = judge(SeedTask("swarm", 3))
    assert not outcome.ok and outcome.failed == (CRASHED,)
    assert outcome.replay == "python -m sim run swarm --seed 3"
    assert "an injector's own bug" in outcome.failure


def test_a_shrink_keeps_the_same_failure_not_just_the_same_oracle() -> None:
    """fault_witness failing over a start_cell is another failure than over a restart."""
    from miles_core.events import FaultInjected
    from miles_core.kinds import FaultKind
    from miles_core.oracles import Violation
    from sim.search.shrinker import signature

    def witness(kind: FaultKind) -> Violation:
        fault = FaultInjected(t=1.0, index=0, fault=kind)
        return Violation("fault_witness", "had no effect", ((3, fault),))

    restart = signature(witness(FaultKind.RESTART_ENGINE))
    assert restart == signature(witness(FaultKind.RESTART_ENGINE))
    assert restart != signature(witness(FaultKind.START_CELL))
    assert signature(Violation("progress", "stalled")) == ("progress",)


def test_check_every_stops_at_the_first_violation_of_a_planted_bug() -> None:
    """--check-every's stop travels through the simulator's copy of failures intact."""
    with planted("stamp_by_engine_id"):
        result = run_scenario(swarm_scenario(9), 9, check_every=1)
    assert "update_order" in result.report.reason
    assert result.verdicts["update_order"] is not None


def test_a_shrink_whose_result_no_longer_fails_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shrunk scenario is run once more from the text it would write; a shrinker that
    skipped a check (here: one that drops every fault) is refused, not printed."""
    import sim.cli.shrink

    monkeypatch.setattr(
        sim.cli.shrink,
        "shrink",
        lambda scenario, shrinker: dataclasses.replace(scenario, faults=()),
    )
    out = tmp_path / "small.toml"
    replay = (
        "python -m sim run scenarios/files/heal_twice.toml --seed 3 --plant dead_cell_in_exchange"
    )
    assert shrink_main([replay, "--out", str(out)]) == 1
    assert "no longer fails end_state" in capsys.readouterr().err
    assert not out.exists()
