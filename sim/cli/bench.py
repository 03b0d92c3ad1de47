"""Simulator speed on fixed workloads: wall time and simulated seconds per wall second.

    python -m sim bench [--preset NAME ...] [--steps K] [--repeats R] [--rounds N]
                        [--json] [--baseline FILE]

The workloads (each a whole ``run_scenario``: the simulation and every oracle's
verdict; the history hash is computed after the clock stops and shown apart):

- ``scenario``: the named cell_crash_before_allreduce, 200 steps, seeds 0..R-1;
- ``production-30b-moe``: that preset, 32 prompts x 8 samples, 2 GiB buckets,
  no fault, seed 0;
- ``production-64x256``: 64 cells of 8 GPUs and 256 engines, 64 prompts x 8
  samples, 8 GiB buckets (8 buckets an update), cell 1 killed before the
  allreduce of the middle step, seed 0.

The figure of merit is simulated:wall, the simulated seconds one wall second
buys: a simulator that reaches the same history with fewer SimPy events is
faster by it (the SimPy event count is printed, for information only).
``--baseline`` reads an earlier ``--json`` output (the previous commit's, say)
and prints the ratios beside the numbers, and whether each history hash is the
same (it must be, for the same steps and seeds, unless the model changed).

``--rounds N`` times each workload N times and reports the median of the rounds (with
the fastest and slowest): a shared VM's speed moves by more than a change
gains, so one round says little. Every round must give the same hashes; one
that does not is a determinism failure, and the bench stops with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.scenario import PRESETS, SCENARIOS, Scenario
from miles_core.scenario.faults import make_fault
from miles_core.scenario.limits import Limits
from miles_core.user_files import JSON_BYTES, read_user_text
from sim.run import SimResult, run_scenario


def production_scenario(steps: int) -> Scenario:
    """The production-30b-moe preset, no fault: 32 prompts x 8 samples, 2 GiB buckets."""
    return _preset_scenario("production-30b-moe", steps, 32, 2 * 1024**3)


def scale_scenario(steps: int) -> Scenario:
    """The production-64x256 preset at batch 64 with one cell kill (the speed goal's run).

    Cell 1 dies before the gradient allreduce of the middle step; the other 63
    go on. 8 GiB buckets give 8 buckets an update, each sent to 256 engines.
    """
    kill = make_fault("kill_cell", cell=1, point="before_allreduce", step=steps // 2)
    scenario = _preset_scenario("production-64x256", steps, 64, 8 * 1024**3)
    return dataclasses.replace(scenario, faults=(kill,))


def _preset_scenario(preset: str, steps: int, batch: int, bucket_bytes: int) -> Scenario:
    base = SCENARIOS["no_failure"]
    loop = dataclasses.replace(
        base.loop,
        steps=steps,
        rollout_batch_size=batch,
        n_samples_per_prompt=8,
        update_weight_buffer_size=bucket_bytes,
        heartbeat_interval=10.0,
        heartbeat_timeout=10.0,
    )
    world = PRESETS[preset]
    return dataclasses.replace(
        base, name=preset, world=world.world, timing=world.timing, loop=loop, preset=preset
    )


@dataclass(frozen=True)
class Workload:
    """A fixed run (or a few seeds of it) whose speed is tracked from commit to commit."""

    name: str
    build: Callable[[int], Scenario]
    steps: int
    """Steps when ``--steps`` does not say (the named scenario's are fixed)."""
    fixed_steps: bool = False


WORKLOADS: Mapping[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "scenario",
            lambda steps: SCENARIOS["cell_crash_before_allreduce"],
            200,
            fixed_steps=True,
        ),
        Workload("production-30b-moe", production_scenario, 1000),
        Workload("production-64x256", scale_scenario, 1000),
    )
}


def _timed_run(scenario: Scenario, seed: int, steps: int) -> tuple[SimResult, float, float]:
    """The run, its wall seconds and its CPU seconds (which a busy machine inflates less)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_scenario(scenario, seed, steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if not result.ok:
        raise RuntimeError("a benchmark run must pass its oracles:\n" + result.failures())
    return result, wall, cpu


def measure(
    workload: Workload, steps: int | None, seeds: Sequence[int], rounds: int = 1
) -> dict[str, Any]:
    """Run ``workload`` once per seed, ``rounds`` times; its totals over the seeds (the times
    as medians over the rounds), and each run's hash (the same in every round, or
    RuntimeError)."""
    steps = workload.steps if steps is None or workload.fixed_steps else steps
    scenario = workload.build(steps)
    timed = [[_measured_run(scenario, seed, steps) for seed in seeds] for _ in range(rounds)]
    for later in timed[1:]:
        for first, again in zip(timed[0], later, strict=True):
            if again["history_hash"] != first["history_hash"]:
                raise RuntimeError(
                    f"{scenario.name} seed {first['seed']} gave two histories in one bench "
                    f"({first['history_hash'][:12]}, then {again['history_hash'][:12]}): "
                    "the simulator is not deterministic"
                )
    return _summary(scenario.name, steps, timed)


def _measured_run(scenario: Scenario, seed: int, steps: int) -> dict[str, Any]:
    result, seconds, cpu = _timed_run(scenario, seed, steps)
    started = time.perf_counter()
    history_hash = result.hash
    return {
        "seed": seed,
        "wall_seconds": seconds,
        "cpu_seconds": cpu,
        "simulated_seconds": result.history[-1].t,
        "simpy_events": result.events,
        "history_events": len(result.history),
        "hash_seconds": time.perf_counter() - started,
        "history_hash": history_hash,
    }


def _summary(scenario: str, steps: int, rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Totals over the seeds; wall and CPU time are medians over the rounds, with every
    round's wall time beside them (the rest is the same in every round: the same runs)."""
    walls = [sum(r["wall_seconds"] for r in runs) for runs in rounds]
    wall = statistics.median(walls)
    runs = rounds[0]
    simulated = sum(r["simulated_seconds"] for r in runs)
    return {
        "scenario": scenario,
        "steps": steps,
        "seeds": [r["seed"] for r in runs],
        "wall_seconds": wall,
        "wall_seconds_rounds": walls,
        "wall_seconds_median": statistics.median(r["wall_seconds"] for rs in rounds for r in rs),
        "cpu_seconds": statistics.median(sum(r["cpu_seconds"] for r in rs) for rs in rounds),
        "simulated_seconds": simulated,
        "sim_per_wall": simulated / wall if wall > 0 else float("inf"),
        "simpy_events": sum(r["simpy_events"] for r in runs),
        "history_events": sum(r["history_events"] for r in runs),
        "hash_seconds": sum(r["hash_seconds"] for r in runs),
        "history_hashes": {str(r["seed"]): r["history_hash"] for r in runs},
        "history_hash": _combined([r["history_hash"] for r in runs]),
    }


def _combined(hashes: Sequence[str]) -> str:
    """One hash for several runs (a single run's own hash when there is one)."""
    if len(hashes) == 1:
        return hashes[0]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()


# -- the baseline -----------------------------------------------------------------------


def read_baseline(path: Path) -> dict[str, dict[str, Any]]:
    """The workloads of an earlier ``--json`` output, by name.

    The bench before this one (events/s beside bare SimPy) reported only the
    production-30b-moe preset's wall time; that figure is read too, so a first
    comparison across the change of bench still says something.
    """
    try:
        data = json.loads(read_user_text(path, "--baseline", JSON_BYTES, "a --json output"))
    except ValueError as error:
        raise ConfigError(
            "--baseline", f"cannot read {path}: {error}", "pass a --json output"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("workloads"), dict):
        return data["workloads"]
    old = data.get("production_preset") if isinstance(data, dict) else None
    if isinstance(old, dict) and {"steps", "wall_seconds"} <= old.keys():
        return {"production-30b-moe": {"steps": old["steps"], "wall_seconds": old["wall_seconds"]}}
    raise ConfigError("--baseline", f"{path} holds no bench workloads", "pass a --json output")


def compare(now: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """Speedup (wall before / now), the sim:wall ratio and whether the hash is the same.

    Only like with like: a workload run for other steps or seeds compares as None."""
    same_run = (
        before.get("steps") == now["steps"] and before.get("seeds", now["seeds"]) == (now["seeds"])
    )
    if not same_run:
        return {"speedup": None, "sim_per_wall_ratio": None, "same_hash": None}
    ratio = None
    if before.get("sim_per_wall"):
        ratio = now["sim_per_wall"] / before["sim_per_wall"]
    same_hash = None
    if "history_hash" in before:
        same_hash = before["history_hash"] == now["history_hash"]
    return {
        "speedup": before["wall_seconds"] / now["wall_seconds"],
        "sim_per_wall_ratio": ratio,
        "same_hash": same_hash,
    }


# -- the command -----------------------------------------------------------------------


def _line(name: str, w: Mapping[str, Any]) -> str:
    walls = w.get("wall_seconds_rounds", [w["wall_seconds"]])
    spread = f" (median of {len(walls)}: {min(walls):.2f} to {max(walls):.2f})"
    return (
        f"{name:20s} {w['steps']:5d} steps x {len(w['seeds'])} seed(s): "
        f"{w['wall_seconds']:7.2f} s wall{spread if len(walls) > 1 else ''} "
        f"({w['cpu_seconds']:.2f} s CPU), "
        f"{w['simulated_seconds']:9,.0f} s simulated, "
        f"{w['sim_per_wall']:8,.0f} sim s / wall s  (hash {w['history_hash'][:12]}, "
        f"+{w['hash_seconds']:.2f} s to hash; {w['simpy_events']:,} SimPy events)"
    )


def _vs_line(name: str, w: Mapping[str, Any], before: Mapping[str, Any]) -> str:
    c = w["vs_baseline"]
    if c["speedup"] is None:
        return f"{'':20s} baseline: {before.get('steps')} steps, not the same run: no ratio"
    ratio = "n/a" if c["sim_per_wall_ratio"] is None else f"{c['sim_per_wall_ratio']:.2f}x"
    same = {True: "same", False: "DIFFERENT", None: "n/a"}[c["same_hash"]]
    return (
        f"{'':20s} baseline {before['wall_seconds']:7.2f} s wall: speedup {c['speedup']:.2f}x, "
        f"sim:wall {ratio}, history hash {same}"
    )


MAX_REPEATS = 1000
"""--repeats' bound: seeds of the scenario workload, each a run (the default is 3)."""
MAX_ROUNDS = 100
"""--rounds' bound: times each workload is run (the default is 1)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sim bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        action="append",
        choices=list(WORKLOADS),
        help="a workload to run (repeat for several; default: all)",
    )
    parser.add_argument("--steps", type=int, help="steps of the preset workloads (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="seeds of the scenario workload")
    parser.add_argument(
        "--rounds", type=int, default=1, help="time each workload this many times (the median)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--baseline", type=Path, help="an earlier --json output to compare with")
    args = parser.parse_args(argv)
    for flag, value in (
        ("--steps", args.steps),
        ("--repeats", args.repeats),
        ("--rounds", args.rounds),
    ):
        if value is not None and value < 1:
            parser.error(str(ConfigError(flag, f"got {value}", "pass an integer >= 1")))
    for flag, value, bound in (
        ("--repeats", args.repeats, MAX_REPEATS),
        ("--rounds", args.rounds, MAX_ROUNDS),
    ):
        if value > bound:
            fix = f"pass at most {bound} (fixed: each is a whole run of the workload)"
            parser.error(str(ConfigError(flag, f"got {value}, more than {bound}", fix)))
    if args.steps is not None and args.steps > Limits().steps:  # the workloads' own bound
        parser.error(
            str(
                ConfigError(
                    "--steps",
                    f"got {args.steps}, more than the {Limits().steps} steps a run may take",
                    f"pass at most {Limits().steps} (a benchmark's workloads are not raisable)",
                )
            )
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    baseline = read_baseline(args.baseline) if args.baseline is not None else {}
    workloads: dict[str, Any] = {}
    for name in args.preset or list(WORKLOADS):
        workload = WORKLOADS[name]
        seeds = range(args.repeats) if workload.fixed_steps else (0,)
        workloads[name] = measure(workload, args.steps, list(seeds), args.rounds)
        if name in baseline:
            workloads[name]["vs_baseline"] = compare(workloads[name], baseline[name])
        if not args.json:
            print(_line(name, workloads[name]))
            if name in baseline:
                print(_vs_line(name, workloads[name], baseline[name]))
            sys.stdout.flush()
    if args.json:
        print(json.dumps({"workloads": workloads}, sort_keys=True))
    return 0
