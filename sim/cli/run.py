"""``python -m sim run`` and ``python -m sim list``, and the top-level parser they share
with every command's help line (``python -m sim --help``); ``python -m sim shrink`` parses a
run's arguments with it too.

    python -m sim list
    python -m sim run [NAME_OR_FILE] [--seed N] [--steps K] [--trace out.json] [--json]
                      [--metrics out.jsonl] [--history out.jsonl] [--check-every K]
                      [--save-scenario FILE]
                      [miles' loop flags: --pause-generation-mode retract, ...]

Exit codes: 0 when every oracle passed; 1 when one failed (the control plane
broke, or the run did not end as its scenario expects), with the command that
replays the run exactly as the last line on stderr; 2 when the scenario or the
command is wrong (nothing ran); 130 after Ctrl-C, which stops the run between two
events within 2 s: it ends as interrupted, the safety oracles judge what ran (in
the time left), and the summary and the replay line are printed as usual (see
miles_core/report/interrupt.py). Every LoopConfig flag can be given in miles'
spelling (``--max-weight-staleness 2``, ``--use-fault-tolerance``); it overrides
the scenario's value and is part of the replay line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from miles_core.ctrl_c import ctrl_c_counted, exit_code
from miles_core.errors import ConfigError
from miles_core.events import StepCommitted
from miles_core.loop.flags import RUN_OWN_FLAGS, add_loop_flags, flags_argv, given_flags
from miles_core.outputs import check_distinct_paths
from miles_core.report import (
    check_writable,
    chrome_trace,
    step_metrics,
    summary,
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
from miles_core.scenario import SCENARIOS, Scenario, save_scenario_file
from miles_core.scenario.limits import Limits, check_steps
from sim.cli import COMMANDS, HELP
from sim.run import SimResult, replay_command, run_scenario
from sim.scenarios import find_scenario
from sim.search.aim import parse_aim
from sim.search.plants import check_plant, planted
from sim.search.swarm import SWARM, SWARM_TOTAL_LOSS, swarm_scenario

DEFAULT_SCENARIO = "cell_crash_before_allreduce"


def _scenario(args: argparse.Namespace) -> Scenario:
    """The scenario named on the command line; a swarm is drawn for the run's length."""
    if args.scenario in (SWARM, SWARM_TOTAL_LOSS):
        steps = args.steps if args.steps is not None else 12
        check_steps(steps, Limits(), "--steps")  # before the draw, which spreads faults on them
        total_loss = args.scenario == SWARM_TOTAL_LOSS
        live = True if args.liveness else None
        scenario = swarm_scenario(
            args.seed, steps, total_loss=total_loss, aim=args.aim, liveness=live
        )
    else:
        if args.aim is not None:
            raise ConfigError("--aim", f"{args.scenario} is no swarm", "aim a swarm's seeds only")
        scenario = find_scenario(args.scenario, args.seed)
    return scenario.with_loop_flags(given_flags(args, RUN_OWN_FLAGS))


def scenario_of(args: argparse.Namespace) -> Scenario:
    """The scenario as the run sees it: --steps and the seed applied, and --liveness."""
    scenario = _scenario(args).with_run(steps=args.steps, seed=args.seed)
    if args.liveness and scenario.liveness is None:
        scenario = scenario.with_liveness()
    return scenario


def scenario_file(name: str) -> str | None:
    """The scenario argument when it is a file the run reads (not a name, not a swarm)."""
    if name in SCENARIOS or name in (SWARM, SWARM_TOTAL_LOSS) or not Path(name).is_file():
        return None
    return name


def _replay(args: argparse.Namespace, steps: int) -> str:
    extra = [] if args.check_every is None else ["--check-every", str(args.check_every)]
    extra += ["--liveness"] if args.liveness else []
    return replay_command(
        args.scenario,
        args.seed,
        steps,
        aim=None if args.aim is None else args.aim.key(),
        plant=args.plant,
        extra=[*extra, *flags_argv(given_flags(args, RUN_OWN_FLAGS))],
    )


def _run(args: argparse.Namespace) -> int:
    for flag, value in (("--steps", args.steps), ("--check-every", args.check_every)):
        if value is not None and value < 1:
            raise ConfigError(flag, f"got {value}", "pass an integer >= 1")
    if args.plant is not None:
        check_plant(args.plant)
    args.aim = parse_aim(args.aim) if args.aim is not None else None
    trace = check_writable(args.trace, "--trace") if args.trace else None
    save = check_writable(args.save_scenario, "--save-scenario") if args.save_scenario else None
    metrics = check_writable(args.metrics, "--metrics") if args.metrics else None
    history = check_writable(args.history, "--history") if args.history else None
    outputs = {"--trace": trace, "--metrics": metrics, "--save-scenario": save}
    outputs["--history"] = history
    check_distinct_paths(outputs, {"the scenario file": scenario_file(args.scenario)})
    scenario = scenario_of(args)
    if save is not None:
        save_scenario_file(save, scenario)
    bar = tqdm(
        total=scenario.loop.steps, unit="step", disable=True if args.json else None, leave=False
    )
    started = time.perf_counter()
    with planted(args.plant):
        result = run_scenario(
            scenario,
            args.seed,
            observers=[lambda e: count_step(bar) if isinstance(e, StepCommitted) else None],
            check_every=args.check_every,
            interruptible=True,
        )
    bar.close()
    replay = _replay(args, scenario.loop.steps)
    if result.interrupted:
        return _interrupted(args, result, time.perf_counter() - started, replay)
    try:
        files = (trace, metrics, save, history)
        return _report(args, result, time.perf_counter() - started, files, replay)
    except KeyboardInterrupt:  # Ctrl-C while the report is written: the run is still replayable
        print(f"\ninterrupted (Ctrl-C) while reporting\nreplay: {replay}", file=sys.stderr)
        return INTERRUPTED_EXIT


def _report(
    args: argparse.Namespace,
    result: SimResult,
    wall: float,
    files: tuple[Path | None, Path | None, Path | None, Path | None],
    replay: str,
) -> int:
    """The files asked for, the summary, and the exit code of a run that ended by itself."""
    trace, metrics, save, history = files
    info = summary(result.scenario, args.seed, result.history, result.report, result.verdicts)
    info["wall_seconds"] = wall
    if trace is not None:
        write_json(trace, chrome_trace(result.history), "--trace")
    if metrics is not None:
        write_json_lines(metrics, step_metrics(result.history), "--metrics")
    if history is not None:
        write_json_lines(history, result.history.to_dicts(), "--history")
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print("\n".join(text_lines(info, result.history, result.verdicts)))
        if (by := result.scenario.expect.caught_by) is not None:
            catch = result.judged[by]
            print(f"  expect.caught_by: {by} caught the fault" if catch is None else f"  {catch}")
        if save is not None:
            print(f"  scenario saved to {save}: python -m sim run {save} --seed {args.seed}")
    if not result.ok:
        print(f"replay: {replay}", file=sys.stderr)
        return 1
    return 0


def _interrupted(args: argparse.Namespace, result: SimResult, wall: float, replay: str) -> int:
    """Ctrl-C: what ran and what the oracles found, in the time left (the full summary, or
    its first line when that does not fit), then the replay line; no file is written."""
    info, lines = None, None
    try:
        with time_limit(REPORT_SECONDS):
            info = summary(
                result.scenario, args.seed, result.history, result.report, result.verdicts
            )
            lines = text_lines(info, result.history, result.verdicts)
    except (OutOfTime, KeyboardInterrupt):
        info, lines = None, None
    if info is None or lines is None:
        history, report, verdicts = result.history, result.report, result.verdicts
        info = short_summary(result.scenario, args.seed, history, report, verdicts, "simulated")
        lines = short_lines(info, verdicts)
    info |= {"wall_seconds": wall, "not_judged": result.not_judged}
    skipped = [flag for flag in ("--trace", "--metrics", "--history") if getattr(args, flag[2:])]
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print("\n".join([*lines, *not_judged_lines(result.not_judged)]))
        if skipped:
            print(f"  {' and '.join(skipped)}: not written, the run was interrupted")
        if args.save_scenario:
            print(f"  scenario saved to {args.save_scenario}")
    print(f"replay: {replay}", file=sys.stderr)
    return INTERRUPTED_EXIT


def _list() -> int:
    width = max(map(len, SCENARIOS))
    for name, scenario in SCENARIOS.items():
        print(f"{name:{width}s}  {scenario.description}")
    print(f"{SWARM:{width}s}  random: each seed draws its cluster, flags, faults and their moments")
    loss = "random: every cell dies; the run must stop with NoAliveCellError"
    print(f"{SWARM_TOTAL_LOSS:{width}s}  {loss}")
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim", description="the simulated cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help=HELP["list"])
    run = sub.add_parser(
        "run",
        help=HELP["run"],
        allow_abbrev=False,  # a misspelt flag is an error, never a guess
    )
    run.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        help=f"a name from 'python -m sim list', or a .toml file (default: {DEFAULT_SCENARIO})",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--trace", help="write a Chrome trace (open it in Perfetto)")
    run.add_argument(
        "--history",
        metavar="FILE",
        help="write the event history as JSON lines (python -m sim calibrate --history reads it)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.add_argument(
        "--metrics",
        metavar="FILE",
        help="write miles' rollout metrics as JSON lines, one per step",
    )
    run.add_argument(
        "--check-every",
        type=int,
        default=None,
        metavar="K",
        help="also run the safety oracles every K steps and stop at the first violation",
    )
    run.add_argument(
        "--save-scenario",
        metavar="FILE",
        help="write the scenario (a swarm's drawing too) as a TOML file that replays without it",
    )
    run.add_argument(
        "--aim",
        metavar="KIND@HOW:PHASE",
        help="a swarm seed that puts one fault in this cell of the coverage map "
        "(sim/search/aim.py)",
    )
    run.add_argument(
        "--plant", metavar="NAME", help="run with a planted bug (sim/search/plants.py)"
    )
    run.add_argument(
        "--liveness",
        action="store_true",
        help="liveness mode: heal every fault after the scenario's steps (a swarm: at the step "
        "its seed draws), then the run must make progress within a bound (the liveness oracle)",
    )
    add_loop_flags(run, skip=RUN_OWN_FLAGS)
    for command in COMMANDS:
        if command.module != __name__:
            sub.add_parser(command.name, help=command.help, add_help=False)
    return parser


def main(argv: list[str]) -> int:
    """``list`` and ``run``, and what the top-level parser answers (``--help``, a wrong or
    missing command)."""
    top = parser()
    args = top.parse_args(argv)
    if args.command == "list":
        return _list()
    try:
        with ctrl_c_counted():  # (run_cli's already, but not when called from Python)
            return exit_code(_run(args))
    except ConfigError as error:
        top.error(str(error))
    return 2  # unreachable: parser.error exits
