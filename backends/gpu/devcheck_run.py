"""The device check's two runs of the GPU backend's own command, ``python -m backends.gpu run
... --json``: on the tiny policy (``gpu_run``), and on a checkpoint and data set written
here (``gpu_run_checkpoint``). Each reads the run's JSON summary from its last line; a
failed oracle, an exit code or a run past its time fails the check. No torch here: the run
is a child command, killed with its process group when its time is up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from backends.gpu.devcheck_children import CheckFailed, Context, popen, tail

REPO = Path(__file__).resolve().parents[2]
RUN_ARGS = ("-m", "backends.gpu", "run", "--engine", "local", "--transport", "ipc", "--steps")
RUN_ARGS += ("10", "--device", "cuda", "--json")


def last_json(stdout: str) -> dict | None:
    """The last line of ``stdout`` that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.strip().startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


SUMMARY_KEYS = ("status", "reason", "error", "steps", "final_version", "oracles", "verdicts")
SUMMARY_KEYS += ("violations", "mean_reward_first", "mean_reward_last", "transfer")
SUMMARY_KEYS += ("seconds_per_step",)


def gpu_run(ctx: Context) -> dict[str, Any]:
    """``python -m backends.gpu run ... --json`` (or ``ctx.run_command``): its summary."""
    command = list(ctx.run_command) if ctx.run_command else [sys.executable, *RUN_ARGS]
    return _run_summary(ctx, command)


def gpu_run_checkpoint(ctx: Context) -> dict[str, Any]:
    """The same run on a checkpoint and data set written here (``python -m backends.tasks
    make``: a small Llama, sums scored by miles' ``math`` reward), GRPO with a KL term, 20
    steps: its summary, whose first and last mean reward show whether it learns on CUDA,
    and the curve (``--plot``) beside the report (``ctx.run_command`` replaces the run)."""
    if ctx.run_command:
        return _run_summary(ctx, list(ctx.run_command))
    task = ctx.out / "task"
    made = subprocess.run(
        [sys.executable, "-m", "backends.tasks", "make", "--out", str(task)],
        cwd=REPO, capture_output=True, text=True, timeout=min(120.0, ctx.timeout_s),
    )  # fmt: skip
    if made.returncode:
        raise CheckFailed("backends.tasks make failed", {"stderr_tail": tail(made.stderr)})
    command = [sys.executable, *RUN_ARGS[:-3], "20", "--device", "cuda", "--json"]
    command += ["--hf-checkpoint", str(task / "checkpoint"), "--prompt-data"]
    command += [str(task / "train.jsonl"), "--label-key", "label", "--rm-type", "math"]
    command += ["--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--use-kl-loss"]
    command += ["--kl-loss-coef", "0.05", "--kl-loss-type", "low_var_kl"]
    command += ["--plot", str(ctx.out / "checkpoint-curve.png")]
    return _run_summary(ctx, command)


def _run_summary(ctx: Context, command: list[str]) -> dict[str, Any]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    timeout, figures = min(240.0, ctx.timeout_s), {"command": shlex.join(command)}
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": path}
    proc = popen(command, cwd=REPO, env=env, start_new_session=True)  # a group to kill
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        figures |= {"stdout_tail": tail(out), "stderr_tail": tail(err, 30)}
        raise CheckFailed(f"the run did not end in {timeout:.0f} s; killed", figures) from None
    figures |= {"returncode": proc.returncode, "seconds": time.perf_counter() - t0}
    summary = last_json(out) or {}
    figures |= {k: summary[k] for k in SUMMARY_KEYS if k in summary}
    oracles = summary.get("oracles", summary.get("verdicts"))
    oracles = oracles if isinstance(oracles, dict) else {}
    failed = sorted(k for k, v in oracles.items() if v not in ("pass", None))
    if proc.returncode != 0 or not summary or failed:
        figures |= {"stdout_tail": tail(out), "stderr_tail": tail(err, 30)}
        why = f"oracles failed: {failed}" if failed else "no JSON line on stdout"
        why = f"exit code {proc.returncode}" if proc.returncode else why
        raise CheckFailed(f"the GPU run failed: {why}", figures)
    return figures
