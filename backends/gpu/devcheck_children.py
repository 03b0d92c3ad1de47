"""What a device check is handed and how it runs its work: in spawned children, each with
its own environment, log and time limit, so that a CUDA or NCCL world that hangs or dies is
killed and reported, never the runner with it.

The runner (devcheck.py) and the checks (devcheck_checks.py, devcheck_run.py) both import
this; it imports neither, and nothing heavy (torch only when a child is spawned). A child's
entry point is a top-level function, which spawn imports by its module and name.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GRACE_S = 20.0  # once a child fails, how long its siblings get to report


class CheckFailed(Exception):
    """A check that ran and found something wrong; its figures go into the report."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass
class Context:
    """What a check is handed: the report's folder, the seconds it may take (set by the
    runner before each check), the entries so far, and a command in place of the GPU run."""

    out: Path
    timeout_s: float = 60.0
    results: dict[str, Any] = field(default_factory=dict)  # the report's entries so far
    run_command: Sequence[str] | None = None


def tail(text: str, lines: int = 15, chars: int = 3000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


def popen(command: list[str], **kwargs: Any) -> subprocess.Popen:
    """A child command whose output is read back as text."""
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def _apply(env: dict[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def environ(env: dict[str, str | None]) -> Iterator[None]:
    """os.environ with ``env`` applied (None deletes), so that a spawned child starts with it."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        _apply(env)
        yield
    finally:
        _apply(saved)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_context() -> Any:
    import torch.multiprocessing

    return torch.multiprocessing.get_context("spawn")


def _child_main(fn: Callable, rank: int, results: Any, log: str, env: dict, args: tuple) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    _apply(env)  # again, before anything in the child reads it
    try:
        results.put((rank, "ok", fn(*args)))
    except BaseException:
        traceback.print_exc()
        results.put((rank, "error", traceback.format_exc()))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def run_children(
    name: str, ctx: Context, entries: Sequence[tuple[Callable, tuple, dict]], timeout_s: float
) -> list[tuple[str, Any]]:
    """One spawned child per (fn, args, env); waits at most ``timeout_s`` for them all.

    Per child: ("ok", its return value), ("error", its traceback), ("exited", why: it
    died without a word) or ("timeout", why: it was killed).
    """
    mp = spawn_context()
    results = mp.Queue()
    (ctx.out / "logs").mkdir(parents=True, exist_ok=True)
    procs = []
    for rank, (fn, args, env) in enumerate(entries):
        log = ctx.out / "logs" / f"{name}.{rank}.log"
        with environ(env):
            proc = mp.Process(target=_child_main, args=(fn, rank, results, str(log), env, args))
            proc.start()
        procs.append((proc, log))
    got: dict[int, tuple[str, Any]] = {}
    deadline, why_killed = time.monotonic() + timeout_s, f"no report in {timeout_s:.0f} s"

    def note(rank: int, kind: str, value: Any) -> None:
        nonlocal deadline, why_killed
        got[rank] = (kind, value)
        if kind != "ok" and deadline > time.monotonic() + GRACE_S:
            deadline = time.monotonic() + GRACE_S  # the others may wait on it forever
            why_killed = f"no report {GRACE_S:.0f} s after child {rank} failed"

    def receive(wait: float) -> None:
        with contextlib.suppress(queue.Empty, ValueError):
            while True:  # one wait, then all that is there
                note(*results.get(timeout=wait))
                wait = 0.05

    try:
        while len(got) < len(procs) and time.monotonic() < deadline:
            receive(max(0.0, min(1.0, deadline - time.monotonic())))
            for rank, (proc, log) in enumerate(procs):
                if rank not in got and not proc.is_alive():
                    receive(0.5)  # its report may still be in the pipe
                    if rank not in got:
                        why = f"exit code {proc.exitcode} before reporting\n{log_tail(log)}"
                        note(rank, "exited", why)
    finally:
        for rank, (proc, log) in enumerate(procs):
            proc.join(timeout=10 if rank in got else 0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            if rank not in got:
                got[rank] = ("timeout", f"{why_killed}; killed\n{log_tail(log)}")
    return [got[rank] for rank in range(len(procs))]


def all_ok(name: str, outcomes: list[tuple[str, Any]], figures: dict | None = None) -> list:
    """The children's return values, or CheckFailed naming those that did not return."""
    bad = {f"child_{r}": f"{k}: {tail(str(v))}" for r, (k, v) in enumerate(outcomes) if k != "ok"}
    if bad:
        raise CheckFailed(f"{name}: {', '.join(bad)} failed", {**(figures or {}), **bad})
    return [value for _, value in outcomes]


# ---------------------------------------------------------------- the runner
