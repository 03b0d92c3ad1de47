"""What the soak's processes hold, read from /proc every few seconds: resident memory, open
file descriptors and threads of the driver, of each Ray worker (the actors: trainer ranks,
engines) and of Ray's daemons, summed by role. A leak shows as growth of a role's sum
between the start and the end of the soak (report.growth), whatever processes come and go.

Linux only: a process that cannot be read (gone meanwhile) counts as nothing that sample.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from backends.common.session.process_tree import Proc

PROC = Path("/proc")
ROLES = ("driver", "actors", "daemons")
METRICS = ("processes", "rss_mb", "fds", "threads")
"""A role's process count beside its sums: a sum that grows with the count is processes
that came back from faults (or linger), one that grows without it is a leak."""


@dataclass(frozen=True)
class Usage:
    """One process's figures at one moment."""

    rss_mb: float
    fds: int
    threads: int
    processes: int = 1


@dataclass(frozen=True)
class Sample:
    """Every role's summed figures at ``t`` (seconds since the soak began)."""

    t: float
    figures: dict[str, Usage]
    processes: int
    events: int = 0
    """The run's history's length then: the driver holds every event (held.py)."""


def usage(pid: int) -> Usage | None:
    """The process's RSS, open fds and threads; None when it is gone or unreadable."""
    try:
        status = (PROC / str(pid) / "status").read_text()
        fds = len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kb = int(fields.get("VmRSS", "0 kB").split()[0])
    return Usage(rss_kb / 1024.0, fds, int(fields.get("Threads", "0").strip()))


RAYS_OWN = (b"ray::IDLE", b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")
"""Titles of Ray's own worker processes: a pooled worker with no task, and its agents."""


def role(pid: int, driver: int) -> str:
    """driver (this process), actors (Ray workers titled ``ray::`` and the actor's class),
    daemons (Ray's own: its servers, agents and idle pooled workers)."""
    if pid == driver:
        return "driver"
    try:
        title = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "daemons"
    if title.startswith(RAYS_OWN) or not title.startswith(b"ray::"):
        return "daemons"
    return "actors"


def total(usages: Iterable[Usage]) -> Usage:
    found = list(usages)
    return Usage(
        sum(u.rss_mb for u in found),
        sum(u.fds for u in found),
        sum(u.threads for u in found),
        len(found),
    )


def sample(t: float, procs: Iterable[Proc], driver: int, events: int = 0) -> Sample:
    """One sample of the driver and ``procs`` (the session's processes), summed by role;
    ``events``: the history's length."""
    by_role: dict[str, list[Usage]] = {name: [] for name in ROLES}
    count = 0
    for pid in {p.pid for p in procs} | {driver}:
        found = usage(pid)
        if found is not None:
            by_role[role(pid, driver)].append(found)
            count += 1
    return Sample(t, {name: total(found) for name, found in by_role.items()}, count, events)


class Sampler:
    """A thread that samples every ``every`` seconds until stopped; it keeps every process
    it saw (``seen``), to find after shutdown any still alive."""

    def __init__(
        self,
        processes: Callable[[], set[Proc]],
        every: float = 3.0,
        events: Callable[[], int] = lambda: 0,
    ) -> None:
        self.processes = processes
        self.events = events
        self.every = every
        self.samples: list[Sample] = []
        self.seen: set[Proc] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)
        self._start = time.monotonic()

    def start(self) -> None:
        self._start = time.monotonic()
        self._thread.start()

    def _loop(self) -> None:
        driver = os.getpid()
        while True:
            procs = self.processes()
            self.seen |= procs
            now = time.monotonic() - self._start
            self.samples.append(sample(now, procs, driver, self.events()))
            if self._stop.wait(self.every):
                return

    def since_start(self, moment: float) -> float:
        """``moment`` (time.monotonic()) as a sample's t."""
        return moment - self._start

    def stop(self) -> list[Sample]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.samples
