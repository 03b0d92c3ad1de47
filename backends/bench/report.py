"""From raw trial times to the summary: GB/s with spread, and every figure's ratio to the ceiling.

GB/s is state-dict bytes (the payload, padding excluded) over seconds until
every receiver holds them, so all methods and modes share one numerator. The
ceiling of a repeat is the fastest of the ceiling's ways (ceiling.py) in that
repeat of that block (one mode, one bucket size), measured interleaved with the
other methods. A figure's ratio to the ceiling is the median over repeats of the
ceiling's time over the figure's time in the same repeat of the same block: side
by side, so load that drifts between blocks (this is a shared 2-core machine)
cancels out. The ratio to the wire is the same against the fastest way over the
backend's collective alone (gloo here). Methods that do not depend on the bucket
size (naive, memcpy) were measured in the default bucket's block.

A ratio above 1.0 means a way faster than the ceiling exists that the ceiling
did not measure: a bug in the ceiling, listed under ``above_ceiling`` and
flagged in every table. Within ``TIE`` of it is a tie, marked but not flagged:
``backend-shm`` with one bucket of the whole payload is the ``shm-flags`` way
plus the backend's calls, and two runs of one procedure trade places at random
(one such run measured 1.01x, others 0.79x to 0.93x). ``memcpy``
moves nothing between processes: a bound, never flagged.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.bench.ceiling import CEILINGS, WIRE_CEILINGS
from miles_core.errors import ConfigError

SCHEMA = "miles-testbed/transfer-bench/2"
BOUNDS = frozenset(("memcpy",))
TIE = 0.05
"""A median ratio up to 1 + TIE is a tie with the ceiling (noise), above it a faster way."""
Key = tuple[str, str, int | None]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def gbps(payload_bytes: int, seconds: Mapping[str, float]) -> dict[str, float]:
    """Rates from times: the slowest trial gives the minimum rate."""
    rate = payload_bytes / 1e9
    return {
        "median": rate / seconds["median"],
        "min": rate / seconds["max"],
        "max": rate / seconds["min"],
    }


class Ceilings:
    """Per block and repeat, the fastest of the ceiling's ways, and which way it was."""

    def __init__(self, pooled: Mapping[Key, list[float]], default: int) -> None:
        self.pooled = pooled
        self.default = default

    def block(self, mode: str, bucket: int | None, ways: Sequence[str] = CEILINGS) -> list[float]:
        bucket = self.default if bucket is None else bucket
        found = [self.pooled[(mode, w, bucket)] for w in ways if (mode, w, bucket) in self.pooled]
        if not found or len({len(v) for v in found}) != 1:
            raise ConfigError(
                "trials",
                f"{mode} bucket {bucket} has no ceiling trial per repeat",
                "measure the ceiling's ways in every block",
            )
        return [min(times) for times in zip(*found, strict=True)]

    def ratio(self, key: Key, values: Sequence[float], ways: Sequence[str] = CEILINGS) -> float:
        ceiling = self.block(key[0], key[2], ways)
        if len(ceiling) != len(values):
            raise ConfigError("trials", f"{key} has no ceiling trial per repeat", "rerun the bench")
        return statistics.median(c / t for c, t in zip(ceiling, values, strict=True))

    def set_by(self, mode: str) -> dict[str, int]:
        """How many repeats each way was the ceiling of, over the mode's blocks."""
        wins: Counter[str] = Counter()
        for bucket in sorted({k[2] for k in self.pooled if k[0] == mode and k[1] in CEILINGS}):
            ways = [w for w in CEILINGS if (mode, w, bucket) in self.pooled]
            for times in zip(*(self.pooled[(mode, w, bucket)] for w in ways), strict=True):
                wins[ways[times.index(min(times))]] += 1
        return dict(wins.most_common())


def _rows(raw: Mapping[str, Any], pooled: Mapping[Key, list[float]], ceilings: Ceilings, checks):
    payload = int(raw["payload_bytes"])
    wire = any(k[1] in WIRE_CEILINGS for k in pooled)
    rows = []
    for key, values in pooled.items():
        mode, method, bucket = key
        seconds = spread(values)
        ratio = ceilings.ratio(key, values)
        rows.append(
            {
                "mode": mode,
                "method": method,
                "bucket_bytes": bucket,
                "buckets": raw.get("buckets", {}).get(str(bucket)) if bucket else None,
                "repeats": len(values),
                "seconds": seconds,
                "gbps": gbps(payload, seconds),
                "ratio_to_ceiling": ratio,
                "ratio_to_wire": ceilings.ratio(key, values, WIRE_CEILINGS) if wire else None,
                "above_ceiling": ratio > 1.0 + TIE and method not in BOUNDS,
                "weights_bitwise_equal": checks[key],
            }
        )
    return rows


def summarize(raw: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON written by --out and printed by --json."""
    payload = int(raw["payload_bytes"])
    pooled: dict[Key, list[float]] = {}
    checks: dict[Key, bool | None] = {}
    for trial in raw["trials"]:
        key = (trial["mode"], trial["method"], trial["bucket_bytes"])
        pooled.setdefault(key, []).extend(trial["seconds"])
        checks[key] = trial.get("weights_bitwise_equal")
    default = config["default_bucket"]
    ceilings = Ceilings(pooled, default)
    modes = sorted({k[0] for k in pooled})
    per_mode = {}
    for mode in modes:
        blocks = sorted({k[2] for k in pooled if k[0] == mode and k[1] in CEILINGS})
        if not blocks:
            raise ConfigError("trials", f"mode {mode} has no ceiling trials", "measure it")
        per_mode[mode] = statistics.median(t for b in blocks for t in ceilings.block(mode, b))
    results = _rows(raw, pooled, ceilings, checks)

    def at_default(mode: str, method: str, field: str = "ratio_to_ceiling") -> float | None:
        found = [
            r[field]
            for r in results
            if (r["mode"], r["method"], r["bucket_bytes"]) == (mode, method, default)
        ]
        return found[0] if found else None

    methods = sorted({r["method"] for r in results if r["bucket_bytes"] == default})
    above = [
        {k: r[k] for k in ("mode", "method", "bucket_bytes", "ratio_to_ceiling")}
        for r in results
        if r["above_ceiling"]
    ]
    return {
        "schema": SCHEMA,
        "config": dict(config),
        "payload_bytes": payload,
        "tensors": raw["tensors"],
        "ceiling_gbps": {m: payload / 1e9 / s for m, s in per_mode.items()},
        "ceiling_set_by": {m: ceilings.set_by(m) for m in modes},
        "above_ceiling": above,
        "default_bucket": {
            "bucket_bytes": default,
            "real_backend_ratio_to_ceiling": {m: at_default(m, "backend") for m in modes},
            "real_backend_ratio_to_wire": {
                m: at_default(m, "backend", "ratio_to_wire") for m in modes
            },
            "real_backend_shm_ratio_to_ceiling": {m: at_default(m, "backend-shm") for m in modes},
            "v0_ratio_to_ceiling": {m: at_default(m, "v0") for m in modes},
            "ratio_to_ceiling": {m: {k: at_default(m, k) for k in methods} for m in modes},
        },
        "all_weights_bitwise_equal": all(c for c in checks.values() if c is not None),
        "results": results,
    }


def _flag(r: Mapping[str, Any]) -> str:
    if r["above_ceiling"]:
        return "ABOVE CEILING (a bug in the ceiling)"
    if r["method"] in BOUNDS:
        return "bound"
    return "tie" if r["ratio_to_ceiling"] > 1.0 else ""


def _x(ratio: float | None) -> str:
    return "not measured" if ratio is None else f"{ratio:.2f}x"


def table(summary: Mapping[str, Any]) -> str:
    """The side-by-side table: one line per mode, method and bucket size, then the verdict."""
    lines = [
        f"{summary['payload_bytes'] / 1024**2:.0f} MiB in {summary['tensors']} tensors, "
        f"{summary['config']['receivers']} receiver(s), {summary['config']['backend']}",
        f"{'mode':9s} {'method':18s} {'bucket':>8s} {'n':>4s}  "
        f"{'GB/s median [min-max]':>24s}  {'x ceil':>6s}  {'x wire':>6s}  bitwise",
    ]
    for r in summary["results"]:
        bucket = f"{r['bucket_bytes'] / 1024**2:g} MiB" if r["bucket_bytes"] else "-"
        g = r["gbps"]
        check = {True: "equal", False: "DIFFER", None: "-"}[r["weights_bitwise_equal"]]
        wire = "" if r["ratio_to_wire"] is None else f"{r['ratio_to_wire']:6.2f}"
        lines.append(
            f"{r['mode']:9s} {r['method']:18s} {bucket:>8s} {r['buckets'] or '':>4}  "
            f"{g['median']:7.2f} [{g['min']:6.2f}-{g['max']:6.2f}]  "
            f"{r['ratio_to_ceiling']:6.2f}  {wire:>6s}  {check:7s} {_flag(r)}".rstrip()
        )
    d = summary["default_bucket"]
    for mode, value in d["real_backend_ratio_to_ceiling"].items():
        set_by = ", ".join(f"{w} {n}" for w, n in summary["ceiling_set_by"][mode].items())
        shm = d.get("real_backend_shm_ratio_to_ceiling", {}).get(mode)
        lines.append(
            f"default bucket {d['bucket_bytes'] / 1024**2:g} MiB, {mode}: CPU backend "
            f"{_x(value)} of the ceiling, {_x(d['real_backend_ratio_to_wire'][mode])} of the "
            f"wire (v0: {_x(d['v0_ratio_to_ceiling'][mode])})"
            + ("" if shm is None else f", with --wire shm {_x(shm)} of the ceiling")
            + f"; ceiling set by {set_by}"
        )
    above = summary["above_ceiling"]
    lines.append(
        f"{len(above)} figure(s) ABOVE THE CEILING: a bug in the ceiling"
        if above
        else "no figure above its ceiling"
    )
    return "\n".join(lines)


def markdown(summary: Mapping[str, Any]) -> str:
    """The table for a README: one row per mode and method, one column per bucket size;
    a cell is GB/s median [min-max], the ratio to the ceiling and the ratio to the wire."""
    results = summary["results"]
    sizes = sorted({r["bucket_bytes"] for r in results if r["bucket_bytes"]})
    head = " | ".join(f"{s / 1024**2:g} MiB buckets" for s in sizes)
    lines = [f"| mode | method | {head} |", "|---|---|" + "---|" * len(sizes)]
    cell = {(r["mode"], r["method"], r["bucket_bytes"]): r for r in results}

    def fmt(r: Mapping[str, Any]) -> str:
        g = r["gbps"]
        text = f"{g['median']:.2f} [{g['min']:.2f}-{g['max']:.2f}] **{r['ratio_to_ceiling']:.2f}x**"
        if r["ratio_to_wire"] is not None:
            text += f" ({r['ratio_to_wire']:.2f}x wire)"
        flag = _flag(r)
        return f"{text} **{flag}**" if r["above_ceiling"] else f"{text} {flag}".rstrip()

    for mode in sorted({r["mode"] for r in results}):
        for method in dict.fromkeys(r["method"] for r in results if r["mode"] == mode):
            row = [cell.get((mode, method, s)) for s in sizes]
            if all(r is None for r in row):  # measured once, in the default bucket's block
                ref = cell[(mode, method, None)]
                row = [
                    ref if s == summary["default_bucket"]["bucket_bytes"] else None for s in sizes
                ]
            cells = " | ".join(fmt(r) if r else "" for r in row)
            lines.append(f"| {mode} | {method} | {cells} |")
    return "\n".join(lines)


def plot(summary: Mapping[str, Any], path: Path) -> None:
    """GB/s against bucket size, one panel per mode; references as horizontal lines."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "--plot", "matplotlib is not installed", "pip install matplotlib or pass --plot ''"
        ) from None
    modes = sorted({r["mode"] for r in summary["results"]})
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        rows = [r for r in summary["results"] if r["mode"] == mode]
        for method in dict.fromkeys(r["method"] for r in rows if r["bucket_bytes"]):
            style = ":" if method in CEILINGS else "-"
            line = sorted(
                (r for r in rows if r["method"] == method), key=lambda r: r["bucket_bytes"]
            )
            x = [r["bucket_bytes"] / 1024**2 for r in line]
            y = [r["gbps"]["median"] for r in line]
            err = [
                [r["gbps"]["median"] - r["gbps"]["min"] for r in line],
                [r["gbps"]["max"] - r["gbps"]["median"] for r in line],
            ]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=method, ls=style)
        for r in rows:
            if r["bucket_bytes"] is None:
                style = {"naive": ":", "memcpy": "--"}[r["method"]]
                ax.axhline(r["gbps"]["median"], color="k", ls=style, lw=1, label=r["method"])
        ax.set_xscale("log", base=2)
        sizes = sorted({r["bucket_bytes"] / 1024**2 for r in rows if r["bucket_bytes"]})
        ax.set_xticks(sizes, [f"{s:g}" for s in sizes])
        ax.set_xlabel("bucket size (MiB)")
        ax.set_ylabel("GB/s (state-dict bytes / time)")
        ax.set_title(f"{mode}: {summary['payload_bytes'] / 1024**2:.0f} MiB")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
