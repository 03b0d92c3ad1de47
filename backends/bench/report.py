"""From raw trial times to the summary: GB/s with spread, and every figure's ratio to the ceiling.

GB/s is state-dict bytes (the payload, padding excluded) over seconds until
every receiver holds them, so all methods and modes share one numerator. The
ceiling is the ``flat`` method (one flat tensor, sent once), measured in every
block of trials (one mode, one bucket size) interleaved with the other methods.
A figure's ratio to the ceiling is the median over repeats of flat's time over
the figure's time in the same repeat of the same block: side by side, so load
that drifts between blocks (this is a shared 2-core machine) cancels out.
Methods that do not depend on the bucket size (naive, memcpy) were measured in
the default bucket's block and are paired with its flat trials.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from miles_core.errors import ConfigError

SCHEMA = "miles-testbed/transfer-bench/1"


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


def summarize(raw: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON written by --out and printed by --json."""
    payload = int(raw["payload_bytes"])
    pooled: dict[tuple[str, str, int | None], list[float]] = {}
    checks: dict[tuple[str, str, int | None], bool | None] = {}
    for trial in raw["trials"]:
        key = (trial["mode"], trial["method"], trial["bucket_bytes"])
        pooled.setdefault(key, []).extend(trial["seconds"])
        checks[key] = trial.get("weights_bitwise_equal")
    default = config["default_bucket"]
    ceilings = {}
    for mode in {k[0] for k in pooled}:
        flat = [t for k, v in pooled.items() if k[:2] == (mode, "flat") for t in v]
        if not flat:
            raise ConfigError("trials", f"mode {mode} has no flat trials", "measure the ceiling")
        ceilings[mode] = statistics.median(flat)

    def paired(mode: str, bucket: int | None, values: Sequence[float]) -> float:
        flat = pooled.get((mode, "flat", bucket if bucket is not None else default))
        if not flat or len(flat) != len(values):
            raise ConfigError(
                "trials", f"{mode} bucket {bucket} has no flat trial per repeat", "rerun the bench"
            )
        return statistics.median(f / t for f, t in zip(flat, values, strict=True))

    results = []
    for (mode, method, bucket), values in pooled.items():
        seconds = spread(values)
        results.append(
            {
                "mode": mode,
                "method": method,
                "bucket_bytes": bucket,
                "buckets": raw.get("buckets", {}).get(str(bucket)) if bucket else None,
                "repeats": len(values),
                "seconds": seconds,
                "gbps": gbps(payload, seconds),
                "ratio_to_flat": paired(mode, bucket, values),
                "weights_bitwise_equal": checks[(mode, method, bucket)],
            }
        )

    def ratio(mode: str, method: str) -> float | None:
        found = [
            r["ratio_to_flat"]
            for r in results
            if (r["mode"], r["method"], r["bucket_bytes"]) == (mode, method, default)
        ]
        return found[0] if found else None

    methods = sorted(
        {r["method"] for r in results if r["bucket_bytes"] == default and r["method"] != "flat"}
    )
    return {
        "schema": SCHEMA,
        "config": dict(config),
        "payload_bytes": payload,
        "tensors": raw["tensors"],
        "ceiling_gbps": {m: payload / 1e9 / s for m, s in sorted(ceilings.items())},
        "default_bucket": {
            "bucket_bytes": default,
            "real_backend_ratio_to_flat": {m: ratio(m, "backend") for m in sorted(ceilings)},
            "v0_ratio_to_flat": {m: ratio(m, "v0") for m in sorted(ceilings)},
            "ratio_to_flat": {m: {k: ratio(m, k) for k in methods} for m in sorted(ceilings)},
        },
        "all_weights_bitwise_equal": all(c for c in checks.values() if c is not None),
        "results": results,
    }


def table(summary: Mapping[str, Any]) -> str:
    """The side-by-side table: one line per mode, method and bucket size."""
    lines = [
        f"{summary['payload_bytes'] / 1024**2:.0f} MiB in {summary['tensors']} tensors, "
        f"{summary['config']['receivers']} receiver(s), {summary['config']['backend']}",
        f"{'mode':9s} {'method':10s} {'bucket':>8s} {'n':>4s}  "
        f"{'GB/s median [min-max]':>24s}  {'x flat':>6s}  bitwise",
    ]
    for r in summary["results"]:
        bucket = f"{r['bucket_bytes'] / 1024**2:g} MiB" if r["bucket_bytes"] else "-"
        g = r["gbps"]
        check = {True: "equal", False: "DIFFER", None: "-"}[r["weights_bitwise_equal"]]
        lines.append(
            f"{r['mode']:9s} {r['method']:10s} {bucket:>8s} {r['buckets'] or '':>4}  "
            f"{g['median']:7.2f} [{g['min']:6.2f}-{g['max']:6.2f}]  "
            f"{r['ratio_to_flat']:6.2f}  {check}"
        )
    d = summary["default_bucket"]

    def x(ratio: float | None) -> str:
        return "not measured" if ratio is None else f"{ratio:.2f}x"

    for mode, value in d["real_backend_ratio_to_flat"].items():
        best = max(d["ratio_to_flat"][mode].items(), key=lambda kv: kv[1] or 0)
        lines.append(
            f"default bucket {d['bucket_bytes'] / 1024**2:g} MiB, {mode}: CPU backend "
            f"{x(value)} flat (v0, before: {x(d['v0_ratio_to_flat'][mode])}); "
            f"best {best[0]} {x(best[1])}"
        )
    return "\n".join(lines)


def markdown(summary: Mapping[str, Any]) -> str:
    """The table for a README: one row per mode and method, one column per bucket size;
    a cell is GB/s median [min-max] and the side-by-side ratio to flat."""
    results = summary["results"]
    sizes = sorted({r["bucket_bytes"] for r in results if r["bucket_bytes"]})
    head = " | ".join(f"{s / 1024**2:g} MiB buckets" for s in sizes)
    lines = [f"| mode | method | {head} |", "|---|---|" + "---|" * len(sizes)]
    cell = {(r["mode"], r["method"], r["bucket_bytes"]): r for r in results}

    def fmt(r: Mapping[str, Any]) -> str:
        g = r["gbps"]
        return f"{g['median']:.2f} [{g['min']:.2f}-{g['max']:.2f}] **{r['ratio_to_flat']:.2f}x**"

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
            color = {"flat": "k"}.get(method)
            line = sorted(
                (r for r in rows if r["method"] == method), key=lambda r: r["bucket_bytes"]
            )
            x = [r["bucket_bytes"] / 1024**2 for r in line]
            y = [r["gbps"]["median"] for r in line]
            err = [
                [r["gbps"]["median"] - r["gbps"]["min"] for r in line],
                [r["gbps"]["max"] - r["gbps"]["median"] for r in line],
            ]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=method, color=color)
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
