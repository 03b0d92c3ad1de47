"""The ``run`` command both real backends share: the same flags, lines, summary and exit codes.

Runs the loop for real on a local Ray with virtual GPUs (or joins ADDR). One
line of metrics per step (reward, version, staleness, transfer time and GB/s),
and each fault as it fires. The end of the run reads like the simulator's: the
world and flags, the story step by step, the faults, the verdicts. Exit codes as
the simulator's: 0 all oracles passed, 1 one failed (the command that replays
the scenario and seed is printed; a real run repeats its decisions, not its
timings), 2 the scenario or the command is wrong, 130 after Ctrl-C (the run ends as
interrupted, its world closed and Ray shut down within 2 s; the summary says what ran
and what the safety oracles found, then the replay line). Every LoopConfig flag is taken
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
from typing import Any

from tqdm import tqdm

from backends.common.run.flags import OWN_FLAGS, build_parser
from backends.common.run.history_stream import HistoryStream
from backends.common.run.plot import plot_steps
from backends.common.run.preflight import check_address, check_folders
from backends.common.run.ray_run import (
    TRAIN,
    RealResult,
    StepLine,
    check_real,
    check_token_seconds,
    run_real,
)
from backends.common.stack import CPU_STACK, Stack, Wire
from backends.common.training.flags import training_from
from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.events import EngineStateChanged, Event, FaultInjected, StepCommitted
from miles_core.loop.flags import flags_argv, given_flags, with_flags
from miles_core.outputs import check_distinct_paths
from miles_core.report import (
    check_writable,
    chrome_trace,
    step_metrics,
    text_lines,
    write_json,
    write_json_lines,
)
from miles_core.report.interrupt import (
    INTERRUPTED_EXIT,
    REPORT_SECONDS,
    OutOfTime,
    not_judged_lines,
    short_lines,
    short_summary,
    time_limit,
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


def _postfix(bar: tqdm, line: StepLine, engines_up: str) -> None:
    """The bar's figures after each step: reward, version, staleness, engines serving."""
    bar.set_postfix(
        reward=f"{line.reward:.3f}",
        version=line.version,
        staleness=f"{line.staleness:.2f}",
        engines=engines_up,
    )


def _print_human(result: RealResult, info: dict[str, Any]) -> None:
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
    if args.engine_token_seconds is not None:
        command += ["--engine-token-seconds", str(args.engine_token_seconds)]
    return shlex.join(command + flags_argv(given_flags(args, OWN_FLAGS)))


def _preflight(args: argparse.Namespace, outputs: dict[str, Path | None]) -> None:
    """Before Ray starts: one path per output (none on the scenario file), the folders of
    --load and --save, and a cluster at --address that answers (last: it may wait)."""
    scenario_file = args.scenario if args.scenario and Path(args.scenario).is_file() else None
    check_distinct_paths({**outputs, "--save": args.save}, {"--scenario": scenario_file})
    check_folders(args.load, args.save, periodic=bool(getattr(args, "save_interval", 0)))
    check_address(args.address)


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
    history = check_writable(args.history, "--history") if args.history else None
    plot = check_writable(args.plot, "--plot") if args.plot else None
    scenario = TRAIN if args.scenario is None else find_scenario(args.scenario)
    loop = with_flags(scenario.loop, given_flags(args, OWN_FLAGS))
    scenario = dataclasses.replace(scenario, loop=loop)
    if loop.save_interval and args.save is None:
        raise ConfigError(
            "--save-interval", f"is {loop.save_interval} with nowhere to save", "add --save DIR"
        )
    training = training_from(args, loop.rollout_batch_size)
    steps_given = args.steps if training is None or training.steps is None else training.steps
    scenario = check_real(scenario.with_run(steps=steps_given, seed=args.seed))
    stack, scenario = stack_from(args, scenario)
    _preflight(args, {"--trace": trace, "--metrics": metrics, "--history": history, "--plot": plot})
    stack = dataclasses.replace(stack, packed=args.flattened_bucket)
    steps = scenario.loop.steps
    bar = tqdm(total=steps, unit="step", disable=True if args.json else None, leave=False)
    say = (lambda text: None) if args.json else bar.write

    engines, out_of_rotation = scenario.world.num_engines, set()

    def watch(event: Event) -> None:
        if isinstance(event, EngineStateChanged):  # the bar's "engines up": those serving
            if event.new is EngineState.SERVING:
                out_of_rotation.discard(event.engine)
            else:
                out_of_rotation.add(event.engine)
        if isinstance(event, StepCommitted):
            count_step(bar)
        elif isinstance(event, FaultInjected):
            target = f"cell {event.cell}" if event.cell is not None else event.engine or "the world"
            say(f"fault {event.fault.value} {target} at t={event.t:.2f} ({event.detail})")

    stream = HistoryStream(history) if history is not None else None
    packed = ["--flattened-bucket"] if args.flattened_bucket else []
    trained = list(training.argv) if training is not None else []
    replay = _replay(args, steps, prog, [*extra_replay, *packed, *trained])
    try:
        result = run_real(
            scenario,
            args.seed,
            timeout=args.timeout,
            address=args.address,
            show_start=not args.json,
            interruptible=True,
            observers=[watch] if stream is None else [watch, stream],
            on_line=lambda line: (
                say(str(line)),
                _postfix(bar, line, f"{engines - len(out_of_rotation)}/{engines}"),
            ),
            announce=lambda what: say(f"  killing {what} (injected)"),
            save_to=Path(args.save) if args.save else None,
            load_from=Path(args.load) if args.load else None,
            engine_token_seconds=args.engine_token_seconds,
            stack=stack,
            **({} if training is None else {"policy": training.policy, "task": training.task}),
        )
    except KeyboardInterrupt:  # before the run began (Ray held it while it started), or twice
        bar.close()
        if stream is not None:
            stream.close()
        print(
            f"\ninterrupted (Ctrl-C) before a step ran, or twice\nreplay: {replay}", file=sys.stderr
        )
        return INTERRUPTED_EXIT
    bar.close()
    if stream is not None:
        stream.close()
    if result.interrupted:
        return _interrupted(args, result, replay)
    if plot is not None and result.lines:
        plot_steps(result.lines, plot, f"{prog} run, seed {args.seed}")
    return _finish(args, result, (trace, metrics, history), replay)


def _finish(
    args: argparse.Namespace,
    result: RealResult,
    files: tuple[Path | None, Path | None, Path | None],
    replay: str,
) -> int:
    """The files asked for, the summary and the exit code of a run that ended by itself."""
    trace, metrics, history = files
    if trace is not None:
        write_json(trace, chrome_trace(result.history), "--trace")
    if history is not None:
        write_json_lines(history, result.history.to_dicts(), "--history")
    if metrics is not None:
        write_json_lines(metrics, step_metrics(result.history), "--metrics")
    info = result.summary()
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        _print_human(result, info)
    if not result.ok:
        print(f"replay: {replay}", file=sys.stderr)
        return 1
    return 0


def _interrupted(args: argparse.Namespace, result: RealResult, replay: str) -> int:
    """Ctrl-C: what ran and what the oracles found, in the time left (the full summary, or
    its first line when that does not fit), then the replay line; no file is written."""
    info = None
    try:
        with time_limit(REPORT_SECONDS):
            info = result.summary() if len(result.history) else None
    except (OutOfTime, KeyboardInterrupt):
        info = None
    history, report, verdicts = result.history, result.report, result.verdicts
    short = short_summary(result.scenario, args.seed, history, report, verdicts, "wall")
    if args.json:
        print(json.dumps((info or short) | {"not_judged": result.not_judged}, sort_keys=True))
    else:
        if info is not None:
            _print_human(result, info)
        else:
            print("\n".join(short_lines(short, verdicts)))
        print("\n".join(not_judged_lines(result.not_judged)))
        flags = ("--trace", "--metrics")
        skipped = [flag for flag in flags if getattr(args, flag[2:])]
        if skipped:
            print(f"  {' and '.join(skipped)}: not written, the run was interrupted")
        if args.history:
            print("  --history: the events recorded until the interrupt (written as they came)")
    print(f"replay: {replay}", file=sys.stderr)
    return INTERRUPTED_EXIT


def main(argv: list[str] | None = None) -> int:
    """python -m backends.cpu: torch FSDP2 trainer cells, local HTTP engines, gloo, on CPU."""
    parser, _ = build_parser("backends.cpu", "the loop for real, on Ray, on CPU", add_cpu_flags)
    args = parser.parse_args(argv)
    try:
        return run_command(args, extra_replay=cpu_stack_flags(args))
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits
