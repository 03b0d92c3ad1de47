"""``python -m sim calibrate --history FILE --scenario S [--check FILE --check-scenario S]``:
fit the time model to a real run and predict another one (sim/timing/run_fit.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from miles_core.errors import ConfigError
from miles_core.outputs import check_distinct_paths
from sim.scenarios import find_scenario
from sim.timing import run_fit


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sim calibrate --history", description=run_fit.__doc__
    )
    parser.add_argument(
        "--history",
        required=True,
        action="append",
        help="a real run's --history file (again for more runs: the fit pools them)",
    )
    parser.add_argument(
        "--scenario", required=True, help="the scenario the first run ran (its time model)"
    )
    parser.add_argument("--check", help="another real run's --history, to predict")
    parser.add_argument("--check-scenario", help="the scenario --check's run ran")
    parser.add_argument("--seed", type=int, default=0, help="the seed --check's run used")
    parser.add_argument("--out", help="write the fitted figures as JSON")
    parser.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if (args.check is None) != (args.check_scenario is None):
            raise ConfigError(
                "--check", "needs --check-scenario (and the other way round)", "pass both"
            )
        if args.check in args.history:
            raise ConfigError("--check", f"{args.check} is fitted on", "check another run")
        inputs = {f"--history {h}": Path(h) for h in args.history}
        inputs["--check"] = Path(args.check) if args.check else None
        check_distinct_paths({"--out": Path(args.out) if args.out else None}, inputs)
        histories = [run_fit.read_history(h) for h in args.history]
        scenario = find_scenario(args.scenario)
        timing, how = run_fit.fit_timing(histories, scenario)
        units = run_fit.model_units(histories[0])
        rows = None
        if args.check:
            real = run_fit.figures(run_fit.read_history(args.check, "--check"))
            other = find_scenario(args.check_scenario)
            predicted = run_fit.figures(run_fit.check(other, timing, args.seed, units))
            rows = run_fit.compare(real, predicted)
    except ConfigError as error:
        parser.error(str(error))
    out = run_fit.timing_json(timing, how, units) | {"check": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0 if rows is None or all(r["within"] for r in rows if r["real"]) else 1
    runs = ", ".join(args.history)
    size = f"a model of {sum(units)} bytes in {len(units)} units" if units else "no model"
    print(f"fitted from {runs} (time model of {args.scenario}; {size}):")
    for field, value in out["timing"].items():
        print(f"  {field:26s} {value:12.6g}  {how.get(field, '(as the scenario has it)')}")
    if rows is None:
        return 0
    print(f"\n{args.check_scenario}, real ({args.check}) and predicted (seed {args.seed}):")
    print(f"  {'figure':20s} {'real':>9s} {'predicted':>9s} {'ratio':>6s}")
    for r in rows:
        if r["ratio"] is None:
            print(f"  {r['figure']:20s} (not in both runs)")
            continue
        mark = "within 25%" if r["within"] else "OFF by more than 25%"
        print(
            f"  {r['figure']:20s} {r['real']:8.2f}s {r['predicted']:8.2f}s {r['ratio']:6.2f}"
            f"  {mark}"
        )
    return 0 if all(r["within"] for r in rows if r["real"]) else 1


__all__ = ["main"]
