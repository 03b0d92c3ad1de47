"""The soak's verdict and summary, pure: the growth of each role's figures after warm-up,
what the faults and oracles came to, the processes left, and the exit code."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from backends.cpu.soak.sample import METRICS, ROLES, Sample
from backends.cpu.soak.tracker import Failure, FaultLine

WARMUP = 0.2
"""The share of the samples after the world started taken as warm-up (torch's first steps,
the first faults' new processes)."""
WINDOW = 0.2
"""The share of the samples after warm-up whose median is compared, first against last."""
GROWTH_GOAL = 10.0
"""Percent a figure may grow from the first window to the last and still meet the goal."""


@dataclass(frozen=True)
class Growth:
    """A figure's median over the first and the last window after warm-up, and its growth."""

    first: float
    last: float

    @property
    def percent(self) -> float:
        if self.first == 0:
            return 0.0 if self.last == 0 else float("inf")
        return 100.0 * (self.last - self.first) / self.first


def growth(
    values: Sequence[float], warmup: float = WARMUP, window: float = WINDOW
) -> Growth | None:
    """The growth of ``values`` (in sampling order) after warm-up; None when too few samples
    are left to form two windows of at least one sample each."""
    kept = list(values)[int(len(values) * warmup) :]
    size = max(1, int(len(kept) * window))
    if len(kept) < 2:
        return None
    return Growth(statistics.median(kept[:size]), statistics.median(kept[-size:]))


def growths(
    samples: Sequence[Sample], running_from: float = 0.0
) -> dict[str, dict[str, Growth | None]]:
    """Every role's growth of every figure, over the samples from ``running_from`` (seconds:
    the first step committed, the world started) on."""
    samples = [s for s in samples if s.t >= running_from]
    return {
        role: {
            metric: growth([getattr(s.figures[role], metric) for s in samples])
            for metric in METRICS
        }
        for role in ROLES
    }


MIB = 1024.0**2


def history_growth(
    samples: Sequence[Sample], bytes_per_event: float, running_from: float = 0.0
) -> dict[str, Growth | None]:
    """The history's growth, in events and in MB at ``bytes_per_event`` (held.py), and the
    driver's RSS net of it: the driver keeps every event for the oracles at the end by
    design, so its RSS grows with the run, and a leak is what grows beside the history."""
    samples = [s for s in samples if s.t >= running_from]
    held = [s.events * bytes_per_event / MIB for s in samples]
    return {
        "events": growth([float(s.events) for s in samples]),
        "mb": growth(held),
        "driver_net_rss_mb": growth(
            [s.figures["driver"].rss_mb - mb for s, mb in zip(samples, held, strict=True)]
        ),
    }


@dataclass(frozen=True)
class Verdict:
    """What the soak came to."""

    faults: tuple[FaultLine, ...]
    oracles: dict[str, str | None]
    """Each oracle's failure (None: passed) on the whole history at the end."""
    failures_as_it_went: tuple[Failure, ...]
    left: tuple[str, ...]
    """The processes of the session still alive after Ray shut down (pid and title)."""
    growth: dict[str, dict[str, Growth | None]]
    status: str
    history: dict[str, Growth | None] = dataclasses.field(default_factory=dict)
    """history_growth's figures (empty: not measured)."""
    bytes_per_event: float = 0.0
    """The events' bytes an event (held.py) and the oracles' index over them (its share)."""
    indexed_per_event: float = 0.0

    @property
    def survived(self) -> int:
        return sum(line.recovered_at is not None for line in self.faults)

    @property
    def ok(self) -> bool:
        """No oracle failed, at the end or as it went, and no process was left."""
        failed = any(v is not None for v in self.oracles.values()) or self.failures_as_it_went
        return not failed and not self.left

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def _pct(g: Growth | None, judged: bool = True) -> str:
    """``first -> last (+p %)``, marked when a judged figure grew past the goal."""
    if g is None:
        return "n/a"
    mark = "" if g.percent < GROWTH_GOAL or not judged else " (over the goal)"
    return f"{g.first:.1f} -> {g.last:.1f} ({g.percent:+.1f} %){mark}"


def summary_lines(v: Verdict, minutes: float, steps: int) -> list[str]:
    passed = sum(value is None for value in v.oracles.values())
    lines = [
        f"soak: {minutes:.1f} min, {steps} steps, run {v.status}",
        f"  faults: {v.survived} of {len(v.faults)} recovered",
        f"  oracles: {passed} of {len(v.oracles)} pass at the end; "
        f"{len(v.failures_as_it_went)} failed as it went",
    ]
    for name, found in v.oracles.items():
        if found is not None:
            lines.append(f"    oracle {name} FAILED: {found}")
    for failure in v.failures_as_it_went:
        lines.append(f"    oracle {failure.oracle} FAILED at t={failure.t:.2f}: {failure.message}")
    lines.append(f"  growth after warm-up (median of first {WINDOW:.0%} vs last {WINDOW:.0%}):")
    for role, figures in v.growth.items():
        parts = ", ".join(f"{metric} {_pct(g)}" for metric, g in figures.items())
        lines.append(f"    {role:8s} {parts}")
    lines += _history_lines(v)
    lines.append(f"  processes left after shutdown: {len(v.left)}")
    lines += [f"    {proc}" for proc in v.left]
    return lines


def _history_lines(v: Verdict) -> list[str]:
    events, net = v.history.get("events"), v.history.get("driver_net_rss_mb")
    if events is None or net is None:
        return []
    return [
        f"    history  {events.first:,.0f} -> {events.last:,.0f} events at about "
        f"{v.bytes_per_event:.0f} B each (the oracles' index {v.indexed_per_event:.0f} of them): "
        f"{_pct(v.history['mb'], judged=False)} MB, by design",
        f"    driver net of the history: rss_mb {_pct(net)}",
    ]


def to_json(v: Verdict, minutes: float, steps: int, seed: int) -> dict[str, object]:
    return {
        "seed": seed,
        "minutes": minutes,
        "steps": steps,
        "status": v.status,
        "ok": v.ok,
        "faults": [
            {"index": f.index, "kind": f.kind, "target": f.target, "t": f.t, "seconds": f.seconds}
            for f in v.faults
        ],
        "survived": v.survived,
        "oracles": v.oracles,
        "failures_as_it_went": [vars(f) for f in v.failures_as_it_went],
        "growth_percent": {
            role: {m: None if g is None else g.percent for m, g in figs.items()}
            for role, figs in v.growth.items()
        },
        "growth": {
            role: {m: None if g is None else [g.first, g.last] for m, g in figs.items()}
            for role, figs in v.growth.items()
        },
        "left": list(v.left),
        "bytes_per_event": v.bytes_per_event,
        "indexed_per_event": v.indexed_per_event,
        "history": {m: None if g is None else [g.first, g.last] for m, g in v.history.items()},
    }
