"""The process tree a local Ray session waits for at shutdown
(backends/common/session/process_tree)."""

from __future__ import annotations

import subprocess
import time

from backends.common.session.process_tree import Proc, alive, descendants, wait_gone


def _tree() -> subprocess.Popen:
    """A shell with two sleeping children (and so three processes in all)."""
    process = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    deadline = time.monotonic() + 10
    while len(descendants([process.pid])) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    return process


def test_descendants_hold_the_root_and_every_child() -> None:
    process = _tree()
    try:
        found = descendants([process.pid])
        assert len(found) == 3 and process.pid in {p.pid for p in found}
        assert all(alive(p) for p in found)
    finally:
        wait_gone(descendants([process.pid]), timeout_s=0)
        process.wait(timeout=10)


def test_what_does_not_end_in_time_is_killed_and_named() -> None:
    process = _tree()
    found = descendants([process.pid])
    left = wait_gone(found, timeout_s=0.2)
    assert left == found  # sleep 60 does not end in 0.2 s
    process.wait(timeout=10)
    # SIGKILL is delivered, not done, when kill returns: on a loaded machine a killed child
    # was seen still running a moment later
    deadline = time.monotonic() + 10
    while any(alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(alive(p) for p in found)


def test_a_process_that_ends_on_its_own_is_not_killed() -> None:
    process = subprocess.Popen(["sleep", "0.3"])
    found = descendants([process.pid])
    assert len(found) == 1
    left = wait_gone(found, timeout_s=10)
    assert left == set()
    assert process.wait(timeout=10) == 0  # ended by itself, not by a SIGKILL (-9)


def test_a_reused_pid_is_not_ours() -> None:
    process = subprocess.Popen(["sleep", "60"])
    try:
        (mine,) = descendants([process.pid])
        other = Proc(mine.pid, mine.started + 1)  # same pid, another start: not the same one
        assert alive(mine) and not alive(other)
        assert wait_gone([other], timeout_s=0) == set()
        assert process.poll() is None  # the live process under that pid was left alone
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_gone_root_has_no_tree() -> None:
    process = subprocess.Popen(["true"])
    process.wait(timeout=10)
    assert descendants([process.pid]) == set()
