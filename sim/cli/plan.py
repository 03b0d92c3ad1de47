"""``python -m sim plan PLAN.toml [--out DIR] [--plot FILE] [--workers K] [--json]``: search
the settings of a plan (sim/timing/plan_file.py) as Ray tasks, one per point, judge every run
with the oracles, and print (and plot) the front of throughput, ETTR, staleness and waste,
each point with the line that replays it (sim/timing/planner.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError
from miles_core.scenario import save_scenario_file
from sim.cli.workers import check_workers
from sim.timing.plan_file import Plan, Point, load_plan, points, with_faults
from sim.timing.planner import PointResult, mark_front, run_point


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim plan", description=__doc__)
    parser.add_argument("plan", help="the plan TOML (see sim/timing/plan_file.py)")
    parser.add_argument("--out", help="a folder for each point's scenario, the JSON and the plot")
    parser.add_argument("--plot", help="the front as a PNG (default: OUT/front.png with --out)")
    parser.add_argument("--workers", type=int, default=None, help="Ray workers (default: CPUs)")
    parser.add_argument("--address", default=None, help="join this Ray cluster")
    parser.add_argument("--json", action="store_true")
    return parser


def _judged(plan: Plan, pts: Sequence[Point], workers: int, address: str | None) -> list[Any]:
    """Each valid point's runs, as a Ray task of its own."""
    import ray

    from backends.common.session.ray_session import ray_session

    seeds = list(range(plan.seeds))
    with ray_session(0, address, workers):
        task = ray.remote(run_point)
        pending = {p.index: task.remote(plan, p, seeds) for p in pts if p.scenario is not None}
        return [ray.get(pending[p.index]) if p.index in pending else [] for p in pts]


def _replay_files(results: Sequence[PointResult], out: Path) -> dict[int, str]:
    """Each point's replay seed (a failing one, else one with faults) as a scenario file
    with the faults its run had: its replay line."""
    out.mkdir(parents=True, exist_ok=True)
    lines = {}
    for r in results:
        scenario = r.point.scenario
        if scenario is None or not r.runs:
            continue
        run = next(x for x in r.runs if x.seed == r.replay_seed)
        path = out / f"point-{r.point.index:03d}.toml"
        save_scenario_file(path, with_faults(scenario, run.drawn))
        lines[r.point.index] = f"python -m sim run {path} --seed {run.seed}"
    return lines


def _row(r: PointResult, replay: str) -> dict[str, Any]:
    return {
        "point": r.point.index,
        "settings": dict(r.point.settings),
        "invalid": r.point.why or None,
        "ok": r.ok,
        "on_front": r.on_front,
        "failed": sorted({o for run in r.runs for o in run.failed}),
        "throughput_tokens_per_second": r.throughput if r.runs else None,
        "ettr": r.ettr if r.runs else None,
        "staleness": r.mean("staleness"),
        "waste": r.mean("waste"),
        "faults": sum(run.faults for run in r.runs),
        "replay": replay,
    }


def _print(rows: list[dict[str, Any]]) -> None:
    keys = sorted(rows[0]["settings"]) if rows else []
    head = f"{'#':>3s} {'front':5s} {'tokens/s':>10s} {'ETTR':>5s} {'stale':>5s} {'waste':>5s}"
    print(f"{head}  settings")
    for row in sorted(rows, key=lambda x: -(x["throughput_tokens_per_second"] or -1)):
        if row["invalid"]:
            continue
        settings = " ".join(f"{k}={row['settings'][k]}" for k in keys)
        mark = "*" if row["on_front"] else ("FAIL" if not row["ok"] else "")
        stale = "-" if row["staleness"] is None else f"{row['staleness']:.2f}"
        print(
            f"{row['point']:3d} {mark:5s} {row['throughput_tokens_per_second']:10.1f} "
            f"{row['ettr']:5.2f} {stale:>5s} {row['waste']:5.2f}  {settings}"
        )
        if not row["ok"]:
            print(f"      failed {', '.join(row['failed'])}: {row['replay']}")
    invalid = [r for r in rows if r["invalid"]]
    for row in invalid:
        print(f"  point {row['point']} not run: {row['invalid']}")
    print("* on the front (throughput, ETTR up; staleness, waste down); replay any point with")
    print(
        "  the line in the JSON (--out), e.g. "
        + next((r["replay"] for r in rows if r["replay"]), "-")
    )


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = [r for r in rows if r["ok"]]
    fig, ax = plt.subplots(figsize=(7, 5))
    dots = ax.scatter(
        [r["throughput_tokens_per_second"] for r in ran],
        [r["ettr"] for r in ran],
        c=[r["staleness"] or 0.0 for r in ran],
        s=[30 + 300 * r["waste"] for r in ran],
        cmap="viridis",
    )
    for r in ran:
        if r["on_front"]:
            ax.annotate(str(r["point"]), (r["throughput_tokens_per_second"], r["ettr"]))
    fig.colorbar(dots, label="mean staleness (versions)")
    ax.set_xlabel("tokens trained per second")
    ax.set_ylabel("ETTR (time without faults / with)")
    ax.set_title("plan: the front is numbered (dot size: waste)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        plan = load_plan(args.plan)
        pts = points(plan)
        if not any(p.scenario is not None for p in pts):
            raise ConfigError("[search]", "no combination is a valid configuration", pts[0].why)
        check_workers(args.workers, args.address)
    except ConfigError as error:
        parser.error(str(error))
    runs = _judged(plan, pts, args.workers or os.cpu_count() or 1, args.address)
    results = [PointResult(p, list(r)) for p, r in zip(pts, runs, strict=True)]
    mark_front(results)
    out = Path(args.out) if args.out else None
    replay = _replay_files(results, out) if out else {}
    rows = [_row(r, replay.get(r.point.index, "")) for r in results]
    plot = Path(args.plot) if args.plot else (out / "front.png" if out else None)
    if plot is not None:
        _plot(rows, plot)
    if out is not None:
        (out / "plan.json").write_text(json.dumps(rows, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps(rows, sort_keys=True))
    else:
        _print(rows)
        if plot is not None:
            print(f"plot: {plot}")
    return 0 if all(r.ok for r in results if r.point.scenario is not None) else 1


if __name__ == "__main__":
    sys.exit(main())
