"""python -m backends.cpu run [--steps K] [--scenario FILE|NAME] [--seed N] [--trace out.json]
[--json] [--address ADDR] [--save DIR] [--load DIR] [--update-weight-transfer-mode MODE]

Runs the loop for real on a local Ray with virtual GPUs (or joins ADDR): torch
trainer cells, HTTP engines, gloo weight transfer. One line of metrics per step
(reward, version, staleness, transfer time and GB/s). A run whose history
violates an oracle exits 1 and prints the command that replays its scenario
and seed (a real run repeats its decisions, not its timings).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from tqdm import tqdm

from backends.cpu.run import TRAIN, RealResult, run_real
from miles_core.errors import ConfigError
from miles_core.events import StepCommitted
from miles_core.oracles import verdict_lines
from miles_core.transfer import TransferMode
from sim.scenarios import find_scenario
from sim.trace import write_trace


def _print_human(result: RealResult) -> None:
    info = result.summary()
    print(f"{info['scenario']} seed {info['seed']}: {info['status']}, {info['steps']} steps")
    print(f"  reason: {result.report.reason}")
    print(f"  versions: {result.report.versions}")
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
    print("\n".join(verdict_lines(result.verdicts)))
    print(f"  history hash: {info['history_hash']}")


def _run(args: argparse.Namespace) -> int:
    scenario = TRAIN if args.scenario is None else find_scenario(args.scenario, args.seed)
    if args.update_weight_transfer_mode is not None:
        loop = dataclasses.replace(
            scenario.loop, transfer_mode=TransferMode(args.update_weight_transfer_mode)
        )
        scenario = dataclasses.replace(scenario, loop=loop)
    steps = args.steps or scenario.loop.steps
    command = ["python", "-m", "backends.cpu", "run", "--seed", str(args.seed)]
    command += ["--steps", str(steps)]
    if args.scenario is not None:
        command += ["--scenario", args.scenario]
    if args.load is not None:
        command += ["--load", args.load]
    if args.update_weight_transfer_mode is not None:
        command += ["--update-weight-transfer-mode", args.update_weight_transfer_mode]
    bar = tqdm(total=steps, unit="step", disable=True if args.json else None, leave=False)
    result = run_real(
        scenario,
        args.seed,
        steps,
        timeout=args.timeout,
        address=args.address,
        observers=[lambda e: bar.update(1) if isinstance(e, StepCommitted) else None],
        on_line=(lambda line: None) if args.json else (lambda line: bar.write(str(line))),
        save_to=Path(args.save) if args.save else None,
        load_from=Path(args.load) if args.load else None,
    )
    bar.close()
    if args.trace:
        write_trace(result.history, Path(args.trace))
    if args.json:
        print(json.dumps(result.summary(), sort_keys=True))
    else:
        _print_human(result)
    if not result.ok:
        print(f"replay: {shlex.join(command)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backends.cpu", description="the loop for real, on Ray, on CPU"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train (default) or run a scenario for real")
    run.add_argument(
        "--scenario",
        default=None,
        help="a simulator scenario name or .toml file (default: train 20 steps, no fault)",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--trace", help="write a Chrome trace (open it in Perfetto)")
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.add_argument(
        "--address", default=None, help="join this Ray cluster instead of starting one"
    )
    run.add_argument(
        "--update-weight-transfer-mode",
        choices=[TransferMode.BROADCAST.value, TransferMode.P2P.value],
        default=None,
        help="broadcast: one gloo group of all engines; p2p: one per engine",
    )
    run.add_argument("--save", metavar="DIR", help="save model, optimizer and ledger at the end")
    run.add_argument("--load", metavar="DIR", help="resume from a --save checkpoint")
    run.add_argument(
        "--timeout", type=float, default=900.0, help="wall seconds before the run counts as stalled"
    )
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    try:
        return _run(args)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
