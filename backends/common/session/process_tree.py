"""The processes a local Ray session started, so that none outlives the run.

``ray.shutdown`` stops Ray's daemons (raylet, GCS) and returns; the worker processes the
raylet forked notice their raylet is gone and exit on their own, a moment later. On a
loaded two-core machine that moment came after the command itself had ended (CI: two
workers still alive when the run's process was gone). So the session takes the process
tree under Ray's daemons before shutting them down and, after, waits for each of those
processes to end, killing what is left at a deadline.

A process is named by its pid and its start time (field 22 of ``/proc/PID/stat``), so a
pid the system reuses meanwhile is never mistaken for one of ours. Linux only: where
``/proc`` cannot be read the tree is empty and nothing is waited for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    started: int  # clock ticks after boot: with the pid, names one process for good


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a live process, None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in parentheses may hold spaces
    state, ppid, started = fields[0], int(fields[1]), int(fields[19])
    return ppid, started, state


def descendants(roots: Iterable[int]) -> set[Proc]:
    """The roots and every process below them, as they stand now."""
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, int, str]] = {}
    with contextlib.suppress(OSError):
        for entry in PROC.iterdir():
            if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
                stats[int(entry.name)] = stat
                children.setdefault(stat[0], []).append(int(entry.name))
    found: set[Proc] = set()
    todo = [pid for pid in roots if pid in stats]
    while todo:
        pid = todo.pop()
        found.add(Proc(pid, stats[pid][1]))
        todo.extend(children.get(pid, ()))
    return found


def alive(proc: Proc) -> bool:
    """Still running as the same process (a zombie has ended: its parent only has to reap it)."""
    stat = _stat(proc.pid)
    return stat is not None and stat[1] == proc.started and stat[2] != "Z"


def wait_gone(procs: Iterable[Proc], timeout_s: float, poll_s: float = 0.02) -> set[Proc]:
    """Wait up to ``timeout_s`` for every process to end; SIGKILL those that did not and
    return them (empty when all ended on their own)."""
    left = {p for p in procs if alive(p)}
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = {p for p in left if alive(p)}
    for proc in left:
        if alive(proc):  # checked again just before: the pid must still be ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
    return left
