"""``python -m sim plan PLAN.toml [--out DIR] [--plot FILE] [--workers K] [--json]
[--sensitivity]``: search the settings of a plan (sim/timing/plan_file.py) as Ray tasks, one
per point, judge every run with the oracles, and print (and plot) the front of throughput,
ETTR, staleness and waste, each point with the line that replays it (sim/timing/planner.py),
and where the plan's published configuration lands (sim/timing/plan_landing.py).
``--sensitivity`` reruns the search with each assumed input moved (sim/timing/sensitivity.py)
and prints, per input and factor, the best point and the published one's landing."""

from __future__ import annotations

import argparse
import dataclasses
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
from sim.timing.plan_landing import (
    landing,
    landing_lines,
    point_split_label,
    published_point,
    varying_keys,
)
from sim.timing.planner import PointResult, mark_front, run_point
from sim.timing.sensitivity import SensitivityRow, Variant, table_lines, variants


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sim plan", description=__doc__)
    parser.add_argument("plan", help="the plan TOML (see sim/timing/plan_file.py)")
    parser.add_argument("--out", help="a folder for each point's scenario, the JSON and the plot")
    parser.add_argument("--plot", help="the front as a PNG (default: OUT/front.png with --out)")
    parser.add_argument("--workers", type=int, default=None, help="Ray workers (default: CPUs)")
    parser.add_argument("--address", default=None, help="join this Ray cluster")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="rerun the search with each [sensitivity] assumed input moved (x0.5, x1.5)",
    )
    return parser


Job = tuple[Plan, Sequence[Point]]


def _judged(jobs: Sequence[Job], workers: int, address: str | None) -> list[list[PointResult]]:
    """Each plan's valid points' runs, each point a Ray task of its own (one Ray for all)."""
    import ray

    from backends.common.session.ray_session import ray_session

    with ray_session(0, address, workers):
        task = ray.remote(run_point)
        pending = [
            {p.index: task.remote(plan, p, list(range(plan.seeds))) for p in pts if p.scenario}
            for plan, pts in jobs
        ]
        out = []
        for (_, pts), mine in zip(jobs, pending, strict=True):
            results = [
                PointResult(p, list(ray.get(mine[p.index])) if p.index in mine else []) for p in pts
            ]
            mark_front(results)
            out.append(results)
            if len(jobs) > 1:  # a sensitivity runs for minutes: say how far it is
                print(f"search {len(out)} of {len(jobs)} done", file=sys.stderr, flush=True)
        return out


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


def _row(r: PointResult, replay: str, published: Point | None) -> dict[str, Any]:
    return {
        "point": r.point.index,
        "settings": dict(r.point.settings),
        "split": point_split_label(r.point),
        "published": r.point is published,
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


def _print(rows: list[dict[str, Any]], varying: Sequence[str]) -> None:
    """The points by tokens per second (the published one marked P), then the points not
    run, one line per reason."""
    keys = [k for k in varying if k not in ("rollout_share", "trainer_gpus")]
    head = f"{'#':>3s} {'front':5s} {'tokens/s':>10s} {'ETTR':>5s} {'stale':>5s} {'waste':>5s}"
    print(f"{head}  {'split':13s} settings (trainer:rollout GPUs; P: published)")
    for row in sorted(rows, key=lambda x: -(x["throughput_tokens_per_second"] or -1)):
        if row["invalid"]:
            continue
        settings = " ".join(f"{k}={row['settings'][k]}" for k in keys)
        mark = "*" if row["on_front"] else ("FAIL" if not row["ok"] else "")
        mark += "P" if row["published"] else ""
        stale = "-" if row["staleness"] is None else f"{row['staleness']:.2f}"
        print(
            f"{row['point']:3d} {mark:5s} {row['throughput_tokens_per_second']:10.1f} "
            f"{row['ettr']:5.2f} {stale:>5s} {row['waste']:5.2f}  {row['split']:13s} {settings}"
        )
        if not row["ok"]:
            print(f"      failed {', '.join(row['failed'])}: {row['replay']}")
    why: dict[str, list[int]] = {}
    for row in rows:
        if row["invalid"]:
            why.setdefault(row["invalid"], []).append(row["point"])
    for reason, numbers in why.items():
        print(f"  not run ({len(numbers)}: points {', '.join(map(str, numbers))}): {reason}")
    print("* on the front (throughput, ETTR up; staleness, waste down)")
    example = next((r["replay"] for r in rows if r["replay"]), None)
    if example is None:  # no files were written: nothing to replay from yet
        print("  --out DIR writes each point's scenario and the line that replays it")
    else:
        print(f"  replay any point with the line in the JSON, e.g. {example}")


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


def _checked(args: argparse.Namespace) -> tuple[list[Job], Point | None]:
    """The plan's points (and, with --sensitivity, every variant's), checked before any
    run: a plan with no valid point, a [published] that names no one point, a sensitivity
    with nothing to move."""
    plan = load_plan(args.plan)
    pts = points(plan)
    if not any(p.scenario is not None for p in pts):
        raise ConfigError("[search]", "no combination is a valid configuration", pts[0].why)
    published = published_point(plan, pts)
    jobs: list[Job] = [(plan, pts)]
    if args.sensitivity:
        if published is None:
            raise ConfigError("[published]", "not given", "name the configuration to place")
        moved = variants(plan)[1:]
        if not moved:
            raise ConfigError("[sensitivity].assumed", "empty", "list the inputs to move")
        jobs += [(v.plan, points(v.plan)) for v in moved]
    check_workers(args.workers, args.address)
    return jobs, published


def _sensitivity(jobs: Sequence[Job], judged: Sequence[list[PointResult]]) -> list[SensitivityRow]:
    rows = []
    for v, (plan, _), results in zip(variants(jobs[0][0]), jobs, judged, strict=True):
        assert isinstance(v, Variant) and v.plan.tables == plan.tables
        rows.append(SensitivityRow(v.name, v.factor, v.value, landing(plan, results)))
    return rows


def _write(args: argparse.Namespace, rows: list[dict[str, Any]], extra: dict[str, Any]) -> None:
    """plan.json, landing.json and sensitivity.json under --out, the plot, or --json."""
    out = Path(args.out) if args.out else None
    plot = Path(args.plot) if args.plot else (out / "front.png" if out else None)
    if plot is not None:
        _plot(rows, plot)
    if out is not None:
        (out / "plan.json").write_text(json.dumps(rows, indent=1, sort_keys=True))
        for name, value in extra.items():
            (out / f"{name}.json").write_text(json.dumps(value, indent=1, sort_keys=True))
    if args.json:
        print(json.dumps({"points": rows, **extra} if extra else rows, sort_keys=True))
    elif plot is not None:
        print(f"plot: {plot}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        jobs, published = _checked(args)
    except ConfigError as error:
        parser.error(str(error))
    judged = _judged(jobs, args.workers or os.cpu_count() or 1, args.address)
    plan, results = jobs[0][0], judged[0]
    out = Path(args.out) if args.out else None
    replay = _replay_files(results, out) if out else {}
    rows = [_row(r, replay.get(r.point.index, ""), published) for r in results]
    land = landing(plan, results)
    extra: dict[str, Any] = {"landing": dataclasses.asdict(land)} if land else {}
    table = _sensitivity(jobs, judged) if args.sensitivity else []
    if table:
        extra["sensitivity"] = [r.as_json() for r in table]
    if not args.json:
        _print(rows, varying_keys(plan))
        for line in (landing_lines(land) if land else []) + (
            ["", *table_lines(table)] if table else []
        ):
            print(line)
    _write(args, rows, extra)
    ran = [r for results in judged for r in results if r.point.scenario is not None]
    return 0 if all(r.ok for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
