"""The ``run`` command both real backends share: the same flags, lines, summary and exit codes.

Runs the loop for real on a local Ray with virtual GPUs (or joins ADDR). One
line of metrics per step (reward, version, staleness, transfer time and GB/s),
and each fault as it fires. The end of the run reads like the simulator's: the
world and flags, the story step by step, the faults, the verdicts. Exit codes as
the simulator's: 0 all oracles passed, 1 one failed (the command that replays
the scenario and seed is printed; a real run repeats its decisions, not its
timings), 2 the scenario or the command is wrong. Every LoopConfig flag is taken
in miles' spelling, as by the simulator's CLI, and goes into the replay line.
A backend adds its own flags (``add_run_flags``'s ``extra``) and turns them into
a Stack and a world shape (``StackFrom``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from backends.common.run import TRAIN, RealResult, check_real, check_token_seconds, run_real
from backends.common.run_flags import OWN_FLAGS, build_parser
from backends.common.stack import CPU_STACK, Stack, Wire
from miles_core.errors import ConfigError
from miles_core.events import Event, FaultInjected, StepCommitted
from miles_core.loop.flags import flags_argv, given_flags, with_flags
from miles_core.report import (
    check_writable,
    chrome_trace,
    step_metrics,
    text_lines,
    write_json,
    write_json_lines,
)
from miles_core.report.progress import count_step
from miles_core.scenario import Scenario, find_scenario

StackFrom = Callable[[argparse.Namespace, Scenario], tuple[Stack, Scenario]]
"""A backend's flags to its Stack, and the scenario's world as that stack runs it."""


def add_cpu_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--wire",
        choices=("gloo", "shm"),
        default="gloo",
        help="how weight buckets reach the engines: a gloo group (default), or a group over "
        "the trainer's shared memory, as NCCL moves them within a node (one node only)",
    )


def cpu_stack_flags(args: argparse.Namespace) -> list[str]:
    """The stack's flags for the replay line (the default wire needs none)."""
    return ["--wire", args.wire] if args.wire != Wire.GLOO else []


def _cpu_stack(args: argparse.Namespace, scenario: Scenario) -> tuple[Stack, Scenario]:
    if args.wire == Wire.SHM and args.address is not None:
        raise ConfigError(
            "--wire",
            "shm with --address: an shm group needs every engine on its trainer's node, "
            "and a cluster places them across nodes",
            "pass --wire gloo to join a cluster",
        )
    return dataclasses.replace(CPU_STACK, wire=Wire(args.wire)), scenario


def _print_human(result: RealResult) -> None:
    info = result.summary()
    print("\n".join(text_lines(info, result.history, result.verdicts)))
    first, last = info["mean_reward_first"], info["mean_reward_last"]
    if first is not None:
        print(f"  mean reward: first step {first:.3f}, last step {last:.3f}")
    t = info["transfer"]
    if t["updates"]:
        print(
            f"  transfer: {t['bytes_per_update']} bytes/update, median "
            f"{t['median_seconds'] * 1e3:.1f} ms, {t['median_gbps']:.4f} GB/s"
        )
    print(f"  wall: {info['seconds_per_step']:.2f} s/step")
    if result.stack != CPU_STACK:
        print("  stack: " + ", ".join(f"{k} {v}" for k, v in result.stack.describe().items()))


def _replay(args: argparse.Namespace, steps: int, prog: str, extra: Sequence[str]) -> str:
    command = ["python", "-m", prog, "run", *extra, "--seed", str(args.seed)]
    command += ["--steps", str(steps)]
    if args.scenario is not None:
        command += ["--scenario", args.scenario]
    if args.load is not None:
        command += ["--load", args.load]
    if args.engine_token_seconds:
        command += ["--engine-token-seconds", str(args.engine_token_seconds)]
    return shlex.join(command + flags_argv(given_flags(args, OWN_FLAGS)))


def run_command(
    args: argparse.Namespace,
    prog: str = "backends.cpu",
    stack_from: StackFrom = _cpu_stack,
    extra_replay: Sequence[str] = (),
) -> int:
    """Check everything the user gave, then run once; the exit code."""
    if args.steps is not None and args.steps < 1:
        raise ConfigError("--steps", f"got {args.steps}", "pass an integer >= 1")
    check_token_seconds(args.engine_token_seconds)
    if args.timeout <= 0:
        raise ConfigError("--timeout", f"got {args.timeout}", "pass seconds > 0")
    trace = check_writable(args.trace, "--trace") if args.trace else None
    metrics = check_writable(args.metrics, "--metrics") if args.metrics else None
    scenario = TRAIN if args.scenario is None else find_scenario(args.scenario)
    loop = with_flags(scenario.loop, given_flags(args, OWN_FLAGS))
    scenario = dataclasses.replace(scenario, loop=loop)
    scenario = check_real(scenario.with_run(steps=args.steps, seed=args.seed))
    stack, scenario = stack_from(args, scenario)
    stack = dataclasses.replace(stack, packed=args.flattened_bucket)
    steps = scenario.loop.steps
    bar = tqdm(total=steps, unit="step", disable=True if args.json else None, leave=False)
    say = (lambda text: None) if args.json else bar.write

    def watch(event: Event) -> None:
        if isinstance(event, StepCommitted):
            count_step(bar)
        elif isinstance(event, FaultInjected):
            target = f"cell {event.cell}" if event.cell is not None else event.engine or "the world"
            say(f"fault {event.fault.value} {target} at t={event.t:.2f} ({event.detail})")

    result = run_real(
        scenario,
        args.seed,
        timeout=args.timeout,
        address=args.address,
        observers=[watch],
        on_line=lambda line: say(str(line)),
        announce=lambda what: say(
            f"  killing {what} (injected): Ray's messages about a worker that died are this"
        ),
        save_to=Path(args.save) if args.save else None,
        load_from=Path(args.load) if args.load else None,
        engine_token_seconds=args.engine_token_seconds,
        stack=stack,
    )
    bar.close()
    if trace is not None:
        write_json(trace, chrome_trace(result.history), "--trace")
    if metrics is not None:
        write_json_lines(metrics, step_metrics(result.history), "--metrics")
    if args.json:
        print(json.dumps(result.summary(), sort_keys=True))
    else:
        _print_human(result)
    if not result.ok:
        packed = ["--flattened-bucket"] if args.flattened_bucket else []
        print(f"replay: {_replay(args, steps, prog, [*extra_replay, *packed])}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """python -m backends.cpu: torch FSDP2 trainer cells, local HTTP engines, gloo, on CPU."""
    parser, _ = build_parser("backends.cpu", "the loop for real, on Ray, on CPU", add_cpu_flags)
    args = parser.parse_args(argv)
    try:
        return run_command(args, extra_replay=cpu_stack_flags(args))
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits
