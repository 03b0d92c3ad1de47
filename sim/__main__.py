"""Command line: ``python -m sim demo [--seed N] [--steps K] [--private-counter] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from miles_core.events import (
    FaultInjected,
    GroupDropped,
    GroupGot,
    GroupRecycled,
    GroupTrained,
    SampleGenerated,
)
from sim.demo import DemoConfig, DemoResult, run_demo


def _replay_line(args: argparse.Namespace) -> str:
    flags = " --private-counter" if args.private_counter else ""
    return f"python -m sim demo --seed {args.seed} --steps {args.steps}{flags}"


def _summary(result: DemoResult) -> dict[str, object]:
    history = result.history
    return {
        "scenario": "demo-private-counter" if result.config.private_counter else "demo",
        "seed": result.config.seed,
        "steps": result.steps_done,
        "status": result.status.value,
        "final_version": result.versions[-1] if result.versions else None,
        "versions": result.versions,
        "groups_trained": sum(isinstance(e, GroupTrained) for e in history),
        "groups_recycled": sum(isinstance(e, GroupRecycled) for e in history),
        "groups_dropped": sum(isinstance(e, GroupDropped) for e in history),
        "samples_generated": sum(isinstance(e, SampleGenerated) for e in history),
        "faults_fired": [
            f"t={e.t:g} {e.fault.value} cell {e.cell} ({e.detail})"
            for e in history
            if isinstance(e, FaultInjected)
        ],
        "oracles": {k: "pass" if v is None else "fail" for k, v in result.verdicts.items()},
        "history_hash": result.history.hash(),
    }


def _print_human(result: DemoResult, summary: dict[str, object]) -> None:
    print(f"demo seed={summary['seed']}: {summary['steps']} steps, status {summary['status']}")
    if result.status.value != "completed":
        print(f"  stopped by: {result.reason}")
    for fault in summary["faults_fired"]:
        print(f"  fault: {fault}")
    print(f"  version sequence: {summary['versions']}")
    print(
        f"  groups: {summary['groups_trained']} trained, {summary['groups_recycled']} recycled, "
        f"{summary['groups_dropped']} dropped"
    )
    ages = Counter(
        e.staleness for e in result.history if isinstance(e, GroupGot) and e.staleness is not None
    )
    print(f"  staleness of trained groups: {dict(sorted(ages.items()))}")
    for name, verdict in result.verdicts.items():
        print(f"  oracle {name:20s} {'pass' if verdict is None else 'FAIL'}")
        if verdict is not None:
            print("    " + str(verdict).replace("\n", "\n    "))
    print(f"  history hash: {summary['history_hash']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="core demonstration: a cell failover mid weight update")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--steps", type=int, default=DemoConfig.steps)
    demo.add_argument(
        "--private-counter",
        action="store_true",
        help="replay the seed-report bug: each cell counts weight versions itself",
    )
    demo.add_argument("--json", action="store_true", help="print one JSON summary")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    result = run_demo(
        DemoConfig(seed=args.seed, steps=args.steps, private_counter=args.private_counter)
    )
    summary = _summary(result)
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        _print_human(result, summary)
    if not result.ok:
        print(f"replay: {_replay_line(args)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
