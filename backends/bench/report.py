"""From raw trial times to the summary: GB/s with spread, every figure's ratio to the ceiling
with its interval, and where the run's time went.

GB/s is state-dict bytes (the payload, padding excluded) over seconds until
every receiver holds them, so all methods and modes share one numerator. A
figure's ratio to the ceiling is read repeat by repeat against the ceiling of
the same repeat of the same block (ratios.py): side by side, so load that drifts
between blocks (this is a shared 2-core machine) cancels out. The ratio to the
wire is the same against the fastest way over the backend's collective alone
(gloo here). Methods that do not depend on the bucket size (naive, memcpy) were
measured in the default bucket's block.

No figure stays above its ceiling: a median above 1.0 whose interval reaches
1.0 is a tie (marked, as ``backend-shm`` with one bucket of the whole payload
is the ``shm-flags`` way plus the backend's calls), and one whose whole interval
is above it is a faster way, which the ceiling gains (listed under
``ceiling_gained`` and named in every table). ``memcpy`` moves nothing between
processes: a bound.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backends.bench.ceiling import CEILINGS, WIRE_CEILINGS
from backends.bench.methods import METHODS
from backends.bench.ratios import BOUNDS, Ceilings, Key, median_interval
from miles_core.errors import ConfigError

SCHEMA = "miles-testbed/transfer-bench/3"


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


def _order(key: Key) -> tuple[str, int, int]:
    """Rows by mode, bucket size (references last), then the ceiling's ways and the methods
    in METHODS' order."""
    mode, method, bucket = key
    return mode, bucket if bucket is not None else 1 << 62, METHODS.index(method)


def _rows(raw: Mapping[str, Any], pooled: Mapping[Key, list[float]], ceilings: Ceilings, checks):
    payload = int(raw["payload_bytes"])
    wire = any(k[1] in WIRE_CEILINGS for k in pooled)
    rows = []
    for key in sorted(pooled, key=_order):
        mode, method, bucket = key
        values = pooled[key]
        seconds = spread(values)
        pairs = ceilings.paired(key, values)
        low, high = median_interval(pairs)
        ratio = statistics.median(pairs)
        wire_pairs = ceilings.paired(key, values, WIRE_CEILINGS) if wire else None
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
                "ratio_interval": [low, high],
                "ratio_to_wire": statistics.median(wire_pairs) if wire_pairs else None,
                "ratio_to_wire_interval": list(median_interval(wire_pairs)) if wire_pairs else None,
                "tie": ratio > 1.0 and low <= 1.0 and method not in BOUNDS,
                "gained_by_ceiling": method in ceilings.gained.get((mode, bucket or 0), []),
                "weights_bitwise_equal": checks[key],
            }
        )
    return rows


def phases(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Where the run's time went, from rank 0's clock: setting up, preparing each block,
    each figure's trials (warmups and barriers included), slowest first."""
    found = raw.get("phases") or {}
    figures = sorted(found.get("figures", []), key=lambda f: -f["seconds"])
    blocks = found.get("blocks", [])
    return {
        "setup_seconds": found.get("setup_seconds"),
        "prepare_seconds": sum(b["seconds"] for b in blocks),
        "trial_seconds": sum(f["seconds"] for f in figures),
        "figures": figures,
    }


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
    for mode in modes:
        if not any(k[0] == mode and k[1] in CEILINGS for k in pooled):
            raise ConfigError("trials", f"mode {mode} has no ceiling trials", "measure it")
    gained = ceilings.gain_faster_ways()
    per_mode = {}
    for mode in modes:
        blocks = sorted({k[2] for k in pooled if k[0] == mode and k[1] in CEILINGS})
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
    return {
        "schema": SCHEMA,
        "config": dict(config),
        "payload_bytes": payload,
        "tensors": raw["tensors"],
        "ceiling_gbps": {m: payload / 1e9 / s for m, s in per_mode.items()},
        "ceiling_set_by": {m: ceilings.set_by(m) for m in modes},
        "ceiling_gained": gained,
        "default_bucket": {
            "bucket_bytes": default,
            "real_backend_ratio_to_ceiling": {m: at_default(m, "backend") for m in modes},
            "real_backend_ratio_to_wire": {
                m: at_default(m, "backend", "ratio_to_wire") for m in modes
            },
            "real_backend_wire_interval": {
                m: at_default(m, "backend", "ratio_to_wire_interval") for m in modes
            },
            "real_backend_ceiling_interval": {
                m: at_default(m, "backend", "ratio_interval") for m in modes
            },
            "real_backend_shm_ratio_to_ceiling": {m: at_default(m, "backend-shm") for m in modes},
            "v0_ratio_to_ceiling": {m: at_default(m, "v0") for m in modes},
            "ratio_to_ceiling": {m: {k: at_default(m, k) for k in methods} for m in modes},
        },
        "all_weights_bitwise_equal": all(c for c in checks.values() if c is not None),
        "results": results,
        "phases": phases(raw),
    }


def _flag(r: Mapping[str, Any]) -> str:
    if r["gained_by_ceiling"]:
        return "faster way: the ceiling gained it"
    if r["method"] in BOUNDS:
        return "bound"
    return "tie" if r["tie"] else ""


def _x(ratio: float | None, interval: Sequence[float] | None = None) -> str:
    if ratio is None:
        return "not measured"
    return f"{ratio:.2f}x" + ("" if interval is None else f" [{interval[0]:.2f}-{interval[1]:.2f}]")


def _where_the_time_went(summary: Mapping[str, Any], slowest: int = 5) -> list[str]:
    found = summary.get("phases") or {}
    if not found.get("figures"):
        return []
    top = ", ".join(
        f"{f['mode']} {f['method']}"
        + (f" {f['bucket_bytes'] / 1024**2:g} MiB" if f["bucket_bytes"] else "")
        + f" {f['seconds']:.1f} s"
        for f in found["figures"][:slowest]
    )
    return [
        f"time: setup {found['setup_seconds'] or 0:.1f} s, preparing blocks "
        f"{found['prepare_seconds']:.1f} s, trials {found['trial_seconds']:.1f} s; "
        f"slowest figures: {top}"
    ]


def table(summary: Mapping[str, Any]) -> str:
    """The side-by-side table: one line per mode, method and bucket size, then the verdict."""
    lines = [
        f"{summary['payload_bytes'] / 1024**2:.0f} MiB in {summary['tensors']} tensors, "
        f"{summary['config']['receivers']} receiver(s), {summary['config']['backend']}",
        f"{'mode':9s} {'method':18s} {'bucket':>8s} {'n':>4s}  "
        f"{'GB/s median [min-max]':>24s}  {'x ceil [interval]':>17s}  {'x wire':>6s}  bitwise",
    ]
    for r in summary["results"]:
        bucket = f"{r['bucket_bytes'] / 1024**2:g} MiB" if r["bucket_bytes"] else "-"
        g = r["gbps"]
        check = {True: "equal", False: "DIFFER", None: "-"}[r["weights_bitwise_equal"]]
        wire = "" if r["ratio_to_wire"] is None else f"{r['ratio_to_wire']:6.2f}"
        low, high = r["ratio_interval"]
        lines.append(
            f"{r['mode']:9s} {r['method']:18s} {bucket:>8s} {r['buckets'] or '':>4}  "
            f"{g['median']:7.2f} [{g['min']:6.2f}-{g['max']:6.2f}]  "
            f"{r['ratio_to_ceiling']:5.2f} [{low:4.2f}-{high:4.2f}]  {wire:>6s}  "
            f"{check:7s} {_flag(r)}".rstrip()
        )
    d = summary["default_bucket"]
    for mode, value in d["real_backend_ratio_to_ceiling"].items():
        set_by = ", ".join(f"{w} {n}" for w, n in summary["ceiling_set_by"][mode].items())
        shm = d.get("real_backend_shm_ratio_to_ceiling", {}).get(mode)
        to_wire = _x(d["real_backend_ratio_to_wire"][mode], d["real_backend_wire_interval"][mode])
        lines.append(
            f"default bucket {d['bucket_bytes'] / 1024**2:g} MiB, {mode}: CPU backend "
            f"{_x(value, d['real_backend_ceiling_interval'][mode])} of the ceiling, "
            f"{to_wire} of the wire (v0: {_x(d['v0_ratio_to_ceiling'][mode])})"
            + ("" if shm is None else f", with --wire shm {_x(shm)} of the ceiling")
            + f"; ceiling set by {set_by}"
        )
    gained = summary["ceiling_gained"]
    lines.append(
        "the ceiling gained "
        + ", ".join(
            f"{g['mode']} {g['method']} at {g['bucket_bytes'] / 1024**2:g} MiB "
            f"({g['ratio_before']:.2f}x of the ceiling's ways)"
            for g in gained
        )
        + ": a faster way than its own, so it is now part of it"
        if gained
        else "no figure above its ceiling"
    )
    return "\n".join(lines + _where_the_time_went(summary) + _machine(summary))


def _machine(summary: Mapping[str, Any]) -> list[str]:
    """The machine's load around the run; busy when other work held every core (the load
    average lags a minute: a bench run just before this one counts in it)."""
    m = summary.get("machine")
    if not m or m.get("load_before") is None:
        return []
    line = (
        f"machine: {m['cores']} cores, load average {m['load_before']:.1f} before the run, "
        f"{m['load_after']:.1f} after (its own ranks included)"
    )
    if m["load_before"] >= m["cores"]:
        line += (
            "; other work was running: GB/s and wall time move with it, ratios less "
            "(docs/transfer-bench.md, what a run's time depends on)"
        )
    return [line]


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
        low, high = r["ratio_interval"]
        text = (
            f"{g['median']:.2f} [{g['min']:.2f}-{g['max']:.2f}] "
            f"**{r['ratio_to_ceiling']:.2f}x** [{low:.2f}-{high:.2f}]"
        )
        if r["ratio_to_wire"] is not None:
            text += f" ({r['ratio_to_wire']:.2f}x wire)"
        flag = _flag(r)
        return f"{text} **{flag}**" if r["gained_by_ceiling"] else f"{text} {flag}".rstrip()

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
