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
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backends.gpu.devcheck_children import CheckFailed, Context
from miles_core.errors import ConfigError


@dataclass(frozen=True)
class Planned:
    """A check as the runner plans it (its function is ``devcheck_checks.<name>``)."""

    needs_cuda: bool
    limit_s: float
    """The most seconds it may take (less when less of the budget is left)."""


PLAN: dict[str, Planned] = {
    "environment": Planned(False, 90.0),
    "copy_ceiling": Planned(True, 60.0),
    "cuda_ipc": Planned(True, 120.0),
    "nccl_two_hosts": Planned(True, 120.0),
    "nccl_duplicate_gpu_refused": Planned(True, 70.0),
    "megatron_tp1": Planned(True, 150.0),
    "fsdp2_step": Planned(True, 120.0),
    "gpu_run": Planned(True, 240.0),
    "gpu_run_checkpoint": Planned(True, 300.0),
}
CHECKS: tuple[str, ...] = tuple(PLAN)
MIN_SECONDS = 10.0  # no check starts with less time than this left
MAX_BUDGET_S = 86_400.0
"""A day: a device session lends 15 minutes; a larger --budget is a typo, and a budget of
inf or 1e300 would let every check run on with no time cap."""
NOTHING_CHECKED = 3  # the exit code when every check that needs a GPU was skipped


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
    """The check's function, looked up by name when it runs (so that a test can replace one),
    imported here: the checks import torch, which the runner must start without (its first
    question is whether torch imports at all)."""
    from backends.gpu import devcheck_checks

    return getattr(devcheck_checks, name)


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
    gpu = {name: entries[name] for name in entries if PLAN[name].needs_cuda}
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
    if not 0.0 <= budget_s <= MAX_BUDGET_S:  # NaN fails both
        raise ConfigError(
            "--budget",
            f"got {budget_s:g} seconds",
            f"pass 0 <= S <= {MAX_BUDGET_S:g} (the checks' time in all)",
        )
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
        needs_cuda, limit = PLAN[name].needs_cuda, PLAN[name].limit_s
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
