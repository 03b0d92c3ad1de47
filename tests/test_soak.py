"""The soak (python -m backends.cpu soak): its draw, growth and verdict, pure; and one short
real soak that survives a fault with every oracle passing and no process left."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from backends.cpu.soak.draw import (
    FASTEST_SECONDS_PER_STEP,
    FORMS,
    HONOURED,
    Shape,
    draw_motifs,
    forms,
    schedule,
    steps_for,
)
from backends.cpu.soak.report import Growth, Verdict, growth, history_growth, summary_lines
from backends.cpu.soak.sample import Sample, Usage, role, sample, usage
from backends.cpu.soak.tracker import Failure, FaultLine, Tracker
from miles_core.fault_kinds import ROWS
from miles_core.kinds import FaultKind
from miles_core.scenario.faults import After
from sim.run import run_scenario
from sim.scenarios import SCENARIOS
from tests.ray_cluster import session_processes

SHAPE = Shape(cells=2, engines=2)


def test_the_draw_is_the_seeds() -> None:
    steps = steps_for(10)
    assert draw_motifs(7, steps, SHAPE) == draw_motifs(7, steps, SHAPE)
    assert draw_motifs(7, steps, SHAPE) != draw_motifs(8, steps, SHAPE)


def test_every_honoured_form_is_drawn() -> None:
    """Every kind but kill_job (which check_real refuses) has a motif, each
    round of draws holds every form, and a long soak's schedule strikes with every kind."""
    caught = {row.kind for row in ROWS if row.caught_by is not None}  # their oracle fails
    refused = {FaultKind.KILL_JOB}
    assert set(HONOURED) == {row.kind for row in ROWS} - refused - caught
    assert set(FORMS) == set(HONOURED)
    rng = random.Random(3)
    assert set(forms(rng, len(FORMS))) == set(HONOURED)  # one round: each form once
    motifs = draw_motifs(0, steps_for(60), SHAPE)
    assert {m.form for _, m in motifs} == set(HONOURED)
    assert {f.kind for f in schedule(motifs)} == set(HONOURED)


def test_the_real_world_takes_the_drawn_schedule_and_refuses_kill_job() -> None:
    from backends.common.run.ray_run import check_real
    from backends.cpu.soak.command import soak_scenario
    from miles_core.errors import ConfigError
    from miles_core.scenario.faults import make_fault

    scenario = soak_scenario(60, seed=0)  # every form, checked as a scenario's faults
    assert check_real(scenario) is scenario
    killed = dataclasses.replace(
        scenario, faults=(make_fault("kill_job", point="step_begin", step=1),)
    )
    with pytest.raises(ConfigError):
        check_real(killed)


def test_a_recovery_follows_its_own_fault() -> None:
    """``after = {fault = N}`` in a motif names its place in the motif; in the schedule, the
    same fault's place in the whole list."""
    motifs = draw_motifs(0, steps_for(60), SHAPE)
    faults = schedule(motifs)
    starts = [i for i, f in enumerate(faults) if isinstance(f.when, After)]
    assert starts
    for i in starts:
        first = faults[i].when.fault  # type: ignore[union-attr]
        assert first == i - 1 and first is not None


def test_growth_after_warm_up() -> None:
    flat = [100.0] * 50
    g = growth([500.0] * 10 + flat)  # the warm-up's figures are left out
    assert g == Growth(100.0, 100.0) and g.percent == 0.0
    rising = [100.0 + i for i in range(100)]
    g = growth(rising)  # kept 20..99; first window 20..35, last 84..99
    assert g is not None and g.first == pytest.approx(127.5) and g.last == pytest.approx(191.5)
    assert g.percent == pytest.approx(100 * 64 / 127.5)
    assert growth([1.0]) is None
    assert Growth(0.0, 0.0).percent == 0.0


def _verdict(**changes: object) -> Verdict:
    base: dict[str, object] = {
        "faults": (FaultLine(0, "kill_engine", "engine-0", 10.0, 20.0),),
        "oracles": {"exactly_once": None, "progress": None},
        "failures_as_it_went": (),
        "left": (),
        "growth": {},
        "status": "completed",
    }
    return Verdict(**(base | changes))  # type: ignore[arg-type]


def test_the_verdict_fails_on_a_failed_oracle_or_a_process_left() -> None:
    assert _verdict().ok and _verdict().exit_code == 0 and _verdict().survived == 1
    assert not _verdict(oracles={"exactly_once": "a sample twice", "progress": None}).ok
    assert _verdict(left=("pid 12: ray::IDLE",)).exit_code == 1
    assert not _verdict(failures_as_it_went=(Failure("exactly_once", 3.0, "twice"),)).ok
    unrecovered = (FaultLine(0, "kill_engine", "engine-0", 10.0, None),)
    assert _verdict(faults=unrecovered).survived == 0


def test_this_process_is_sampled_as_the_driver() -> None:
    mine = usage(os.getpid())
    assert mine is not None and mine.rss_mb > 1 and mine.fds > 0 and mine.threads >= 1
    taken = sample(0.0, set(), os.getpid())
    assert taken.processes == 1 and taken.figures["driver"].rss_mb > 1
    assert taken.figures["actors"].rss_mb == 0


def test_a_short_real_soak_survives_a_fault() -> None:
    """About 35 s: the world starts, seed 0's first form (a hung engine) strikes and
    is recovered, every oracle passes, and nothing of the session is left. Under today the
    hang meets an update, which gives the engine up after the soak's 10 s engine-request
    deadline and the controller heals it (command.soak_scenario); with miles' 300 s the
    update waited 5 minutes and the run ended with the fault not recovered."""
    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    out = tmp / "soak.json"
    env = {**os.environ, "RAY_TMPDIR": str(tmp)}
    command = [sys.executable, "-m", "backends.cpu", "soak", "--minutes", "0.25", "--seed", "0"]
    try:
        done = subprocess.run(
            [*command, "--out", str(out), "--sample-seconds", "1"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        info = json.loads(out.read_text())
        assert info["survived"] >= 1 and info["ok"]
        assert set(info["oracles"].values()) == {None} and len(info["oracles"]) >= 10
        assert info["left"] == [] and session_processes(tmp) == []
        assert info["growth"]["actors"]["rss_mb"] is not None  # the actors were sampled
        assert 40 < info["indexed_per_event"] < info["bytes_per_event"] < 2000
    finally:
        for pid in session_processes(tmp):  # only after a failed test: do not leak them
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_next_motif_waits_for_the_last_to_recover_even_at_the_fastest_pace() -> None:
    """At 0.45 s a step, a 30-minute soak's steps came 1.6 times faster than planned: a
    fail_rank struck a cell a lost heartbeat still held down, never fired, and fault_witness
    failed. Spacing is now the recovery's seconds at the fastest pace."""
    for seed in range(5):
        motifs = draw_motifs(seed, steps_for(30), Shape(2, 2))
        for (step, motif), (later, _) in itertools.pairwise(motifs):
            assert later - step >= motif.settle / FASTEST_SECONDS_PER_STEP, (seed, motif.form)


def test_each_role_counts_its_processes_beside_its_sums() -> None:
    taken = sample(0.0, set(), os.getpid())
    assert taken.figures["driver"].processes == 1 and taken.figures["actors"].processes == 0


def test_ray_s_own_workers_count_as_daemons_and_actors_as_actors() -> None:
    """An idle pooled worker and Ray's agents are titled ``ray::`` too: counted as actors,
    they hid which role grew (a soak's actors gained processes that were Ray's)."""
    titles = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::TrainerRank")
    procs = [subprocess.Popen(["bash", "-c", f"exec -a {t} sleep 60"]) for t in titles]
    try:
        for proc in procs:  # until each has exec'd under its title
            path = Path(f"/proc/{proc.pid}/cmdline")
            for _ in range(200):
                if path.read_bytes().startswith(b"ray::"):
                    break
                subprocess.run(["sleep", "0.01"], check=True)
        found = [role(proc.pid, os.getpid()) for proc in procs]
        assert found == ["daemons", "daemons", "daemons", "actors"]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_the_tracker_reads_the_runs_history_and_lines_each_recovered_fault() -> None:
    """The tracker keeps no list of its own: its history is the one the run records into,
    whose length the sampler reads as the run's."""
    run = run_scenario(SCENARIOS["engine_restart"], seed=0)
    lines: list[str] = []
    tracker = Tracker(say=lines.append)
    tracker.history.observe(tracker)
    for event in run.history:
        tracker.history.append(event)
    faults = tracker.finish()
    assert len(tracker.history) == len(run.history)
    assert [(f.kind, f.recovered_at is not None) for f in faults] == [("restart_engine", True)]
    assert lines and "recovered in" in lines[0] and tracker.judged >= 1 and not tracker.failures
    assert 40 < tracker.indexed_per_event < 60  # read as it judged (a pointer and an int)


FREED = """
import gc, json, tracemalloc
from backends.cpu.soak.held import bytes_per_event
from sim.run import run_scenario
from sim.scenarios import SCENARIOS
tracemalloc.start()
events = list(run_scenario(SCENARIOS["no_failure"], 0, steps=40).history)
estimate = bytes_per_event(events)
gc.collect()  # the run's own History (its observers make a cycle): only `events` left
before, count = tracemalloc.get_traced_memory()[0], len(events)
del events
gc.collect()
print(json.dumps([estimate, (before - tracemalloc.get_traced_memory()[0]) / count]))
"""


def test_bytes_an_event_holds_match_what_freeing_the_history_gives_back() -> None:
    """held.bytes_per_event against tracemalloc: the bytes freed when a history's events go,
    in a fresh interpreter (in a long pytest process, values made before tracemalloc started
    and kept by caches are not freed with the events)."""
    done = subprocess.run(
        [sys.executable, "-c", FREED], capture_output=True, text=True, timeout=120, check=True
    )
    estimate, freed = json.loads(done.stdout)
    assert 100 < estimate < 400 and estimate == pytest.approx(freed, rel=0.15)


def _sample(t: float, driver_mb: float, events: int) -> Sample:
    figures = {"driver": Usage(driver_mb, 10, 5), "actors": Usage(0, 0, 0, 0)}
    return Sample(t, figures | {"daemons": Usage(0, 0, 0, 0)}, 1, events)


def test_the_driver_s_growth_is_told_apart_from_the_history_it_holds() -> None:
    """A driver that grows by exactly its history's bytes grew by design; one that grows
    beside it leaks, and the summary says which."""
    per_event = 1024.0**2 / 1000  # a MB every 1,000 events
    design = [_sample(t, 500.0 + t, int(t * 1000)) for t in range(100)]
    found = history_growth(design, per_event)
    assert found["mb"] is not None and found["mb"].last - found["mb"].first == pytest.approx(64)
    net = found["driver_net_rss_mb"]
    assert net is not None and net.percent == pytest.approx(0.0)
    leak = [_sample(t, 500.0 + 3 * t, int(t * 1000)) for t in range(100)]
    net = history_growth(leak, per_event)["driver_net_rss_mb"]
    assert net is not None and net.percent > 10
    text = "\n".join(summary_lines(_verdict(history=found, bytes_per_event=per_event), 1.0, 9))
    assert "events at about 1049 B each" in text and "net of the history: rss_mb 500.0" in text
