"""A transfer bench killed midway leaves nothing behind: no process, nothing in /dev/shm or
/tmp, whichever way it ends (Ctrl-C, SIGTERM, SIGKILL of the command, a rank killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this machine")
LONG_RUN = [
    "--size-mib", "4", "--bucket-mib", "1", "--default-bucket-mib", "1",
    "--repeats", "100000", "--out", "", "--plot", "",
]  # fmt: skip


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def _left_behind() -> set[str]:
    tmp = {p.name for p in Path("/tmp").glob("transfer-bench-*")}
    return {p.name for p in SHM.iterdir()} | {f"/tmp/{n}" for n in tmp}


def _start_midway() -> tuple[subprocess.Popen, list[int]]:
    """The bench with its two ranks timing trials (rank 0's progress bar has moved)."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "backends.bench", "transfer", *LONG_RUN],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a background pytest starts with SIGINT ignored, which a child would inherit
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.set_blocking(bench.stderr.fileno(), False)
    seen, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline and b"MiB" not in seen and bench.poll() is None:
        seen += bench.stderr.read() or b""  # the bar names a block once trials run
        time.sleep(0.1)
    ranks = _children(bench.pid)
    if b"MiB" not in seen or len(ranks) < 2:
        bench.kill()
        pytest.fail(f"the bench did not reach its trials: {seen[-500:]!r}, children {ranks}")
    return bench, ranks


def _wait_gone(pids: list[int], seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize(
    ("how", "code"),
    [("sigint", 130), ("sigterm", 143), ("sigkill", -signal.SIGKILL), ("rank-killed", 1)],
)
def test_a_bench_killed_midway_leaves_no_process_and_nothing_in_dev_shm(
    how: str, code: int
) -> None:
    before = _left_behind()
    bench, ranks = _start_midway()
    if how == "rank-killed":
        os.kill(ranks[1], signal.SIGKILL)
    else:
        sent = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
        bench.send_signal(sent[how])
    try:
        assert bench.wait(30) == code
    finally:
        if bench.poll() is None:
            bench.kill()
    assert _wait_gone(ranks) == [], f"ranks left running after {how}"
    # the ranks held the pipe too: with every one gone, the rest of stderr ends at EOF
    os.set_blocking(bench.stderr.fileno(), True)
    err = bench.stderr.read().decode(errors="replace")
    assert _left_behind() - before == set()
    if how in ("sigint", "sigterm"):
        assert "every rank ended" in err and "Traceback" not in err
    if how == "rank-killed":
        assert "rank 1 ended with signal SIGKILL; the other ranks were stopped" in err
