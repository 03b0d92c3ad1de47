"""python -m backends.cpu run [--steps K] [--scenario FILE|NAME] [--seed N] [--trace out.json]
[--json] [--metrics out.jsonl] [--address ADDR] [--save DIR] [--load DIR]
[miles' loop flags: --pause-generation-mode in_place, --use-fault-tolerance, ...]

Runs the loop for real on a local Ray with virtual GPUs (or joins ADDR): torch
trainer cells, HTTP engines, gloo weight transfer. One line of metrics per step
(reward, version, staleness, transfer time and GB/s), and each fault as it
fires. The end of the run reads like the simulator's: the world and flags, the
story step by step, the faults, the verdicts. Exit codes as the simulator's: 0
all oracles passed, 1 one failed (the command that replays the scenario and seed
is printed; a real run repeats its decisions, not its timings), 2 the scenario
or the command is wrong. Every LoopConfig flag is taken in miles' spelling, as
by the simulator's CLI, and goes into the replay line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from tqdm import tqdm

from backends.common.run import TRAIN, RealResult, check_real, check_token_seconds, run_real
from miles_core.errors import ConfigError
from miles_core.events import Event, FaultInjected, StepCommitted
from miles_core.loop.flags import add_loop_flags, flags_argv, given_flags, with_flags
from miles_core.report import (
    check_writable,
    chrome_trace,
    run_cli,
    step_metrics,
    text_lines,
    write_json,
    write_json_lines,
)
from miles_core.scenario import find_scenario

OWN_FLAGS = ("steps",)


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


def _replay(args: argparse.Namespace, steps: int) -> str:
    command = ["python", "-m", "backends.cpu", "run", "--seed", str(args.seed)]
    command += ["--steps", str(steps)]
    if args.scenario is not None:
        command += ["--scenario", args.scenario]
    if args.load is not None:
        command += ["--load", args.load]
    if args.engine_token_seconds:
        command += ["--engine-token-seconds", str(args.engine_token_seconds)]
    return shlex.join(command + flags_argv(given_flags(args, OWN_FLAGS)))


def _run(args: argparse.Namespace) -> int:
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
    steps = scenario.loop.steps
    bar = tqdm(total=steps, unit="step", disable=True if args.json else None, leave=False)
    say = (lambda text: None) if args.json else bar.write

    def watch(event: Event) -> None:
        if isinstance(event, StepCommitted):
            bar.update(1)
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
        print(f"replay: {_replay(args, steps)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backends.cpu", description="the loop for real, on Ray, on CPU"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="train (default) or run a scenario for real",
        allow_abbrev=False,  # a misspelt flag is an error, never a guess
    )
    run.add_argument(
        "--scenario",
        default=None,
        help="a scenario name (python -m sim list) or a .toml file (default: train 20 steps, "
        "no fault); a swarm seed runs here once saved with python -m sim run swarm "
        "--save-scenario FILE",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--trace", help="write a Chrome trace (open it in Perfetto)")
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.add_argument(
        "--address", default=None, help="join this Ray cluster instead of starting one"
    )
    run.add_argument(
        "--metrics", metavar="FILE", help="write miles' rollout metrics as JSON lines, one per step"
    )
    run.add_argument("--save", metavar="DIR", help="save model, optimizer and ledger at the end")
    run.add_argument("--load", metavar="DIR", help="resume from a --save checkpoint")
    run.add_argument(
        "--timeout", type=float, default=900.0, help="wall seconds before the run counts as stalled"
    )
    run.add_argument(
        "--engine-token-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="a floor on each generated token's time (default 0: as fast as the tiny policy "
        "goes, about a millisecond); longer requests live across more weight updates",
    )
    add_loop_flags(run, skip=OWN_FLAGS)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    sys.exit(run_cli(main))
