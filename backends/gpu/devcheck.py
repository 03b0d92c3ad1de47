"""python -m backends.gpu devcheck --out DIR: what the GPU host can do, in one short run.

The checks (``CHECKS``, in ``backends.gpu.devcheck_checks``) run in order; each writes
its entry to ``DIR/devcheck.json`` as it starts ("running") and as it ends, so a run cut
short still shows what it found and where it stopped. An entry is ``{"status":
"passed", "seconds": S, "figures": {...}}``, ``{"status": "failed", "error": ...,
"traceback"|"figures": ...}`` or ``{"status": "skipped", "reason": ...}``. Without a
CUDA device every check that needs one is skipped, saying so; a check that raises is
recorded as failed and the next one runs. Exit codes: 0 every check asked for passed, or
was skipped while another that needs a GPU ran; 1 a check failed; 3 (``NOTHING_CHECKED``)
none failed but every check that needs a GPU was skipped (no CUDA device, or no time
left), so the GPU was not checked at all: a host without one must not read as a pass;
2 the command is wrong (``--out`` a folder that cannot be made or written, checked before
any check runs). The run keeps to ``budget_s``: each check gets at most its own limit
and what is left, enforced by killing its child processes (``run_children``), whose
output goes to ``DIR/logs/CHECK.RANK.log``. Progress goes to stderr, a line a check.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import queue
import shlex
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError

# name -> (needs a CUDA device, the most seconds it may take)
PLAN: dict[str, tuple[bool, float]] = {
    "environment": (False, 90.0),
    "copy_ceiling": (True, 60.0),
    "cuda_ipc": (True, 120.0),
    "nccl_two_hosts": (True, 120.0),
    "nccl_duplicate_gpu_refused": (True, 70.0),
    "megatron_tp1": (True, 150.0),
    "fsdp2_step": (True, 120.0),
    "gpu_run": (True, 240.0),
    "gpu_run_checkpoint": (True, 300.0),
}
CHECKS: tuple[str, ...] = tuple(PLAN)
MIN_SECONDS = 10.0  # no check starts with less time than this left
NOTHING_CHECKED = 3  # the exit code when every check that needs a GPU was skipped
GRACE_S = 20.0  # once a child fails, how long its siblings get to report


class CheckFailed(Exception):
    """A check that ran and found something wrong; its figures go into the report."""

    def __init__(self, message: str, figures: dict[str, Any]) -> None:
        super().__init__(message)
        self.figures = figures


@dataclass
class Context:
    out: Path
    timeout_s: float = 60.0
    results: dict[str, Any] = field(default_factory=dict)  # the report's entries so far
    run_command: Sequence[str] | None = None


# ---------------------------------------------------------------- child processes


def tail(text: str, lines: int = 15, chars: int = 3000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


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


def cuda_status() -> tuple[bool, str]:
    """(usable, the device's name or why not, starting "no CUDA device: ")."""
    try:
        import torch
    except Exception as error:
        return False, f"no CUDA device: torch does not import ({error})"
    if torch.version.cuda is None:
        return False, f"no CUDA device: torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
        return False, (
            f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}, CUDA_VISIBLE_DEVICES={visible})"
        )
    return True, torch.cuda.get_device_name(0)


def _check(name: str) -> Callable[[Context], dict[str, Any]]:
    # Looked up per run, so that a test can replace one.
    return getattr(importlib.import_module("backends.gpu.devcheck_checks"), name)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _run_one(name: str, ctx: Context) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        figures = _check(name)(ctx)
    except CheckFailed as failure:
        entry = {"status": "failed", "error": str(failure), "figures": failure.figures}
    except Exception as error:
        lines = traceback.format_exc().rstrip().splitlines()
        message = f"{type(error).__name__}: {error}"[-2000:]
        entry = {"status": "failed", "error": message, "traceback": "\n".join(lines[-12:])}
    else:
        entry = {"status": "passed", "figures": figures}
    return {"status": entry.pop("status"), "seconds": time.perf_counter() - t0, **entry}


def _first_write(out: Path, path: Path, report: dict[str, Any]) -> None:
    """The folder made and the report's first version written, or a ConfigError naming
    --out: a folder that cannot be made (``/proc/x``) is the command's mistake, said before
    any check runs, not a traceback."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write(path, report)
    except OSError as error:
        raise ConfigError(
            "--out",
            f"cannot write {str(path)!r} ({error.strerror or error})",
            "pass a folder that can be made and written",
        ) from None


def _nothing_checked(entries: dict[str, Any]) -> int | None:
    """NOTHING_CHECKED when checks that need a GPU were asked for and every one was skipped
    (the line saying so goes to stderr); None otherwise."""
    gpu = {name: entries[name] for name in entries if PLAN[name][0]}
    if not gpu or any(e["status"] != "skipped" for e in gpu.values()):
        return None
    why = next(iter(gpu.values()))["reason"]
    print(f"devcheck: nothing was checked on a GPU ({why}): exit {NOTHING_CHECKED}",
          file=sys.stderr)  # fmt: skip
    return NOTHING_CHECKED


def run_devcheck(
    out: Path,
    *,
    budget_s: float = 450.0,
    checks: Sequence[str] | None = None,
    run_command: Sequence[str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Run the checks (all of ``CHECKS``, or those named, in ``CHECKS`` order) into
    ``out/devcheck.json``; returns (exit code, the report)."""
    unknown = sorted(set(checks or ()) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; known: {', '.join(CHECKS)}")
    names = [n for n in CHECKS if checks is None or n in checks]
    out = Path(out)
    path, start = out / "devcheck.json", time.monotonic()
    report: dict[str, Any] = {"started": _now(), "finished": None, "budget_s": budget_s}
    report |= {"elapsed_s": None, "exit_code": None, "cuda": None, "planned": names, "checks": {}}
    entries = report["checks"]
    ctx = Context(out=out, results=entries, run_command=run_command)
    cuda: tuple[bool, str] | None = None
    _first_write(out, path, report)
    for name in names:
        needs_cuda, limit = PLAN[name]
        if needs_cuda and cuda is None:
            cuda = cuda_status()
            report["cuda"] = {"available": cuda[0], "detail": cuda[1]}
        left = budget_s - (time.monotonic() - start)
        if needs_cuda and cuda is not None and not cuda[0]:
            entries[name] = {"status": "skipped", "reason": cuda[1]}
        elif left < MIN_SECONDS:
            why = f"time budget spent: {max(left, 0):.0f} s of {budget_s:.0f} s left"
            entries[name] = {"status": "skipped", "reason": why}
        else:
            ctx.timeout_s = min(limit, left)
            entries[name] = {"status": "running", "started": _now(), "timeout_s": ctx.timeout_s}
            _write(path, report)
            print(f"devcheck: {name} ... ({ctx.timeout_s:.0f} s at most)", file=sys.stderr)
            entries[name] = _run_one(name, ctx)
        entry = entries[name]
        detail = entry.get("reason") or entry.get("error") or f"{entry['seconds']:.1f} s"
        print(f"devcheck: {name}: {entry['status']} ({detail.splitlines()[0][:200]})",
              file=sys.stderr, flush=True)  # fmt: skip
        report["elapsed_s"] = time.monotonic() - start
        _write(path, report)
    statuses = [e["status"] for e in entries.values()]
    code = 1 if "failed" in statuses else _nothing_checked(entries) or 0
    report |= {"finished": _now(), "elapsed_s": time.monotonic() - start, "exit_code": code}
    report["counts"] = {s: statuses.count(s) for s in ("passed", "failed", "skipped")}
    _write(path, report)
    print(f"devcheck: report in {path} (exit {code})", file=sys.stderr, flush=True)
    return code, report


def main(argv: Sequence[str] | None = None) -> int:
    """``--out DIR [--budget S] [--checks a,b] [--run-command LINE]`` (python -m
    backends.gpu.devcheck; ``python -m backends.gpu devcheck`` takes --out and --budget)."""
    parser = argparse.ArgumentParser(prog="python -m backends.gpu devcheck", description=__doc__)
    parser.add_argument("--out", required=True, help="write DIR/devcheck.json (and DIR/logs)")
    parser.add_argument("--budget", type=float, default=450.0, help="seconds in all (default 450)")
    parser.add_argument("--checks", help=f"a comma-separated subset of: {', '.join(CHECKS)}")
    parser.add_argument("--run-command", help="the gpu_run check's command (one shell line)")
    args = parser.parse_args(argv)
    try:
        code, _ = run_devcheck(
            Path(args.out),
            budget_s=args.budget,
            checks=args.checks.split(",") if args.checks else None,
            run_command=shlex.split(args.run_command) if args.run_command else None,
        )
    except ConfigError as error:
        parser.error(str(error))
    return code


if __name__ == "__main__":
    sys.exit(main())
