"""Starting the bench's ranks, and ending every one of them whatever ends the command.

A rank is a child process (``python -m backends.bench.rank``) that reads its
config from the TCPStore this process hosts and, on rank 0, writes the raw
timings back to it. Nothing is named in the file system: the ceiling's segment
and the shm wire's arena are memfds, which the kernel frees with the last
process that maps them, so a kill at any instant leaves nothing in /dev/shm or
/tmp (the bench before this used ``mp.spawn``, a directory in /dev/shm and a
file in /tmp: a stopped run left 237 MB in /dev/shm, and spawn's semaphores).

How each ending reaches the ranks:

- a rank that fails or is killed: the others are ended at once (``BenchFailed``);
- SIGINT or SIGTERM to this process: raised here as ``Interrupted``, and the
  ranks are ended before it propagates; the ranks run in their own session, so a
  Ctrl-C in the terminal reaches this process only, and they end quietly;
- SIGKILL to this process: each rank asked the kernel to kill it when its parent
  dies (``PR_SET_PDEATHSIG``), and checks that its parent is still the launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

HOST = "127.0.0.1"
"""Every rank and the store on loopback: the bench never leaves this machine."""
RAW_KEY = "raw"
CONFIG_KEY = "config"
PARENT_ENV = "TRANSFER_BENCH_PARENT"
STOP_GRACE_SECONDS = 5.0
POLL_SECONDS = 0.05
PR_SET_PDEATHSIG = 1


class BenchFailed(RuntimeError):
    """A rank ended with an error or a signal; the others were ended."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the launcher; ``code`` is the shell's exit status for it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


def die_with_parent() -> None:
    """In a rank: be killed when the launcher dies, even by SIGKILL (Linux); if it is
    already gone (the kill came before this call), exit now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if str(os.getppid()) != os.environ.get(PARENT_ENV):
        os._exit(1)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` while the ranks run; the old handlers after."""

    def raise_(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, raise_) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _stop(ranks: list[subprocess.Popen]) -> None:
    """SIGTERM to every rank still running, SIGKILL to any that outlives the grace; a
    signal that comes meanwhile waits until every rank is gone."""
    held = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        _end(ranks)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _end(ranks: list[subprocess.Popen]) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for rank in ranks:
        try:
            rank.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()


def _start(ranks: list[subprocess.Popen], nprocs: int, port: int) -> None:
    """Each rank, in ``ranks`` before a signal can be taken (a signal between two starts
    stops those already started); the rank unblocks the signals first thing."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    held = {signal.SIGINT, signal.SIGTERM}
    for rank in range(nprocs):
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            ranks.append(
                subprocess.Popen(
                    [sys.executable, "-m", "backends.bench.rank", str(rank), str(port)],
                    env=env,
                    start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only
                )
            )
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _wait(ranks: list[subprocess.Popen]) -> None:
    """Until every rank exits 0; the first to fail ends the rest."""
    while True:
        codes = [r.poll() for r in ranks]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i, code = failed[0]
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            raise BenchFailed(f"rank {i} ended with {how}; the other ranks were stopped")
        if all(c == 0 for c in codes):
            return
        time.sleep(POLL_SECONDS)


def launch(config: dict[str, Any], nprocs: int, store_timeout_s: float = 60.0) -> dict[str, Any]:
    """Run ``nprocs`` ranks of ``config`` to the end; rank 0's raw timings."""
    import torch.distributed as dist

    store = dist.TCPStore(
        HOST,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=store_timeout_s),
    )
    store.set(CONFIG_KEY, json.dumps(config))
    ranks: list[subprocess.Popen] = []
    with _signals_raise():
        try:
            _start(ranks, nprocs, store.port)
            _wait(ranks)
        finally:
            _stop(ranks)
    return json.loads(store.get(RAW_KEY))
