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
A backend declares its own flags and turns them into a Stack and a world shape
(``RealBackend``, in flags.py, where every flag of ``run`` is declared once).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from backends.common.run.flags import RealBackend, replay_line
from backends.common.run.history_stream import HistoryStream
from backends.common.run.plot import plot_steps
from backends.common.run.preflight import check_folders, load_plan
from backends.common.run.ray_run import (
    TRAIN,
    RealResult,
    StepLine,
    check_real,
    check_token_seconds,
    run_real,
)
from backends.common.session.address import check_address
from backends.common.stack import CPU_STACK, Stack
from backends.common.training.flags import Training, training_from
from miles_core.engines import EngineState
from miles_core.errors import ConfigError
from miles_core.events import EngineStateChanged, Event, FaultInjected, StepCommitted
from miles_core.loop.flags import RUN_OWN_FLAGS, given_flags
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
from miles_core.scenario.limits import check_steps


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


def _preflight(args: argparse.Namespace, outputs: dict[str, Path | None]) -> None:
    """Before Ray starts: one path per output (none on the scenario file), the folders of
    --load and --save, the save --load resumes from (verified; what it skips is said), and
    a cluster at --address that answers (last: it may wait)."""
    scenario_file = args.scenario if args.scenario and Path(args.scenario).is_file() else None
    check_distinct_paths({**outputs, "--save": args.save}, {"--scenario": scenario_file})
    periodic = bool(getattr(args, "save_interval", 0))
    load, _ = check_folders(args.load, args.save, periodic=periodic)
    plan = load_plan(load, periodic)
    check_address(args.address)
    for line in plan.lines() if plan is not None else ():
        print(line, file=sys.stderr)


MAX_TIMEOUT = 30 * 86400.0
"""--timeout's bound: seconds a run may take (Python's waits overflow past about 292 years,
and a month-long run on this backend is a typo)."""

OUTPUT_FLAGS = ("--trace", "--metrics", "--history", "--plot")
"""The files a run writes (checked writable before it starts), in the order they are named."""


@dataclass(frozen=True)
class Checked:
    """What the flags resolved to, every one checked before Ray starts."""

    scenario: Scenario
    stack: Stack
    training: Training | None
    outputs: dict[str, Path | None]
    """The files asked for, by flag (``OUTPUT_FLAGS``); None where not asked."""


def check_run(args: argparse.Namespace, backend: RealBackend) -> Checked:
    """Everything the user gave, in the order the errors name it; a ConfigError names the
    flag."""
    if args.steps is not None and args.steps < 1:
        raise ConfigError("--steps", f"got {args.steps}", "pass an integer >= 1")
    check_token_seconds(args.engine_token_seconds)
    if not 0 < args.timeout <= MAX_TIMEOUT:
        raise ConfigError(
            "--timeout",
            f"got {args.timeout:g}",
            f"pass seconds > 0 and at most {MAX_TIMEOUT:g} (30 days; past it a wait overflows)",
        )
    given = {flag: getattr(args, flag.removeprefix("--")) for flag in OUTPUT_FLAGS}
    outputs = {flag: check_writable(path, flag) if path else None for flag, path in given.items()}
    scenario = TRAIN if args.scenario is None else find_scenario(args.scenario)
    scenario = scenario.with_loop_flags(given_flags(args, RUN_OWN_FLAGS))
    loop = scenario.loop
    if loop.save_interval and args.save is None:
        raise ConfigError(
            "--save-interval", f"is {loop.save_interval} with nowhere to save", "add --save DIR"
        )
    training = training_from(args, loop.rollout_batch_size)
    steps_given = args.steps if training is None or training.steps is None else training.steps
    if training is not None and training.steps is not None:
        check_steps(training.steps, scenario.limits, "--num-epoch")
    scenario = check_real(scenario.with_run(steps=steps_given, seed=args.seed))
    stack, scenario = backend.stack_from(args, scenario)
    _preflight(args, outputs)
    stack = dataclasses.replace(stack, packed=args.flattened_bucket)
    return Checked(scenario, stack, training, outputs)


def run_command(args: argparse.Namespace, backend: RealBackend) -> int:
    """Check everything the user gave, then run once on ``backend``'s stack; the exit code."""
    checked = check_run(args, backend)
    scenario, stack, training = checked.scenario, checked.stack, checked.training
    trace, metrics, history, plot = (checked.outputs[flag] for flag in OUTPUT_FLAGS)
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
    replay = replay_line(backend, args, steps, training.argv if training is not None else ())
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
        plot_steps(result.lines, plot, f"{backend.prog} run, seed {args.seed}")
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
