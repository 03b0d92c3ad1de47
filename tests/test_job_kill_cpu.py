"""A real job killed as a whole and resumed: ``backends.cpu run --save D --save-interval 1``
is SIGKILLed (the driver and every process of its Ray session) after a step drawn from the
test's seed, ``--load D`` continues it, and the two histories joined
(``python -m sim judge-joined``) pass every oracle: the versions go on from the save without
a gap or a repeat, every prompt is trained exactly once across the kill."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the CPU backend needs the cpu extra (see the README)")

from backends.common.run.saves import list_saves, write_save
from backends.common.training.policy import PolicyConfig
from miles_core.events import JobResumed, SaveCommitted, StepCommitted, VersionPublished
from miles_core.oracles import check_all
from miles_core.saves import SaveState, choose_save
from sim.cli.judge_joined import join, read_history
from tests.ray_cluster import session_processes

STEPS = 6


@pytest.fixture
def job(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A short RAY_TMPDIR (Ray's socket paths must fit in 107 bytes) and a save folder."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="rk", dir="/tmp"))
    yield ray_tmp, tmp_path
    for pid in session_processes(ray_tmp):  # only after a failed test: do not leak them
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _saves(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().count('"type": "SaveCommitted"')
    return 0


def _kill_job(process: subprocess.Popen[bytes], ray_tmp: Path) -> None:
    """SIGKILL to every process of the run at once: the driver and its Ray session's."""
    victims = {process.pid, *session_processes(ray_tmp)}
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=60)


def test_a_job_killed_whole_resumes_from_its_save_and_the_joined_history_passes(job) -> None:  # type: ignore[no-untyped-def]
    ray_tmp, folder = job
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    saves, first, second = folder / "saves", folder / "a.jsonl", folder / "b.jsonl"
    draw = random.Random(2026)  # the step, and how far into the next one, from the seed
    kill_after, into = draw.randint(1, STEPS - 2), draw.uniform(0.0, 0.5)
    run = [sys.executable, "-m", "backends.cpu", "run", "--steps", str(STEPS), "--json"]
    run += ["--save", str(saves), "--save-interval", "1"]
    process = subprocess.Popen(
        [*run, "--history", str(first)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while _saves(first) < kill_after and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(into)
    assert process.poll() is None, "the run ended before the kill"
    _kill_job(process, ray_tmp)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while session_processes(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert session_processes(ray_tmp) == []  # nothing of the killed job lives on

    killed = read_history(first)
    committed = [e.step for e in killed if isinstance(e, SaveCommitted)]
    assert committed, "no save committed before the kill"
    resumed = subprocess.run(
        [*run, "--load", str(saves), "--history", str(second)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    joined = join([killed, read_history(second)])
    (restart,) = [e for e in joined if isinstance(e, JobResumed)]
    assert restart.save_step == max(committed)  # the newest committed save, nothing older
    versions = [e.version for e in joined if isinstance(e, VersionPublished)]
    assert versions[-1] == STEPS  # the sequence ends where a run without a kill ends
    steps = [e.step for e in joined if isinstance(e, StepCommitted)]
    assert steps[-1] == STEPS - 1
    verdicts = check_all(joined, 600.0)
    assert all(v is None for v in verdicts.values()), [str(v) for v in verdicts.values() if v]
    judged = subprocess.run(
        [sys.executable, "-m", "sim", "judge-joined", str(first), str(second)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert judged.returncode == 0, judged.stderr
    assert session_processes(ray_tmp) == []


def test_a_save_without_its_tracker_is_torn_and_never_chosen(tmp_path: Path) -> None:
    """The files a kill mid-save leaves: state and ranks written, the tracker not."""
    for step in (0, 1):
        state = SaveState(step, step + 1, 4 * (step + 1), (), 0)
        write_save(tmp_path, state, [{"w": step}], PolicyConfig())
    (tmp_path / "save-000001" / "committed").unlink()  # the kill came before the tracker
    stored = list_saves(tmp_path)
    assert [(s.state.step, s.committed) for s in stored] == [(0, True), (1, False)]
    resume = choose_save(stored)
    assert resume.state is not None and resume.state.step == 0 and resume.torn == (1,)
    (tmp_path / "save-000002").mkdir()  # killed before even its state was written: no save
    assert len(list_saves(tmp_path)) == 2
