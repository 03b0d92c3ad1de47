"""What a sweep prints and writes: the verdict table, failing seeds, the probes, the coverage
map, and for a planted bug how findable it is.

The JSON holds everything the text shows; ``--out DIR`` writes it as
``sweep.json``, the map as ``coverage.png`` and, for each failing seed only, a
folder with the scenario as TOML (it replays without the swarm) and the
violations with the replay line.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from miles_core.coverage import PHASES, CoverageCell, reachable
from miles_core.probes import CORE, NOT_IN_LIVENESS, PROBES
from sim.run import replay_command
from sim.search.aim import AIMABLE
from sim.search.fanout import KEPT_FAILURES, SweepRun, Tally
from sim.search.judge import SeedOutcome

SHOWN_FAILURES = 20
"""Failing seeds printed; the JSON and --out hold the first KEPT_FAILURES of them."""


def map_rows(tally: Tally) -> list[tuple[str, str]]:
    """The map's rows: every (kind, how) the swarm can aim at, and any other that struck."""
    rows = dict.fromkeys(AIMABLE)
    rows |= dict.fromkeys(sorted({(c.kind, c.how) for c in tally.coverage}))
    return list(rows)


def coverage_json(tally: Tally) -> dict[str, Any]:
    cells = {c.key(): n for c, n in sorted(tally.coverage.items())}
    wanted = [
        CoverageCell(kind, how, phase)
        for kind, how in map_rows(tally)
        for phase in PHASES
        if phase in reachable(kind, how)
    ]
    empty = [c.key() for c in wanted if c not in tally.coverage]
    return {
        "phases": list(PHASES),
        "cells": cells,
        "reachable": len(wanted),
        "hit": len(wanted) - len(empty),
        "empty": empty,
        "aimed_seeds": tally.aimed,
        "aimed_seeds_that_hit_their_cell": tally.aimed_hit,
    }


def probes_json(tally: Tally, liveness: bool = False) -> dict[str, Any]:
    """Seeds per probe (every probe, 0 for those none hit) and the core ones none hit (in
    liveness mode, of those it can reach)."""
    seeds = {p.name: tally.probes.get(p.name, 0) for p in PROBES}
    missed = [name for name, n in seeds.items() if n == 0]
    core = CORE - NOT_IN_LIVENESS if liveness else CORE
    return {
        "seeds": seeds,
        "core": sorted(core),
        "missed": missed,
        "core_missed": [name for name in missed if name in core],
    }


CONFIDENCE = 0.99


def findability(tally: Tally) -> dict[str, Any]:
    """How findable the planted bug is: the share of seeds that caught it, the seeds a sweep
    from the lowest one needed to first catch it, and the seeds that catch it at least once
    with 99% confidence at that rate (each seed an independent draw)."""
    caught = tally.failed  # each (source, seed) is judged once
    rate = caught / tally.seeds if tally.seeds else 0.0
    first = None
    if tally.lowest_failing_seed is not None and tally.lowest_seed is not None:
        first = tally.lowest_failing_seed - tally.lowest_seed + 1
    if rate >= 1.0:
        needed: int | None = 1
    elif rate > 0.0:
        needed = math.ceil(math.log(1 - CONFIDENCE) / math.log(1 - rate))
    else:
        needed = None
    return {
        "caught": caught,
        "rate": rate,
        "seeds_to_first_catch": first,
        "seeds_for_99_percent": needed,
    }


def _failure(outcome: SeedOutcome) -> dict[str, Any]:
    aim = None if outcome.aim is None else outcome.aim.key()
    return {
        "source": outcome.source,
        "seed": outcome.seed,
        "aim": aim,
        "oracles": list(outcome.failed),
        "status": outcome.status,
        "replay": outcome.replay,
    }


def summary(
    run: SweepRun, workers: int, nodes: int, plant: str | None, liveness: bool = False
) -> dict[str, Any]:
    tally = run.tally
    return {
        "seeds": tally.seeds,
        "workers": workers,
        "nodes": nodes,
        "seeds_per_node": dict(sorted(tally.per_node.items())),
        "plant": plant,
        "wall_seconds": run.wall_seconds,
        "seeds_per_second": tally.seeds / run.wall_seconds if run.wall_seconds else 0.0,
        "interrupted": run.interrupted,
        "ok": run.ok,
        "oracles": {k: {"passed": p, "failed": f} for k, (p, f) in sorted(tally.oracles.items())},
        "failing_seeds": tally.failed,
        "caught_field_bugs": dict(sorted(tally.caught.items())),
        "failures": [_failure(o) for o in tally.failures],
        "determinism": {"rechecked": run.rechecked, "differed": run.nondeterministic},
        "idle_windows": dict(sorted(tally.idle.items())),
        "probes": probes_json(tally, liveness),
        "findability": findability(tally) if plant is not None else None,
        "coverage": coverage_json(tally),
    }


def text_lines(info: dict[str, Any], tally: Tally) -> list[str]:
    where = (
        f"on {info['workers']} workers ({len(info['seeds_per_node'])} of {info['nodes']} nodes)"
        if info["nodes"]
        else "before Ray had started"
    )
    lines = [
        f"{info['seeds']} seeds in {info['wall_seconds']:.1f} s {where}: "
        f"{info['seeds_per_second']:.1f} seeds/s"
        + (" (interrupted)" if info["interrupted"] else ""),
        "",
        f"  {'oracle':22s} {'passed':>8s} {'failed':>8s}",
    ]
    for name, counts in info["oracles"].items():
        lines.append(f"  {name:22s} {counts['passed']:8d} {counts['failed']:8d}")
    failures = info["failures"]
    lines += ["", f"failing seeds: {info['failing_seeds']}"]
    for f in failures[:SHOWN_FAILURES]:
        lines.append(f"  {', '.join(f['oracles'])}: {f['replay']}")
    lines += _more_failures(info["failing_seeds"], len(failures))
    caught = ", ".join(f"{name} {n}" for name, n in info["caught_field_bugs"].items()) or "none"
    lines.append(f"field bugs caught by their oracle (expect.caught_by; passing seeds): {caught}")
    d = info["determinism"]
    lines += ["", f"determinism: {d['rechecked']} seeds run twice, {len(d['differed'])} differed"]
    lines += [f"  {line}" for line in d["differed"]]
    idle = ", ".join(f"{kind} {n}" for kind, n in info["idle_windows"].items()) or "none"
    lines.append(f"idle windows (met nothing to act on; passed, witnessed nothing): {idle}")
    if info["findability"] is not None:
        lines += ["", *findability_lines(info["plant"], info["findability"], info["seeds"])]
    return [*lines, "", *probe_lines(info["probes"]), "", *map_lines(info["coverage"], tally)]


def _more_failures(failed: int, kept: int) -> list[str]:
    """Where the failing seeds not printed are: the JSON, up to the KEPT_FAILURES it holds."""
    if failed <= SHOWN_FAILURES:
        return []
    more = f"  ... {failed - SHOWN_FAILURES} more"
    if failed > kept:
        return [f"{more}; the JSON holds the lowest {kept} (a sweep keeps {KEPT_FAILURES})"]
    return [f"{more} in the JSON"]


def findability_lines(plant: str, found: dict[str, Any], seeds: int) -> list[str]:
    if not found["caught"]:
        return [f"planted {plant}: not caught in {seeds} seeds"]
    return [
        f"planted {plant}: caught by {found['caught']} of {seeds} seeds "
        f"({100 * found['rate']:.1f}%); the first catch came at seed "
        f"{found['seeds_to_first_catch']} of the range; {found['seeds_for_99_percent']} seeds "
        f"catch it with {CONFIDENCE:.0%} confidence"
    ]


def probe_lines(probes: dict[str, Any]) -> list[str]:
    """Seeds per rare-state probe, core ones marked; the ones none hit said at the end."""
    width = max(map(len, probes["seeds"]))
    lines = [f"rare-state probes (seeds that reached each; * core): {len(probes['missed'])} missed"]
    for name, n in probes["seeds"].items():
        mark = "*" if name in probes["core"] else " "
        lines.append(f"  {mark} {name:{width}s} {n:8d}")
    if probes["core_missed"]:
        lines.append(f"core probes no seed reached: {', '.join(probes['core_missed'])}")
    return lines


def map_lines(coverage: dict[str, Any], tally: Tally) -> list[str]:
    """The map as a table: seeds per cell; '.' where the trigger cannot reach the phase."""
    short = [p.replace("bucket_", "b_") for p in PHASES]
    width = max(len(f"{k}@{h}") for k, h in map_rows(tally))
    lines = [
        f"fault coverage: {coverage['hit']}/{coverage['reachable']} reachable cells hit; "
        f"{coverage['aimed_seeds']} seeds aimed at empty cells, "
        f"{coverage['aimed_seeds_that_hit_their_cell']} hit theirs",
        f"  {'kind@how':{width}s} " + " ".join(f"{p:>10s}" for p in short),
    ]
    for kind, how in map_rows(tally):
        cells = []
        for phase in PHASES:
            n = tally.coverage.get(CoverageCell(kind, how, phase), 0)
            cells.append(f"{n:10d}" if phase in reachable(kind, how) or n else f"{'.':>10s}")
        lines.append(f"  {kind + '@' + how:{width}s} " + " ".join(cells))
    return lines


def write_out(out: Path, info: dict[str, Any], tally: Tally) -> list[str]:
    """sweep.json, coverage.png and a folder per failing seed kept; the lines saying so."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    written = [f"wrote {out / 'sweep.json'}"]
    kept = tally.failures
    for outcome in kept:
        folder = out / "failures" / _folder_name(outcome)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "scenario.toml").write_text(outcome.scenario_toml)
        replay = replay_command(str(folder / "scenario.toml"), outcome.seed, plant=info["plant"])
        text = f"{outcome.failure}\n\nreplay: {outcome.replay}\nor: {replay}\n"
        (folder / "failure.txt").write_text(text)
    if kept:
        of = f" (the lowest of {tally.failed})" if tally.failed > len(kept) else ""
        written.append(f"wrote {len(kept)} failing seeds{of} under {out / 'failures'}")
    written.append(heat_map(out / "coverage.png", tally))
    return written


def _folder_name(outcome: SeedOutcome) -> str:
    name = f"{Path(outcome.source).stem}-seed{outcome.seed}"
    if outcome.aim is not None:
        name += "-aim-" + re.sub(r"[^A-Za-z0-9_]+", "-", outcome.aim.key())
    return name


def heat_map(path: Path, tally: Tally) -> str:
    """The map as a PNG (matplotlib): log-scaled seeds per cell, unreachable cells hatched."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return f"{path} not written: pip install matplotlib (the 'sweep' extra)"
    rows = map_rows(tally)
    grid = np.full((len(rows), len(PHASES)), np.nan)
    for i, (kind, how) in enumerate(rows):
        for j, phase in enumerate(PHASES):
            n = tally.coverage.get(CoverageCell(kind, how, phase), 0)
            if n or phase in reachable(kind, how):
                grid[i, j] = np.log10(1 + n)
    fig, ax = plt.subplots(figsize=(11, 0.4 * len(rows) + 2))
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(PHASES)), PHASES, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [f"{k}@{h}" for k, h in rows])
    for i, j in zip(*np.where(np.isnan(grid)), strict=True):
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", lw=0))
    for i, j in zip(*np.where(grid == 0), strict=True):
        ax.text(j, i, "0", ha="center", va="center", color="red")
    fig.colorbar(image, ax=ax, label="log10(1 + seeds)")
    ax.set_title(f"fault coverage over {tally.seeds} seeds (hatched: unreachable)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"wrote {path}"


__all__ = [
    "findability",
    "heat_map",
    "map_lines",
    "probe_lines",
    "probes_json",
    "summary",
    "text_lines",
    "write_out",
]
