"""Command line of the simulator.

    python -m sim list
    python -m sim run [NAME_OR_FILE] [--seed N] [--steps K] [--trace out.json] [--json]
    python -m sim calibrate bench.json      (fit the transfer model; see sim/calibrate.py)
    python -m sim predict PRESET            (a weight update's time by that model)

A run whose history violates an oracle exits 1 and prints, as its last line on
stderr, the command that replays it exactly.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from miles_core.errors import ConfigError
from miles_core.events import (
    FaultInjected,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    GroupTrained,
    StepCommitted,
)
from miles_core.oracles import verdict_lines
from sim.run import SimResult, run_scenario
from sim.scenarios import SCENARIOS, find_scenario
from sim.swarm import SWARM, SWARM_TOTAL_LOSS
from sim.trace import write_trace

DEFAULT_SCENARIO = "cell_crash_before_allreduce"


def summary(result: SimResult) -> dict[str, object]:
    """The --json object."""
    history = result.history
    ages = Counter(
        e.staleness for e in history if isinstance(e, GroupGot) and e.staleness is not None
    )
    recycled = Counter(e.reason for e in history if isinstance(e, GroupRecycled))
    dropped = Counter(e.reason for e in history if isinstance(e, GroupDropped))
    return {
        "scenario": result.scenario.name,
        "seed": result.seed,
        "status": result.report.status.value,
        "reason": result.report.reason,
        "steps": result.report.steps_done,
        "final_version": result.report.versions[-1] if result.report.versions else None,
        "versions": result.report.versions,
        "simulated_seconds": history[len(history) - 1].t if len(history) else 0.0,
        "groups_trained": sum(isinstance(e, GroupTrained) for e in history),
        "groups_recycled": dict(sorted(recycled.items())),
        "groups_dropped": dict(sorted(dropped.items())),
        "staleness_histogram": {str(k): v for k, v in sorted(ages.items())},
        "faults_fired": [
            {
                "t": e.t,
                "fault": e.fault.value,
                "cell": e.cell,
                "engine": e.engine,
                "detail": e.detail,
            }
            for e in history
            if isinstance(e, FaultInjected)
        ],
        "oracles": {k: "pass" if v is None else "fail" for k, v in result.verdicts.items()},
        "history_hash": result.hash,
    }


def _print_human(result: SimResult, info: dict[str, object], wall: float) -> None:
    planned = result.scenario.loop.steps
    print(
        f"{info['scenario']} seed={info['seed']}: {info['steps']}/{planned} steps, "
        f"{info['status']} ({info['simulated_seconds']:.1f} s simulated in {wall:.2f} s)"
    )
    if info["status"] != "completed":
        print(f"  stopped by: {info['reason']}")
    for fault in info["faults_fired"]:  # type: ignore[union-attr]
        target = (
            f"cell {fault['cell']}" if fault["cell"] is not None else fault["engine"] or "cluster"
        )
        print(f"  fault at t={fault['t']:.2f}: {fault['fault']} {target} ({fault['detail']})")
    print(f"  version sequence: {info['versions']}")
    print(
        f"  groups: {info['groups_trained']} trained, recycled {info['groups_recycled']}, "
        f"dropped {info['groups_dropped']}"
    )
    print(f"  staleness of trained groups (staleness: groups): {info['staleness_histogram']}")
    print("\n".join(verdict_lines(result.verdicts)))
    print(f"  history hash: {info['history_hash']}")


def _run(args: argparse.Namespace) -> int:
    scenario = find_scenario(args.scenario, args.seed)
    steps = args.steps or scenario.loop.steps
    command = ["python", "-m", "sim", "run", args.scenario, "--seed", str(args.seed)]
    command += ["--steps", str(steps)]
    if args.check_every is not None:
        command += ["--check-every", str(args.check_every)]
    replay = shlex.join(command)
    bar = tqdm(total=steps, unit="step", disable=None if not args.json else True, leave=False)
    started = time.perf_counter()
    result = run_scenario(
        scenario,
        args.seed,
        steps,
        observers=[lambda e: bar.update(1) if isinstance(e, StepCommitted) else None],
        check_every=args.check_every,
    )
    bar.close()
    info = summary(result)
    if args.trace:
        write_trace(result.history, Path(args.trace))
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        _print_human(result, info, time.perf_counter() - started)
    if not result.ok:
        print(f"replay: {replay}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description="the simulated cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the named scenarios, one line each")
    run = sub.add_parser("run", help="run a named scenario or a .toml scenario file")
    run.add_argument(
        "scenario",
        nargs="?",
        default=DEFAULT_SCENARIO,
        help=f"a name from 'python -m sim list', or a .toml file (default: {DEFAULT_SCENARIO})",
    )
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None, help="override the scenario's steps")
    run.add_argument("--trace", help="write a Chrome trace (open it in Perfetto)")
    run.add_argument("--json", action="store_true", help="print one JSON summary")
    run.add_argument(
        "--check-every",
        type=int,
        default=None,
        metavar="K",
        help="also run the safety oracles every K steps and stop at the first violation",
    )
    sub.add_parser(
        "bench", help="simulator throughput vs bare SimPy; production preset", add_help=False
    )
    sub.add_parser(
        "calibrate", help="fit the transfer model to a transfer-bench JSON", add_help=False
    )
    sub.add_parser("predict", help="a preset's weight-update time by the model", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] in (["calibrate"], ["predict"]):
        from sim.calibrate import main as calibrate

        return calibrate(argv)
    if argv[:1] == ["bench"]:
        from sim.bench import main as bench

        return bench(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "list":
        width = max(map(len, SCENARIOS))
        for name, scenario in SCENARIOS.items():
            print(f"{name:{width}s}  {scenario.description}")
        print(f"{SWARM:{width}s}  random: each seed draws its cluster, flags and fault mix")
        loss = "random: every cell dies; the run must stop with a clear error"
        print(f"{SWARM_TOTAL_LOSS:{width}s}  {loss}")
        return 0
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    try:
        return _run(args)
    except ConfigError as error:
        parser.error(str(error))
    return 2  # unreachable: parser.error exits


if __name__ == "__main__":
    sys.exit(main())
